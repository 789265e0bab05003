/* The parameters of clmla's own kernels (kernel_tuning.h): one form of entry, file, table and
   lookup for every kind of kernel, each kind described by a kernel_kind. See include/clmla_tuning.h. */
#include "kernel_tuning.h"
#include "fileio.h"
#include "tuning.h"
#include "tuning_data.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An entry of a file or of a built-in table; platform / driver "" = any, cls 0 = any. */
struct kernel_entry {
    char vendor[128], device[128], platform[128], driver[128];
    int cls; /* the shape class: attn_latent's head count, products' class of K */
    char date[24], status[96]; /* provenance where the entry gives it (strings that fit), else "" */
    char source[160];          /* a built-in entry's: "built-in table (DATE, STATUS)", the lookup's *source */
    union {
        clmla_latent_tuning latent;
        clmla_product_tuning product;
    } t;
};

typedef struct tuning_param {
    const char *name; /* in a file's "parameters" */
    size_t offset;    /* of its int in the kind's parameter struct */
} tuning_param;

/* A kind of kernel: its parameter struct (ints only), how an entry names it and its shape class,
   its rules and defaults. Its built-in entries are host/mla/tuning_data/KERNEL.json (tuning_data.h). */
typedef struct kernel_kind {
    const char *kernel;         /* the entry's "kernel" */
    const char *class_key;      /* the entry's shape class field */
    const char *class_rule;     /* the message for a class that is not one */
    int (*class_parse)(const cJSON *v, int *cls); /* v NULL (absent): 0, "any" */
    void (*class_add)(cJSON *entry, int cls);
    const tuning_param *params;
    size_t count;
    size_t size;                /* of the parameter struct */
    const void *defaults;
    const char *(*check)(const void *parameters); /* the rule broken, or NULL */
    const char *what;           /* the parameters, in messages: "... refused: RULE" */
} kernel_kind;

/* ---- latent attention (cl/attn_latent.cl) --------------------------------------------------- */

/* The parameters where no entry applies (include/clmla_tuning.h gives each field's default). */
static const clmla_latent_tuning latent_defaults = {16, 8, 4, 16, 4, 128, 8, 1, 16, 1, 8, 128, 32, 32, 64, 16, 1, 0, 1, 0, 0, 4};

static const tuning_param latent_names[] = {
    {"rows_heads", offsetof(clmla_latent_tuning, rows_heads)},
    {"rows_keys", offsetof(clmla_latent_tuning, rows_keys)},
    {"rows_groups_per_cu", offsetof(clmla_latent_tuning, rows_groups_per_cu)},
    {"group_heads", offsetof(clmla_latent_tuning, group_heads)},
    {"group_keys", offsetof(clmla_latent_tuning, group_keys)},
    {"group_max_items", offsetof(clmla_latent_tuning, group_max_items)},
    {"group_groups_per_cu", offsetof(clmla_latent_tuning, group_groups_per_cu)},
    {"group_query_layout", offsetof(clmla_latent_tuning, group_query_layout)},
    {"group_fold", offsetof(clmla_latent_tuning, group_fold)},
    {"prefill_tiled", offsetof(clmla_latent_tuning, prefill_tiled)},
    {"group_decode_heads", offsetof(clmla_latent_tuning, group_decode_heads)},
    {"group_min_split_keys", offsetof(clmla_latent_tuning, group_min_split_keys)},
    {"prefill_queries", offsetof(clmla_latent_tuning, prefill_queries)},
    {"prefill_keys", offsetof(clmla_latent_tuning, prefill_keys)},
    {"prefill_chunk", offsetof(clmla_latent_tuning, prefill_chunk)},
    {"prefill_rows_queries", offsetof(clmla_latent_tuning, prefill_rows_queries)},
    {"group_aligned", offsetof(clmla_latent_tuning, group_aligned)},
    {"rows_lanes", offsetof(clmla_latent_tuning, rows_lanes)},
    {"group_row_slices", offsetof(clmla_latent_tuning, group_row_slices)},
    {"group_mma", offsetof(clmla_latent_tuning, group_mma)},
    {"group_large_grf", offsetof(clmla_latent_tuning, group_large_grf)},
    {"prefill_item_keys", offsetof(clmla_latent_tuning, prefill_item_keys)},
};

/* The kernels' constraints (cl/attn_latent.cl): attn_latent_rows walks heads two at a time and keys
   four at a time (HGC even, KTC a multiple of 4), its private arrays bound both; attn_latent pads
   heads to 4, 8 or 16 and needs NT a power of two >= the padded heads (the fit takes the largest
   that the device allows, down to that), whence TK = KPT * NT / HQ whole and a multiple of 4 for
   any KPT. */
