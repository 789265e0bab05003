/* The rates the path planner weighs AUTO's two paths by (kernel_tuning.h, "the path planner's
   rates"): defaults, then the built-in entry for the device's type, then the one for the device,
   from host/mla/tuning_data/plan.json (tuning_data.h). */
#include "kernel_tuning.h"
#include "tuning_data.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The device types an entry may name: "cpu" (OpenCL's CPU type), "gpu" (every other type). */
enum { TYPE_NONE = 0, TYPE_CPU = 1, TYPE_GPU = 2 };

/* An entry of plan.json: for a device type (vendor "") or for one device (type TYPE_NONE; platform
   and driver "" = any); `listed` has bit i for each rate of rate_names[i] it sets. */
struct plan_entry {
    int type;
    char vendor[128], device[128], platform[128], driver[128];
    unsigned listed;
    clmla_plan_rates rates;
};

typedef struct plan_rate {
    const char *name; /* in an entry's "parameters" */
    size_t offset;    /* of its field in clmla_plan_rates */
    int whole;        /* an int field, else a double */
    int type;         /* the device type that reads it, TYPE_NONE: every type */
    double min, max;
} plan_rate;

static const plan_rate rate_names[] = {
    {"min_tokens", offsetof(clmla_plan_rates, min_tokens), 1, TYPE_NONE, 1, 65536},
    {"cpu_absorbed_pair_rate", offsetof(clmla_plan_rates, cpu_absorbed_pair_rate), 0, TYPE_CPU, 1e-6, 1e6},
    {"cpu_lanes_absorbed_pair_rate", offsetof(clmla_plan_rates, cpu_lanes_absorbed_pair_rate), 0, TYPE_CPU, 1e-6, 1e6},
    {"cpu_decompressed_pair_rate", offsetof(clmla_plan_rates, cpu_decompressed_pair_rate), 0, TYPE_CPU, 1e-6, 1e6},
    {"gpu_absorbed_pair_rate", offsetof(clmla_plan_rates, gpu_absorbed_pair_rate), 0, TYPE_GPU, 1e-6, 1e6},
    {"gpu_tiled_pair_rate", offsetof(clmla_plan_rates, gpu_tiled_pair_rate), 0, TYPE_GPU, 1e-6, 1e6},
    {"gpu_tiled_key_rate", offsetof(clmla_plan_rates, gpu_tiled_key_rate), 0, TYPE_GPU, 1e-6, 1e6},
    {"gpu_tiled_chunk_keys", offsetof(clmla_plan_rates, gpu_tiled_chunk_keys), 0, TYPE_GPU, 0, 1},
    {"gpu_decompressed_key_rate", offsetof(clmla_plan_rates, gpu_decompressed_key_rate), 0, TYPE_GPU, 1e-6, 1e6},
};
#define RATES (sizeof(rate_names) / sizeof(rate_names[0]))

/* The FLOP count alone: each path's kernels as fast per FLOP as the up-projection, an entry's own
   tokens costing the decompressed path nothing more than the absorbed one. */
static const clmla_plan_rates plan_defaults = {16, 1, 1, 1, 1, 1, 1, 0, 1};

void clmla_plan_rates_defaults(clmla_plan_rates *rates)
{
    if (rates)
        *rates = plan_defaults;
}

static int copy_key(char *dst, size_t size, const cJSON *v)
{
    if (!v) {
        dst[0] = '\0';
        return 1;
    }
    if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) >= size)
        return 0;
    snprintf(dst, size, "%s", v->valuestring);
    return 1;
}