static const char *latent_check(const clmla_latent_tuning *t)
{
    if (t->rows_heads < 2 || t->rows_heads > 16 || t->rows_heads % 2)
        return "rows_heads must be even, from 2 to 16";
    if (t->rows_keys < 4 || t->rows_keys > 32 || t->rows_keys % 4)
        return "rows_keys must be a multiple of 4, from 4 to 32";
    if (t->rows_groups_per_cu < 1 || t->rows_groups_per_cu > 64)
        return "rows_groups_per_cu must be from 1 to 64";
    if (t->group_heads < 1 || t->group_heads > 16)
        return "group_heads must be from 1 to 16";
    if (t->group_keys < 1 || t->group_keys > 8)
        return "group_keys must be from 1 to 8";
    if (t->group_max_items < 4 || t->group_max_items > 1024 || (t->group_max_items & (t->group_max_items - 1)))
        return "group_max_items must be a power of two from 4 to 1024";
    if (t->group_groups_per_cu < 1 || t->group_groups_per_cu > 64)
        return "group_groups_per_cu must be from 1 to 64";
    if (t->group_query_layout < 0 || t->group_query_layout > 1)
        return "group_query_layout must be 0 or 1";
    if (t->group_fold < 1 || t->group_fold > 16)
        return "group_fold must be from 1 to 16";
    if (t->prefill_tiled < 0 || t->prefill_tiled > 1)
        return "prefill_tiled must be 0 or 1";
    if (t->group_decode_heads != 4 && t->group_decode_heads != 8 && t->group_decode_heads != 16)
        return "group_decode_heads must be 4, 8 or 16";
    if (t->group_min_split_keys < 16 || t->group_min_split_keys > 4096)
        return "group_min_split_keys must be from 16 to 4096";
    if (t->prefill_queries < 4 || t->prefill_queries > 64 || (t->prefill_queries & (t->prefill_queries - 1)))
        return "prefill_queries must be a power of two from 4 to 64";
    if (t->prefill_keys < 8 || t->prefill_keys > 64 || t->prefill_keys % 4)
        return "prefill_keys must be a multiple of 4 from 8 to 64";
    if (t->prefill_chunk < 16 || t->prefill_chunk > 256 || t->prefill_chunk % 4)
        return "prefill_chunk must be a multiple of 4 from 16 to 256";
    if (t->prefill_rows_queries < 4 || t->prefill_rows_queries > 64 || t->prefill_rows_queries % 4)
        return "prefill_rows_queries must be a multiple of 4 from 4 to 64";
    if (t->group_aligned < 0 || t->group_aligned > 2)
        return "group_aligned must be 0, 1 or 2";
    if (t->rows_lanes < 0 || t->rows_lanes > 2)
        return "rows_lanes must be 0, 1 or 2";
    if (t->group_row_slices < 0 || t->group_row_slices > 4 || t->group_row_slices == 3)
        return "group_row_slices must be 0, 1, 2 or 4";
    if (t->group_mma < 0 || t->group_mma > 1)
        return "group_mma must be 0 or 1";
    if (t->group_large_grf < 0 || t->group_large_grf > 1)
        return "group_large_grf must be 0 or 1";
    if (t->prefill_item_keys != 1 && t->prefill_item_keys != 2 && t->prefill_item_keys != 4)
        return "prefill_item_keys must be 1, 2 or 4";
    return NULL;
}

static const char *latent_problem(const void *t)
{
    return latent_check(t);
}

static int heads_parse(const cJSON *v, int *cls)
{
    if (!v || (cJSON_IsString(v) && strcmp(v->valuestring, "any") == 0))
        *cls = 0;
    else if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 65536 && v->valuedouble == floor(v->valuedouble))
        *cls = (int)v->valuedouble;
    else
        return 0;
    return 1;
}

static void heads_add(cJSON *o, int cls)
{
    if (cls > 0)
        cJSON_AddNumberToObject(o, "heads", cls);
    else
        cJSON_AddStringToObject(o, "heads", "any");
}

static const kernel_kind latent_kind = {
    "attn_latent", "heads", "\"heads\" must be a head count or \"any\"", heads_parse, heads_add, latent_names,
    sizeof(latent_names) / sizeof(latent_names[0]), sizeof(clmla_latent_tuning), &latent_defaults, latent_problem,
    "latent attention parameters"};

/* ---- products (cl/gemm_skinny.cl, cl/gemm_rows.cl) ------------------------------------------ */

/* The parameters where no entry applies (include/clmla_tuning.h gives each field's default). */
static const clmla_product_tuning product_defaults = {128, 2, 4, 256, 8, 8, 4, 3, 1, 256,
                                                      48, 3, 1024, 0, 4, 16, 1, 0, 0};

static const char *const k_class_names[] = {"any", "small", "large"};

static const tuning_param product_names[] = {
    {"skinny_items", offsetof(clmla_product_tuning, skinny_items)},
    {"skinny_unroll", offsetof(clmla_product_tuning, skinny_unroll)},
    {"skinny_columns", offsetof(clmla_product_tuning, skinny_columns)},
    {"skinny_nn_items", offsetof(clmla_product_tuning, skinny_nn_items)},
    {"cpu_items_per_cu", offsetof(clmla_product_tuning, cpu_items_per_cu)},
    {"packed_streams_1", offsetof(clmla_product_tuning, packed_streams_1)},
    {"packed_streams_2", offsetof(clmla_product_tuning, packed_streams_2)},
    {"packed_streams_4", offsetof(clmla_product_tuning, packed_streams_4)},
    {"cpu_prefetch", offsetof(clmla_product_tuning, cpu_prefetch)},
    {"tiled_rows", offsetof(clmla_product_tuning, tiled_rows)},
    {"tiled_columns", offsetof(clmla_product_tuning, tiled_columns)},
    {"tiled_weight_rows", offsetof(clmla_product_tuning, tiled_weight_rows)},
    {"tiled_k_chunk", offsetof(clmla_product_tuning, tiled_k_chunk)},
    {"cpu_fp8_block_sums", offsetof(clmla_product_tuning, cpu_fp8_block_sums)},
    {"skinny_vector", offsetof(clmla_product_tuning, skinny_vector)},
    {"skinny_nn_slices", offsetof(clmla_product_tuning, skinny_nn_slices)},
    {"skinny_aligned", offsetof(clmla_product_tuning, skinny_aligned)},
    {"cpu_wide", offsetof(clmla_product_tuning, cpu_wide)},
    {"cpu_min_panel", offsetof(clmla_product_tuning, cpu_min_panel)},
};

int clmla_product_k_class(size_t k)
{
    return k == 0 ? 0 : k <= CLMLA_PRODUCT_SMALL_K ? 1 : 2;
}

static int power_of_two(int v)
{
    return v > 0 && (v & (v - 1)) == 0;
}

/* The kernels' constraints (cl/gemm_skinny.cl, cl/gemm_rows.cl): gemm_skinny_nt's tree over local
   memory needs a power-of-two group, its kernel slots hold up to 8 columns; gemm_packed_rows keeps
   MRP x STREAMS float8 accumulators in registers (the bounds keep that at most 16); gemm_tiled_rows
   walks its rows 4 at a time and reads a block scale once per 128 values of K (W_BLOCK: KC a
   multiple). */
const char *clmla_product_tuning_problem(const clmla_product_tuning *t)
{
    if (!power_of_two(t->skinny_items) || t->skinny_items < 16 || t->skinny_items > 1024)
        return "skinny_items must be a power of two from 16 to 1024";
    if (t->skinny_unroll < 1 || t->skinny_unroll > 8)
        return "skinny_unroll must be from 1 to 8";
    if (!power_of_two(t->skinny_columns) || t->skinny_columns > 8)
        return "skinny_columns must be 1, 2, 4 or 8";
    if (!power_of_two(t->skinny_nn_items) || t->skinny_nn_items < 16 || t->skinny_nn_items > 1024)
        return "skinny_nn_items must be a power of two from 16 to 1024";
    if (t->cpu_items_per_cu < 1 || t->cpu_items_per_cu > 64)
        return "cpu_items_per_cu must be from 1 to 64";
    if (t->packed_streams_1 < 1 || t->packed_streams_1 > 8)
        return "packed_streams_1 must be from 1 to 8";
    if (t->packed_streams_2 < 1 || t->packed_streams_2 > 8)
        return "packed_streams_2 must be from 1 to 8";
    if (t->packed_streams_4 < 1 || t->packed_streams_4 > 4)
        return "packed_streams_4 must be from 1 to 4";
    if (t->cpu_prefetch != 0 && t->cpu_prefetch != 1)
        return "cpu_prefetch must be 0 or 1";
    if (t->tiled_rows < 4 || t->tiled_rows > 1024 || t->tiled_rows % 4)
        return "tiled_rows must be a multiple of 4, from 4 to 1024";
    if (t->tiled_columns < 1 || t->tiled_columns > 512)
        return "tiled_columns must be from 1 to 512";
    if (t->tiled_weight_rows < 1 || t->tiled_weight_rows > 4)
        return "tiled_weight_rows must be from 1 to 4";
    if (t->tiled_k_chunk < 128 || t->tiled_k_chunk > 16384 || t->tiled_k_chunk % 128)
        return "tiled_k_chunk must be a multiple of 128, from 128 to 16384";
    if (t->cpu_fp8_block_sums != 0 && t->cpu_fp8_block_sums != 1)
        return "cpu_fp8_block_sums must be 0 or 1";
    if (t->skinny_vector != 4 && t->skinny_vector != 8 && t->skinny_vector != 16)
        return "skinny_vector must be 4, 8 or 16";
    if (!power_of_two(t->skinny_nn_slices) || t->skinny_nn_slices > 64 || t->skinny_nn_slices > t->skinny_nn_items)
        return "skinny_nn_slices must be a power of two from 1 to 64, at most skinny_nn_items";
    if (t->skinny_aligned != 0 && t->skinny_aligned != 1)
        return "skinny_aligned must be 0 or 1";
    if (t->cpu_wide != 0 && t->cpu_wide != 1)
        return "cpu_wide must be 0 or 1";
    if (t->cpu_min_panel < 0 || t->cpu_min_panel > 65536)
        return "cpu_min_panel must be from 0 to 65536";
    return NULL;
}