/* One entry: 1 parsed and legal, 0 not (why says what, naming the value). */
static int entry_parse(const cJSON *o, plan_entry *e, char *why, size_t why_size)
{
    memset(e, 0, sizeof(*e));
    e->rates = plan_defaults;
    if (!cJSON_IsObject(o)) {
        snprintf(why, why_size, "an entry is not a JSON object");
        return 0;
    }
    const cJSON *kernel = cJSON_GetObjectItemCaseSensitive(o, "kernel");
    if (!cJSON_IsString(kernel) || strcmp(kernel->valuestring, "plan") != 0) {
        snprintf(why, why_size, "\"kernel\" must be \"plan\"");
        return 0;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "device_type");
    if (!copy_key(e->vendor, sizeof(e->vendor), cJSON_GetObjectItemCaseSensitive(o, "vendor")) ||
        !copy_key(e->device, sizeof(e->device), cJSON_GetObjectItemCaseSensitive(o, "device")) ||
        !copy_key(e->platform, sizeof(e->platform), cJSON_GetObjectItemCaseSensitive(o, "platform")) ||
        !copy_key(e->driver, sizeof(e->driver), cJSON_GetObjectItemCaseSensitive(o, "driver"))) {
        snprintf(why, why_size, "\"vendor\", \"device\", \"platform\" and \"driver\" must be non-empty strings of "
                                "under 128 bytes where given");
        return 0;
    }
    if (type) {
        if (cJSON_IsString(type) && strcmp(type->valuestring, "cpu") == 0)
            e->type = TYPE_CPU;
        else if (cJSON_IsString(type) && strcmp(type->valuestring, "gpu") == 0)
            e->type = TYPE_GPU;
        else {
            snprintf(why, why_size, "\"device_type\" must be \"cpu\" or \"gpu\"");
            return 0;
        }
        if (e->vendor[0] || e->device[0] || e->platform[0] || e->driver[0]) {
            snprintf(why, why_size, "entry for '%s': \"device_type\" and a device named; an entry is for a device "
                                    "type or for one device (\"vendor\" and \"device\")", type->valuestring);
            return 0;
        }
    } else if (!e->vendor[0] || !e->device[0]) {
        snprintf(why, why_size, "an entry needs \"device_type\", or \"vendor\" and \"device\"");
        return 0;
    }
    const char *who = e->type == TYPE_CPU ? "cpu" : e->type == TYPE_GPU ? "gpu" : e->device;
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (!cJSON_IsObject(params)) {
        snprintf(why, why_size, "entry for '%s': \"parameters\" must be an object", who);
        return 0;
    }
    const cJSON *p = NULL;
    cJSON_ArrayForEach(p, params)
    {
        size_t i = 0;
        while (i < RATES && strcmp(rate_names[i].name, p->string) != 0)
            i++;
        if (i == RATES) {
            snprintf(why, why_size, "entry for '%s': unknown parameter \"%s\"", who, p->string);
            return 0;
        }
        const plan_rate *r = &rate_names[i];
        if (e->type != TYPE_NONE && r->type != TYPE_NONE && r->type != e->type) {
            snprintf(why, why_size, "entry for '%s': %s is read by %s devices only", who, r->name,
                     r->type == TYPE_CPU ? "cpu" : "gpu");
            return 0;
        }
        if (!cJSON_IsNumber(p) || !isfinite(p->valuedouble) || p->valuedouble < r->min || p->valuedouble > r->max ||
            (r->whole && p->valuedouble != floor(p->valuedouble))) {
            snprintf(why, why_size, "entry for '%s': %s must be a%s number from %g to %g", who, r->name,
                     r->whole ? " whole" : "", r->min, r->max);
            return 0;
        }
        if (r->whole)
            *(int *)((char *)&e->rates + r->offset) = (int)p->valuedouble;
        else
            *(double *)((char *)&e->rates + r->offset) = p->valuedouble;
        e->listed |= 1u << i;
    }
    return 1;
}

static int list_entry_parse(const cJSON *item, void *slot, const void *arg, char *why, size_t why_size)
{
    (void)arg;
    return entry_parse(item, slot, why, why_size);
}

int clmla_plan_rates_parse(const char *text, plan_entry_list *out, char *why, size_t why_size)
{
    void *entries = NULL;
    const int r = clmla_tuning_list_parse(text, sizeof(plan_entry), list_entry_parse, NULL, &entries, &out->count, why,
                                          why_size);
    out->entries = entries;
    return r;
}

void clmla_plan_rates_list_free(plan_entry_list *list)
{
    if (!list)
        return;
    free(list->entries);
    memset(list, 0, sizeof(*list));
}

/* ---- the lookup -------------------------------------------------------------------------------- */

static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;
static plan_entry_list builtin; /* kept for the process */

/* plan.json through the parser; a refused entry is left out (test_tuning_data checks that none is),
   a file that is not an array leaves none. */
static void builtin_load(void)
{
    char why[512];
    if (clmla_plan_rates_parse(clmla_tuning_data_text("plan"), &builtin, why, sizeof(why)) < 0)
        clmla_plan_rates_list_free(&builtin);
}

static int type_matches(const plan_entry *e, const clmla_device_info *d)
{
    return e->type == (d->kind == CLMLA_DEVICE_KIND_CPU ? TYPE_CPU : TYPE_GPU);
}

static int device_matches(const plan_entry *e, const clmla_device_info *d)
{
    return e->type == TYPE_NONE && strcmp(e->vendor, d->vendor) == 0 && strcmp(e->device, d->name) == 0 &&
           (!e->platform[0] || strcmp(e->platform, d->platform_name) == 0) &&
           (!e->driver[0] || strcmp(e->driver, d->driver_version) == 0);
}

/* The rates e lists, over *rates. */
static void apply(const plan_entry *e, clmla_plan_rates *rates)
{
    for (size_t i = 0; i < RATES; i++) {
        if (!(e->listed & (1u << i)))
            continue;
        const size_t at = rate_names[i].offset;
        if (rate_names[i].whole)
            *(int *)((char *)rates + at) = *(const int *)((const char *)&e->rates + at);
        else
            *(double *)((char *)rates + at) = *(const double *)((const char *)&e->rates + at);
    }
}

int clmla_plan_rates_resolve(const plan_entry_list *list, const clmla_device_info *device, clmla_plan_rates *rates)
{
    if (!rates)
        return 0;
    *rates = plan_defaults;
    if (!device)
        return 0;
    if (!list) {
        pthread_once(&builtin_once, builtin_load);
        list = &builtin;
    }
    int applied = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < list->count; i++) {
            const plan_entry *e = &list->entries[i];
            if (pass == 0 ? type_matches(e, device) : device_matches(e, device)) {
                apply(e, rates);
                applied++;
                break;
            }
        }
    return applied;
}

void clmla_plan_rates_for(const clmla_context *ctx, clmla_plan_rates *rates)
{
    clmla_plan_rates_resolve(NULL, &ctx->info, rates);
}