static const char *product_problem(const void *t)
{
    return clmla_product_tuning_problem(t);
}

static int k_class_parse(const cJSON *v, int *cls)
{
    *cls = 0;
    if (!v)
        return 1;
    for (int i = 0; cJSON_IsString(v) && i < 3; i++)
        if (strcmp(v->valuestring, k_class_names[i]) == 0) {
            *cls = i;
            return 1;
        }
    return 0;
}

static void k_class_add(cJSON *o, int cls)
{
    cJSON_AddStringToObject(o, "k_class", k_class_names[cls]);
}

static const kernel_kind product_kind = {
    "products", "k_class", "\"k_class\" must be \"small\", \"large\" or \"any\"", k_class_parse, k_class_add,
    product_names, sizeof(product_names) / sizeof(product_names[0]), sizeof(clmla_product_tuning), &product_defaults,
    product_problem, "product kernel parameters"};

/* Every kind; the first takes the entries that name no kernel (files written before there were
   two kinds) and refuses those that name an unknown one. */
static const kernel_kind *const kinds[] = {&latent_kind, &product_kind};
#define KINDS (sizeof(kinds) / sizeof(kinds[0]))

/* k's place in kinds[] (and in the user file's lists) */
static size_t slot(const kernel_kind *k)
{
    size_t i = 0;
    while (i + 1 < KINDS && kinds[i] != k)
        i++;
    return i;
}

/* CLMLA_SUCCESS when the parameters of kind k are legal, else the failure naming the rule (recorded
   for ctx, or for the thread when ctx is NULL); *why (may be NULL) gets the rule or NULL. */
static clmla_status refuse_illegal(const kernel_kind *k, clmla_context *ctx, const void *t, const char **why)
{
    const char *bad = t ? k->check(t) : "NULL argument";
    if (why)
        *why = bad;
    return bad ? clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s refused: %s", k->what, bad) : CLMLA_SUCCESS;
}

/* ---- entries --------------------------------------------------------------------------------- */

/* The kind an entry of a file belongs to: the kind it names, the first kind when it names none, is
   not an object or names an unknown kernel (whose parser then refuses it). */
static const kernel_kind *kind_of(const cJSON *o)
{
    const cJSON *kernel = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "kernel") : NULL;
    for (size_t i = 0; cJSON_IsString(kernel) && i < KINDS; i++)
        if (strcmp(kernel->valuestring, kinds[i]->kernel) == 0)
            return kinds[i];
    return kinds[0];
}

static int copy_key(char *dst, size_t size, const cJSON *v, int required)
{
    if (!v)
        return !required && (dst[0] = '\0', 1);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= size)
        return 0;
    snprintf(dst, size, "%s", v->valuestring);
    return 1;
}

/* One entry of kind k: 1 parsed and legal, 0 not (why says what, naming the value). */
static int entry_parse(const kernel_kind *k, const cJSON *o, kernel_entry *e, char *why, size_t why_size)
{
    memset(e, 0, sizeof(*e));
    memcpy(&e->t, k->defaults, k->size);
    if (!cJSON_IsObject(o)) {
        snprintf(why, why_size, "an entry is not a JSON object");
        return 0;
    }
    const cJSON *kernel = cJSON_GetObjectItemCaseSensitive(o, "kernel");
    if (kernel && !(cJSON_IsString(kernel) && strcmp(kernel->valuestring, k->kernel) == 0)) {
        snprintf(why, why_size, "\"kernel\" must be \"attn_latent\" or \"products\"");
        return 0;
    }
    if (!copy_key(e->vendor, sizeof(e->vendor), cJSON_GetObjectItemCaseSensitive(o, "vendor"), 1) ||
        !copy_key(e->device, sizeof(e->device), cJSON_GetObjectItemCaseSensitive(o, "device"), 1) ||
        !copy_key(e->platform, sizeof(e->platform), cJSON_GetObjectItemCaseSensitive(o, "platform"), 0) ||
        !copy_key(e->driver, sizeof(e->driver), cJSON_GetObjectItemCaseSensitive(o, "driver"), 0)) {
        snprintf(why, why_size, "\"vendor\" and \"device\" (and \"platform\", \"driver\" where given) must be strings "
                                "of under 128 bytes");
        return 0;
    }
    /* provenance, read where it is a string that fits, else left out: it never refuses an entry */
    if (!copy_key(e->date, sizeof(e->date), cJSON_GetObjectItemCaseSensitive(o, "date"), 0))
        e->date[0] = '\0';
    if (!copy_key(e->status, sizeof(e->status), cJSON_GetObjectItemCaseSensitive(o, "status"), 0))
        e->status[0] = '\0';
    if (!k->class_parse(cJSON_GetObjectItemCaseSensitive(o, k->class_key), &e->cls)) {
        snprintf(why, why_size, "entry for '%s': %s", e->device, k->class_rule);
        return 0;
    }
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (!cJSON_IsObject(params)) {
        snprintf(why, why_size, "entry for '%s': \"parameters\" must be an object", e->device);
        return 0;
    }
    const cJSON *p = NULL;
    cJSON_ArrayForEach(p, params)
    {
        /* a parameter clmla no longer has: files written before its removal hold it at its default
           (0), which is what runs now; another value would ask for a kernel that is gone */
        if (k == &latent_kind && strcmp(p->string, "group_stage_keys") == 0) {
            if (cJSON_IsNumber(p) && p->valuedouble == 0)
                continue;
            snprintf(why, why_size, "entry for '%s': group_stage_keys was removed in 0.4.0 (the staged score step, "
                                    "measured without a win); only 0 is accepted", e->device);
            return 0;
        }
        size_t i = 0;
        while (i < k->count && strcmp(k->params[i].name, p->string) != 0)
            i++;
        if (i == k->count) {
            snprintf(why, why_size, "entry for '%s': unknown parameter \"%s\"", e->device, p->string);
            return 0;
        }
        if (!cJSON_IsNumber(p) || p->valuedouble < -1e6 || p->valuedouble > 1e6 || p->valuedouble != floor(p->valuedouble)) {
            snprintf(why, why_size, "entry for '%s': %s must be a whole number", e->device, p->string);
            return 0;
        }
        *(int *)((char *)&e->t + k->params[i].offset) = (int)p->valuedouble;
    }
    const char *bad = k->check(&e->t);
    if (bad) {
        snprintf(why, why_size, "entry for '%s': %s", e->device, bad);
        return 0;
    }
    return 1;
}

/* clmla_tuning_list_parse's parser of kind k's entries (arg): the other kinds' are skipped. */
static int kind_entry_parse(const cJSON *item, void *slot, const void *arg, char *why, size_t why_size)
{
    const kernel_kind *k = arg;
    if (kind_of(item) != k) /* another kind's, left to its parser */
        return -1;
    return entry_parse(k, item, slot, why, why_size);
}

/* A file's text: -1 not a JSON array, else how many entries of kind k were refused (why: the
   first); the legal ones in *out. */
static int list_parse(const kernel_kind *k, const char *text, kernel_entry_list *out, char *why, size_t why_size)
{
    void *entries = NULL;
    const int r = clmla_tuning_list_parse(text, sizeof(kernel_entry), kind_entry_parse, k, &entries, &out->count, why,
                                          why_size);
    out->entries = entries;
    return r;
}

static void list_free(kernel_entry_list *list)
{
    free(list->entries);
    memset(list, 0, sizeof(*list));
}

static int matches(const kernel_entry *e, const clmla_device_info *d)
{
    return strcmp(e->vendor, d->vendor) == 0 && strcmp(e->device, d->name) == 0 &&
           (!e->platform[0] || strcmp(e->platform, d->platform_name) == 0) &&
           (!e->driver[0] || strcmp(e->driver, d->driver_version) == 0);
}

/* The best entry of a list for the device and class: the exact class over "any", the first of each. */
static const kernel_entry *best(const kernel_entry *list, size_t n, const clmla_device_info *d, int cls)
{
    const kernel_entry *any = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!matches(&list[i], d))
            continue;
        if (cls > 0 && list[i].cls == cls)
            return &list[i];
        if (list[i].cls == 0 && !any)
            any = &list[i];
    }
    return any;
}

/* ---- the built-in entries, parsed once per process ----------------------------------------------- */

static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;
static kernel_entry_list builtin_entries[KINDS]; /* as kinds[]; kept for the process */

/* Each built-in entry's source: "built-in table", then its "date" and "status" where it has them. */
static void builtin_sources(kernel_entry_list *list)
{
    for (size_t j = 0; j < list->count; j++) {
        kernel_entry *e = &list->entries[j];
        const int date = e->date[0] != '\0', status = e->status[0] != '\0';
        snprintf(e->source, sizeof(e->source), "built-in table%s%s%s%s%s", date || status ? " (" : "", e->date,
                 date && status ? ", " : "", e->status, date || status ? ")" : "");
    }
}

/* Each kind's embedded file, host/mla/tuning_data/KERNEL.json, through the user files' parser. An
   entry it refuses is left out (test_tuning_data checks that none is); a missing file leaves none. */
static void builtin_load(void)
{
    for (size_t i = 0; i < KINDS; i++) {
        const char *text = clmla_tuning_data_text(kinds[i]->kernel);
        char why[512];
        if (text && list_parse(kinds[i], text, &builtin_entries[i], why, sizeof(why)) < 0)
            list_free(&builtin_entries[i]);
        builtin_sources(&builtin_entries[i]);
    }
}

/* The parameters of kind k for the device and class, in precedence: 2 user entry, 1 built-in, 0
   defaults; *source "file PATH", the built-in entry's source, or "defaults". */
static int resolve(const kernel_kind *k, const kernel_entry_list *user, const char *user_src,
                   const clmla_device_info *device, int cls, void *tuning, const char **source)
{
    const kernel_entry *e = user ? best(user->entries, user->count, device, cls) : NULL;
    int from = 2;
    if (!e) {
        pthread_once(&builtin_once, builtin_load);
        const kernel_entry_list *b = &builtin_entries[slot(k)];
        e = best(b->entries, b->count, device, cls);
        from = 1;
    }
    memcpy(tuning, e ? (const void *)&e->t : k->defaults, k->size);
    *source = e ? (from == 2 ? user_src : e->source) : "defaults";
    return e ? from : 0;
}

/* ---- the user file, read once per process ------------------------------------------------------ */

/* CLMLA_KERNEL_TUNING's path: none for "off", "" (the cache folder's file) for "auto". */
static const char *kernel_file_given(const clmla_env *env)
{
    const char *v = env->kernel_tuning;
    return strcmp(v, "off") == 0 ? NULL : strcmp(v, "auto") != 0 ? v : "";
}

clmla_status clmla_latent_tuning_path(char *buf, size_t size)
{
    return clmla_tuning_file_path(buf, size, "clmla_latent_tuning_path", kernel_file_given, "kernel-tuning.json",
                                  "kernel tuning");
}

static pthread_once_t user_once = PTHREAD_ONCE_INIT;
static kernel_entry_list user_entries[KINDS]; /* as kinds[] */
static char user_source[CLMLA_PATH_SIZE + 8] = "";
static char user_problem[2 * CLMLA_PATH_SIZE + 1024] = ""; /* what was wrong with it, "" when nothing */
static atomic_int user_problem_logged;

/* Every kind's entries of a file's text into lists[] (as kinds[]): -1 not a JSON array, else how
   many were refused in all (why: the first refusal of the first kind with one). */
static int parse_all(const char *text, kernel_entry_list *lists, char *why, size_t why_size)
{
    int refused = 0;
    why[0] = '\0';
    for (size_t i = 0; i < KINDS; i++) {
        char one[512];
        const int r = list_parse(kinds[i], text, &lists[i], one, sizeof(one));
        if (r < 0) {
            snprintf(why, why_size, "%s", one);
            return -1;
        }
        if (r > 0 && !refused)
            snprintf(why, why_size, "%s", one);
        refused += r;
    }
    return refused;
}

static void user_load(void)
{
    char path[CLMLA_PATH_SIZE];
    if (clmla_latent_tuning_path(path, sizeof(path)) != CLMLA_SUCCESS || !path[0] || clmla_path_absent(path))
        return;
    char *text = NULL, err[CLMLA_PATH_SIZE + 256];
    size_t length = 0;
    if (clmla_read_file(path, CLMLA_TUNING_FILE_MAX_BYTES, "a kernel tuning file", &text, &length, err, sizeof(err)) !=
        CLMLA_SUCCESS) {
        snprintf(user_problem, sizeof(user_problem), "kernel tuning file %s ignored: %s", path, err);
    } else {
        char why[512];
        const int refused = parse_all(text, user_entries, why, sizeof(why));
        free(text);
        if (refused < 0)
            snprintf(user_problem, sizeof(user_problem), "kernel tuning file %s ignored: %s", path, why);
        else if (refused > 0)
            snprintf(user_problem, sizeof(user_problem), "kernel tuning file %s: %d entr%s refused (%s)", path, refused,
                     refused == 1 ? "y" : "ies", why);
    }
    snprintf(user_source, sizeof(user_source), "file %s", path);
}

const char *clmla_latent_tuning_problem(void)
{
    pthread_once(&user_once, user_load);
    return user_problem;
}

/* The parameters of kind k for a context without forced ones: the user file's problem logged once
   per process. */
static void for_context(const kernel_kind *k, const clmla_context *ctx, int cls, void *tuning)
{
    pthread_once(&user_once, user_load);
    if (user_problem[0] && atomic_exchange(&user_problem_logged, 1) == 0)
        clmla_log((clmla_context *)ctx, CLMLA_LOG_WARNING, "%s", user_problem);
    const char *source = NULL;
    resolve(k, &user_entries[slot(k)], user_source, &ctx->info, cls, tuning, &source);
}

static clmla_status lookup(const kernel_kind *k, const clmla_device_info *device, int cls, void *tuning,
                           const char **source)
{
    pthread_once(&user_once, user_load);
    const char *s = NULL;
    resolve(k, &user_entries[slot(k)], user_source, device, cls, tuning, &s);
    if (source)
        *source = s;
    return user_problem[0] ? clmla_fail(NULL, CLMLA_ERROR_INVALID_FILE, "%s", user_problem) : CLMLA_SUCCESS;
}

/* ---- saving an entry ----------------------------------------------------------------------------- */

/* The entries of the kernel tuning file at path, to add one to: an empty list when there is no
   file; CLMLA_ERROR_INVALID_FILE when it is not a valid one (every entry legal, of every kind). */
static clmla_status load_for_save(const char *path, cJSON **list)
{
    *list = NULL;
    if (clmla_path_absent(path)) {
        *list = cJSON_CreateArray();
        return CLMLA_SUCCESS;
    }
    char *old = NULL, err[CLMLA_PATH_SIZE + 256];
    size_t length = 0;
    const clmla_status st =
        clmla_read_file(path, CLMLA_TUNING_FILE_MAX_BYTES, "a kernel tuning file", &old, &length, err, sizeof(err));
    if (st != CLMLA_SUCCESS)
        return clmla_fail(NULL, st, "%s", err);
    kernel_entry_list check[KINDS];
    char why[512];
    const int refused = parse_all(old, check, why, sizeof(why));
    for (size_t i = 0; i < KINDS; i++)
        list_free(&check[i]);
    *list = refused == 0 ? cJSON_Parse(old) : NULL;
    free(old);
    if (!*list)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_FILE,
                          "%s is not a JSON array of kernel tuning entries: %s; it was left as it is", path, why);
    return CLMLA_SUCCESS;
}

/* An entry of kind k, for same_key. */
typedef struct entry_key {
    const kernel_kind *k;
    kernel_entry entry;
} entry_key;

/* Whether the file entry `item` is of the kind of the entry_key `key` with the same device,
   platform, driver and class. */
static int same_key(const cJSON *item, const void *key)
{
    const entry_key *mine = key;
    kernel_entry e;
    char why[512];
    return kind_of(item) == mine->k && entry_parse(mine->k, item, &e, why, sizeof(why)) && e.cls == mine->entry.cls &&
           strcmp(e.vendor, mine->entry.vendor) == 0 && strcmp(e.device, mine->entry.device) == 0 &&
           strcmp(e.platform, mine->entry.platform) == 0 && strcmp(e.driver, mine->entry.driver) == 0;
}

/* Adds the entry of kind k for (device, cls) to the file at path, replacing the one with the same
   key (device, platform, driver, class), else appended; the file's other entries kept. */
static clmla_status save(const kernel_kind *k, const char *path, const clmla_device_info *device, int cls,
                         const void *tuning, const char *note)
{
    cJSON *list = NULL;
    clmla_status st = load_for_save(path, &list);
    if (st != CLMLA_SUCCESS)
        return st;
    cJSON *o = cJSON_CreateObject(), *p = cJSON_CreateObject();
    if (!list || !o || !p) {
        cJSON_Delete(list);
        cJSON_Delete(o);
        cJSON_Delete(p);
        return clmla_fail(NULL, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    cJSON_AddStringToObject(o, "kernel", k->kernel);
    cJSON_AddStringToObject(o, "platform", device->platform_name);
    cJSON_AddStringToObject(o, "vendor", device->vendor);
    cJSON_AddStringToObject(o, "device", device->name);
    cJSON_AddStringToObject(o, "driver", device->driver_version);
    k->class_add(o, cls);
    for (size_t i = 0; i < k->count; i++)
        cJSON_AddNumberToObject(p, k->params[i].name, *(const int *)((const char *)tuning + k->params[i].offset));
    cJSON_AddItemToObject(o, "parameters", p);
    if (note && *note)
        cJSON_AddStringToObject(o, "figure", note);
    entry_key key = {.k = k};
    char why[512];
    entry_parse(k, o, &key.entry, why, sizeof(why));
    return clmla_tuning_save_json(path, list, o, same_key, &key);
}

/* ---- the API of each kind ------------------------------------------------------------------------ */

void clmla_latent_tuning_defaults(clmla_latent_tuning *tuning)
{
    if (tuning)
        *tuning = latent_defaults;
}

clmla_status clmla_latent_tuning_check(const clmla_latent_tuning *tuning, const char **why)
{
    return refuse_illegal(&latent_kind, NULL, tuning, why);
}

int clmla_latent_tuning_parse(const char *text, latent_entry_list *out, char *why, size_t why_size)
{
    return list_parse(&latent_kind, text, out, why, why_size);
}

void clmla_latent_tuning_list_free(latent_entry_list *list)
{
    list_free(list);
}

int clmla_latent_tuning_resolve(const latent_entry_list *user, const char *user_src, const clmla_device_info *device,
                                int num_heads, clmla_latent_tuning *tuning, const char **source)
{
    return resolve(&latent_kind, user, user_src, device, num_heads, tuning, source);
}

clmla_status clmla_latent_tuning_lookup(const clmla_device_info *device, int num_heads, clmla_latent_tuning *tuning,
                                        const char **source)
{
    if (!device || !tuning || num_heads < 0)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_latent_tuning_lookup: NULL argument or heads < 0");
    return lookup(&latent_kind, device, num_heads, tuning, source);
}

void clmla_latent_tuning_for(const clmla_context *ctx, int num_heads, clmla_latent_tuning *tuning)
{
    if (ctx->latent_forced_set)
        *tuning = ctx->latent_forced;
    else
        for_context(&latent_kind, ctx, num_heads, tuning);
}

clmla_status clmla_latent_tuning_save(const char *path, const clmla_device_info *device, int num_heads,
                                      const clmla_latent_tuning *tuning, const char *note)
{
    if (!path || !*path || !device || !tuning || num_heads < 0)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_latent_tuning_save: NULL or empty argument");
    if (refuse_illegal(&latent_kind, NULL, tuning, NULL) != CLMLA_SUCCESS)
        return CLMLA_ERROR_INVALID_ARGUMENT;
    return save(&latent_kind, path, device, num_heads, tuning, note);
}

/* The product kind's, keyed by the class of K (clmla_product_k_class). */
void clmla_product_tuning_defaults(clmla_product_tuning *tuning)
{
    if (tuning)
        *tuning = product_defaults;
}

clmla_status clmla_product_tuning_check(const clmla_product_tuning *tuning, const char **why)
{
    return refuse_illegal(&product_kind, NULL, tuning, why);
}

int clmla_product_tuning_parse(const char *text, product_entry_list *out, char *why, size_t why_size)
{
    return list_parse(&product_kind, text, out, why, why_size);
}

void clmla_product_tuning_list_free(product_entry_list *list)
{
    list_free(list);
}

int clmla_product_tuning_resolve(const product_entry_list *user, const char *user_src, const clmla_device_info *device,
                                 size_t k, clmla_product_tuning *tuning, const char **source)
{
    return resolve(&product_kind, user, user_src, device, clmla_product_k_class(k), tuning, source);
}

clmla_status clmla_product_tuning_lookup(const clmla_device_info *device, size_t k, clmla_product_tuning *tuning,
                                         const char **source)
{
    if (!device || !tuning)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_product_tuning_lookup: NULL argument");
    return lookup(&product_kind, device, clmla_product_k_class(k), tuning, source);
}

void clmla_product_tuning_for(const clmla_context *ctx, size_t k, clmla_product_tuning *tuning)
{
    if (ctx->product_forced_set)
        *tuning = ctx->product_forced;
    else
        for_context(&product_kind, ctx, clmla_product_k_class(k), tuning);
}

clmla_status clmla_product_tuning_save(const char *path, const clmla_device_info *device, size_t k,
                                       const clmla_product_tuning *tuning, const char *note)
{
    if (!path || !*path || !device || !tuning)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_product_tuning_save: NULL or empty argument");
    if (refuse_illegal(&product_kind, NULL, tuning, NULL) != CLMLA_SUCCESS)
        return CLMLA_ERROR_INVALID_ARGUMENT;
    return save(&product_kind, path, device, clmla_product_k_class(k), tuning, note);
}

clmla_status clmla_context_set_latent_tuning(clmla_context *ctx, const clmla_latent_tuning *tuning)
{
    if (!ctx)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_context_set_latent_tuning: NULL context");
    if (tuning && refuse_illegal(&latent_kind, ctx, tuning, NULL) != CLMLA_SUCCESS)
        return CLMLA_ERROR_INVALID_ARGUMENT;
    if (tuning)
        ctx->latent_forced = *tuning;
    ctx->latent_forced_set = tuning != NULL;
    return CLMLA_SUCCESS;
}
