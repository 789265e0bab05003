/* The built-in tuning entries (the JSON files of host/mla/tuning_data, embedded at build): every entry parses
   through the user files' parser, carries its provenance ("date", "figure"), has a key of its own,
   and changes the defaults, each parameter it lists being off its default; the lookup gives, for
   every device and class of the C tables the files replaced, the values those tables gave (written
   out below from them), and the path planner's rates (plan.json) those of the constants they
   replaced. No device needed. */
#include "check.h"
#include "clmla.h"
#include "clmla_tuning.h"
#include "kernel_tuning.h"
#include "tuning.h"
#include "tuning_data.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LATENT, PRODUCTS };
static const char *const kind_file[] = {"attn_latent", "products"};

typedef union {
    clmla_latent_tuning latent;
    clmla_product_tuning product;
} some_tuning;

static size_t tuning_size(int kind)
{
    return kind == LATENT ? sizeof(clmla_latent_tuning) : sizeof(clmla_product_tuning);
}

static void text_field(char *dst, size_t size, const cJSON *o, const char *key, const char *absent)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    snprintf(dst, size, "%s", cJSON_IsString(v) ? v->valuestring : absent);
}

/* A device that an entry matches: its vendor and name, its platform and driver where it names them. */
static void device_of(const cJSON *e, clmla_device_info *d)
{
    memset(d, 0, sizeof(*d));
    text_field(d->vendor, sizeof(d->vendor), e, "vendor", "");
    text_field(d->name, sizeof(d->name), e, "device", "");
    text_field(d->platform_name, sizeof(d->platform_name), e, "platform", "Some Platform");
    text_field(d->driver_version, sizeof(d->driver_version), e, "driver", "1.0");
}

/* The lookup's argument that selects an entry's class: the head count (0: "any"), or a K of the
   class ("any" 0, "small" 4096, "large" 8192). */
static size_t class_arg(int kind, const cJSON *e)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, kind == LATENT ? "heads" : "k_class");
    if (cJSON_IsNumber(c))
        return (size_t)c->valuedouble;
    if (kind == PRODUCTS && cJSON_IsString(c))
        return strcmp(c->valuestring, "small") == 0 ? 4096 : strcmp(c->valuestring, "large") == 0 ? 8192 : 0;
    return 0;
}

static int parse(int kind, const char *text, kernel_entry_list *list, char *why, size_t why_size)
{
    return kind == LATENT ? clmla_latent_tuning_parse(text, list, why, why_size)
                          : clmla_product_tuning_parse(text, list, why, why_size);
}

/* Resolves over `user` (NULL: the built-in table alone): 2 user, 1 built-in, 0 defaults. */
static int resolve(int kind, const kernel_entry_list *user, const clmla_device_info *d, size_t arg, some_tuning *t)
{
    const char *src = NULL;
    memset(t, 0, sizeof(*t));
    return kind == LATENT ? clmla_latent_tuning_resolve(user, "file", d, (int)arg, &t->latent, &src)
                          : clmla_product_tuning_resolve(user, "file", d, arg, &t->product, &src);
}

/* The one entry e as a user file, resolved for d: resolve's result, -1 when the entry is refused. */
static int resolve_alone(int kind, const cJSON *e, const clmla_device_info *d, size_t arg, some_tuning *t)
{
    cJSON *array = cJSON_CreateArray();
    cJSON_AddItemToArray(array, cJSON_Duplicate(e, 1));
    char *text = cJSON_PrintUnformatted(array);
    cJSON_Delete(array);
    kernel_entry_list list;
    char why[512];
    const int refused = text ? parse(kind, text, &list, why, sizeof(why)) : -1;
    free(text);
    const int r = refused == 0 && list.count == 1 ? resolve(kind, &list, d, arg, t) : -1;
    if (refused >= 0)
        clmla_latent_tuning_list_free(&list);
    return r;
}

static void check_kind(int kind)
{
    const char *name = kind_file[kind];
    const char *text = clmla_tuning_data_text(name);
    CHECK(text != NULL, "%s.json is not embedded", name);
    if (!text)
        return;
    cJSON *array = cJSON_Parse(text);
    CHECK(cJSON_IsArray(array), "%s.json is not a JSON array", name);
    kernel_entry_list list;
    char why[512];
    const int refused = parse(kind, text, &list, why, sizeof(why));
    CHECK(refused == 0 && (int)list.count == cJSON_GetArraySize(array),
          "%s.json: %d of %d entries refused (%s), %zu of this kind", name, refused, cJSON_GetArraySize(array), why,
          list.count);
    if (refused >= 0)
        clmla_latent_tuning_list_free(&list);

    some_tuning defaults;
    memset(&defaults, 0, sizeof(defaults));
    if (kind == LATENT)
        clmla_latent_tuning_defaults(&defaults.latent);
    else
        clmla_product_tuning_defaults(&defaults.product);
    int index = 0;
    const cJSON *e = NULL;
    cJSON_ArrayForEach(e, array)
    {
        char device[160];
        text_field(device, sizeof(device), e, "device", "?");
        const cJSON *date = cJSON_GetObjectItemCaseSensitive(e, "date");
        const cJSON *figure = cJSON_GetObjectItemCaseSensitive(e, "figure");
        CHECK(cJSON_IsString(date) && strlen(date->valuestring) == 10 && cJSON_IsString(figure) &&
                  figure->valuestring[0],
              "%s.json entry %d (%s): no \"date\" (YYYY-MM-DD) or \"figure\" text", name, index, device);
        /* one key each: a second entry of the same key would never apply */
        const cJSON *o = NULL;
        int same = 0;
        cJSON_ArrayForEach(o, array)
        {
            if (o == e)
                break;
            const char *keys[] = {"vendor", "device", "platform", "driver", kind == LATENT ? "heads" : "k_class"};
            int all = 1;
            for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
                char a[160], b[160];
                const cJSON *x = cJSON_GetObjectItemCaseSensitive(e, keys[i]);
                const cJSON *y = cJSON_GetObjectItemCaseSensitive(o, keys[i]);
                snprintf(a, sizeof(a), "%s", cJSON_IsString(x) ? x->valuestring : "");
                snprintf(b, sizeof(b), "%s", cJSON_IsString(y) ? y->valuestring : "");
                if (strcmp(a, b) != 0 || (cJSON_IsNumber(x) != cJSON_IsNumber(y)) ||
                    (cJSON_IsNumber(x) && x->valuedouble != y->valuedouble))
                    all = 0;
            }
            same |= all;
        }
        CHECK(!same, "%s.json entry %d (%s): the key of an earlier entry", name, index, device);

        clmla_device_info d;
        device_of(e, &d);
        const size_t arg = class_arg(kind, e);
        some_tuning alone, table;
        CHECK(resolve_alone(kind, e, &d, arg, &alone) == 2, "%s.json entry %d (%s) does not apply alone", name, index,
              device);
        CHECK(memcmp(&alone, &defaults, tuning_size(kind)) != 0, "%s.json entry %d (%s) changes no default", name,
              index, device);
        CHECK(resolve(kind, NULL, &d, arg, &table) == 1 && memcmp(&alone, &table, tuning_size(kind)) == 0,
              "%s.json entry %d (%s): the lookup gives another entry's values", name, index, device);
        /* each parameter it lists is off its default: without it the entry gives other values (or
           is refused, its other values needing it) */
        const cJSON *p = NULL;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(e, "parameters"))
        {
            cJSON *less = cJSON_Duplicate(e, 1);
            cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(less, "parameters"), p->string);
            some_tuning without;
            const int r = resolve_alone(kind, less, &d, arg, &without);
            cJSON_Delete(less);
            CHECK(r < 0 || memcmp(&without, &alone, tuning_size(kind)) != 0,
                  "%s.json entry %d (%s): %s is its default", name, index, device, p->string);
        }
        index++;
    }
    cJSON_Delete(array);
}

static clmla_device_info device(const char *vendor, const char *name, const char *platform)
{
    clmla_device_info d;
    memset(&d, 0, sizeof(d));
    snprintf(d.vendor, sizeof(d.vendor), "%s", vendor);
    snprintf(d.name, sizeof(d.name), "%s", name);
    snprintf(d.platform_name, sizeof(d.platform_name), "%s", platform);
    snprintf(d.driver_version, sizeof(d.driver_version), "1.2.3");
    return d;
}

#define POCL "Portable Computing Language"
#define EPYC "AuthenticAMD", "pthread-haswell-AMD EPYC", POCL
#define EPYC512 "AuthenticAMD", "pthread-skylake-avx512-AMD EPYC", POCL
#define XEON "GenuineIntel", "pthread-skylake-avx512-Intel(R) Xeon(R) Processor", POCL
#define H100 "NVIDIA Corporation", "NVIDIA H100 80GB HBM3", "NVIDIA CUDA"
#define AMD_GPU(n) "Advanced Micro Devices, Inc.", n, "AMD Accelerated Parallel Processing"
#define ARC "Intel(R) Corporation", "Intel(R) Arc(TM) A770 Graphics", "Intel(R) OpenCL Graphics"
#define PVC "Intel(R) Corporation", "Intel(R) Data Center GPU Max 1550", "Intel(R) OpenCL Graphics"
#define XE_LP "Intel(R) Corporation", "Intel(R) Iris(R) Xe Graphics", "Intel(R) OpenCL Graphics"

/* The values of the C tables the JSON files replaced (host/mla/kernel_tuning.c and tuning.c before
   issue 57), field by field in the structs' order; the fields that an old entry left out at its end
   (C's zero) are written out as 0; group_stage_keys, 0 in every one and removed since, is left out;
   group_large_grf, added since, is 0 in every one, and prefill_item_keys, added later, 4 (its
   default); the CDNA, Arc and PVC entries have changed since (below). */
static const clmla_latent_tuning latent_old_defaults = {16, 8, 4, 16, 4, 128, 8, 1, 16, 1, 8,
                                                        128, 32, 32, 64, 16, 1, 0, 1, 0, 0, 4};
static const clmla_latent_tuning latent_old_epyc = {16, 8, 4, 16, 4, 128, 8, 0, 16, 0, 4,
                                                    128, 32, 32, 64, 16, 0, 0, 1, 0, 0, 4};
static const clmla_latent_tuning latent_old_xeon_16 = {16, 8, 4, 16, 4, 128, 8, 1, 16, 1, 8,
                                                       128, 32, 32, 64, 32, 0, 2, 1, 0, 0, 4};
static const clmla_latent_tuning latent_old_xeon_other = {16, 8, 4, 16, 4, 128, 8, 1, 16, 1, 8,
                                                          128, 32, 32, 64, 16, 0, 2, 1, 0, 0, 4};
static const clmla_latent_tuning latent_old_h100_16 = {16, 8, 4, 16, 4, 128, 4, 1, 16, 1, 8,
                                                       128, 32, 32, 64, 16, 1, 0, 1, 0, 0, 4};
static const clmla_latent_tuning latent_old_h100_128 = {16, 8, 4, 16, 4, 256, 8, 1, 16, 1, 8,
                                                        128, 32, 32, 64, 16, 1, 0, 1, 0, 0, 4};
/* CDNA and Arc: the tables' attn_latent, and since then attn_prefill_tiled in blocks of 16 queries
   with 1 key an item (prefill_queries, prefill_item_keys: 4x the waves or threads, docs/VENDORS.md) */
static const clmla_latent_tuning latent_cdna_arc = {16, 8, 4, 8, 2, 256, 8, 1, 16, 1, 8,
                                                    128, 16, 32, 64, 16, 1, 0, 1, 0, 0, 1};
/* PVC: changed since the tables, to IGC's 256-GRF mode (group_large_grf 1), where 512 items and 4
   heads an item in the score step (group_decode_heads) leave no spill, and to the same prefill
   tiles (docs/VENDORS.md) */
static const clmla_latent_tuning latent_pvc = {16, 8, 4, 8, 1, 512, 8, 1, 16, 1, 4,
                                               128, 16, 32, 64, 16, 1, 0, 1, 0, 1, 1};
/* Xe-LP: added since the tables, 8 heads of 256 items with group_keys 1 and the same prefill tiles */
static const clmla_latent_tuning latent_xe_lp = {16, 8, 4, 8, 1, 256, 8, 1, 16, 1, 8,
                                                 128, 16, 32, 64, 16, 1, 0, 1, 0, 0, 1};

/* The EPYC AVX2 at one and two heads: added since the tables (4 keys a tile in attn_latent_rows) */
static const clmla_latent_tuning latent_epyc_few_heads = {16, 4, 4, 16, 4, 128, 8, 1, 16, 1, 8,
                                                          128, 32, 32, 64, 16, 1, 0, 1, 0, 0, 4};

static const clmla_product_tuning product_old_defaults = {128, 2, 4, 256, 8, 8, 4, 3, 1, 256,
                                                          48, 3, 1024, 0, 4, 16, 1, 0, 0};
static const clmla_product_tuning product_old_epyc = {128, 2, 4, 256, 8, 8, 4, 3, 1, 256, 48,
                                                      3, 1024, 1, 4, 16, 1, 0, 0};
static const clmla_product_tuning product_old_epyc512 = {128, 2, 4, 64, 8, 8, 4, 3, 1, 256, 48,
                                                         3, 1024, 1, 4, 1, 0, 0, 0};
static const clmla_product_tuning product_old_xeon = {128, 2, 4, 64, 8, 8, 4, 3, 1, 256, 96,
                                                      4, 1024, 1, 4, 1, 0, 1, 128};
static const clmla_product_tuning product_old_h100 = {128, 2, 4, 256, 8, 8, 4, 3, 1, 256, 48,
                                                      3, 1024, 0, 4, 16, 1, 0, 0};
static const clmla_product_tuning product_old_pvc = {128, 2, 2, 256, 8, 8, 4, 3, 1, 256, 48,
                                                     3, 1024, 0, 4, 16, 1, 0, 0};

static void expect_latent(const char *vendor, const char *name, const char *platform, int heads,
                          const clmla_latent_tuning *want)
{
    const clmla_device_info d = device(vendor, name, platform);
    clmla_latent_tuning t;
    const char *src = NULL;
    clmla_latent_tuning_resolve(NULL, "", &d, heads, &t, &src);
    CHECK(memcmp(&t, want, sizeof(t)) == 0, "attn_latent for %s at %d heads: not the old table's values (%s)", name,
          heads, src);
}

static void expect_product(const char *vendor, const char *name, const char *platform, const clmla_product_tuning *want)
{
    const clmla_device_info d = device(vendor, name, platform);
    const size_t ks[] = {0, 2048, 4096, 8192};
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
        clmla_product_tuning t;
        const char *src = NULL;
        clmla_product_tuning_resolve(NULL, "", &d, ks[i], &t, &src);
        CHECK(memcmp(&t, want, sizeof(t)) == 0, "products for %s at K %zu: not the old table's values (%s)", name,
              ks[i], src);
    }
}

static void check_old_tables(void)
{
    clmla_latent_tuning ld;
    clmla_latent_tuning_defaults(&ld);
    CHECK(memcmp(&ld, &latent_old_defaults, sizeof(ld)) == 0, "the latent defaults moved");
    clmla_product_tuning pd;
    clmla_product_tuning_defaults(&pd);
    CHECK(memcmp(&pd, &product_old_defaults, sizeof(pd)) == 0, "the product defaults moved");

    const int heads[] = {0, 1, 2, 3, 16, 32, 64, 128};
    for (size_t i = 0; i < sizeof(heads) / sizeof(heads[0]); i++) {
        const int h = heads[i];
        expect_latent(EPYC, h,
                      h == 16 ? &latent_old_epyc : h == 1 || h == 2 ? &latent_epyc_few_heads : &latent_old_defaults);
        expect_latent(EPYC512, h, h == 16 ? &latent_old_epyc : &latent_old_defaults);
        expect_latent(XEON, h, h == 16 ? &latent_old_xeon_16 : &latent_old_xeon_other);
        expect_latent(H100, h, h == 16 ? &latent_old_h100_16 : h == 128 ? &latent_old_h100_128 : &latent_old_defaults);
        expect_latent(AMD_GPU("gfx942:sramecc+:xnack-"), h, &latent_cdna_arc);
        expect_latent(AMD_GPU("gfx942:sramecc+:xnack+"), h, &latent_cdna_arc);
        expect_latent(AMD_GPU("gfx90a:sramecc+:xnack-"), h, &latent_cdna_arc);
        expect_latent(AMD_GPU("gfx90a:sramecc+:xnack+"), h, &latent_cdna_arc);
        expect_latent(ARC, h, &latent_cdna_arc);
        expect_latent(PVC, h, &latent_pvc);
        expect_latent(XE_LP, h, &latent_xe_lp);
        /* the PoCL and NVIDIA entries name their platform */
        expect_latent("NVIDIA Corporation", "NVIDIA H100 80GB HBM3", "Another Platform", h, &latent_old_defaults);
        expect_latent("AuthenticAMD", "pthread-haswell-AMD EPYC", "Another Platform", h, &latent_old_defaults);
        expect_latent("Some Vendor", "Some GPU", "Some Platform", h, &latent_old_defaults);
    }
    expect_product(EPYC, &product_old_epyc);
    expect_product(EPYC512, &product_old_epyc512);
    expect_product(XEON, &product_old_xeon);
    expect_product(H100, &product_old_h100);
    expect_product(PVC, &product_old_pvc);
    expect_product(AMD_GPU("gfx942:sramecc+:xnack-"), &product_old_defaults);
    expect_product(ARC, &product_old_defaults);
    expect_product("AuthenticAMD", "pthread-haswell-AMD EPYC", "Another Platform", &product_old_defaults);
    expect_product("Some Vendor", "Some GPU", "Some Platform", &product_old_defaults);
}

/* CLBlast's entries: all 16 values each (CLBlast's own values, which a partial entry would keep,
   are not known here), as the old table held them. */
static void check_clblast(void)
{
    static const clmla_xgemm_tuning old[] = {
        {"AuthenticAMD", "pthread-haswell-AMD EPYC",
         {0, 1, 32, 2, 4, 4, 64, 16, 16, 64, 1, 1, 1, 1, 8, 4}, 1024, 83.4, 21.9},
        {"GenuineIntel", "pthread-skylake-avx512-Intel(R) Xeon(R) Processor",
         {0, 1, 32, 2, 8, 8, 64, 8, 8, 64, 1, 1, 1, 1, 8, 8}, 1024, 84.1, 17.3},
    };
    const size_t n_old = sizeof(old) / sizeof(old[0]);
    const char *text = clmla_tuning_data_text("clblast");
    CHECK(text != NULL, "clblast.json is not embedded");
    if (!text)
        return;
    cJSON *array = cJSON_Parse(text);
    CHECK(cJSON_IsArray(array), "clblast.json is not a JSON array");
    const clmla_xgemm_tuning *table = NULL;
    const size_t n = clmla_xgemm_tuning_builtin(&table);
    CHECK((int)n == cJSON_GetArraySize(array) && n == n_old, "clblast.json: %zu entries parsed of %d, %zu expected", n,
          cJSON_GetArraySize(array), n_old);
    const cJSON *e = NULL;
    cJSON_ArrayForEach(e, array)
    {
        clmla_device_info d;
        device_of(e, &d); /* no work-group or local-memory limit: the kernel's own constraints alone */
        clmla_xgemm_tuning found;
        char why[512] = "";
        CHECK(clmla_tuning_parse(text, &d, &found, why, sizeof(why)) == 1, "clblast.json, %s: %s", d.name, why);
        const cJSON *date = cJSON_GetObjectItemCaseSensitive(e, "date");
        const cJSON *figure = cJSON_GetObjectItemCaseSensitive(e, "figure");
        CHECK(cJSON_IsString(date) && cJSON_IsString(figure), "clblast.json, %s: no \"date\" or \"figure\"",
              d.name);
    }
    cJSON_Delete(array);
    for (size_t i = 0; i < n_old; i++) {
        const clmla_xgemm_tuning *t = NULL;
        for (size_t j = 0; j < n && !t; j++)
            if (strcmp(table[j].vendor, old[i].vendor) == 0 && strcmp(table[j].device, old[i].device) == 0)
                t = &table[j];
        CHECK(t && memcmp(t->values, old[i].values, sizeof(t->values)) == 0 && t->size == old[i].size &&
                  t->gflops == old[i].gflops && t->default_gflops == old[i].default_gflops,
              "CLBlast entry for %s: not the old table's", old[i].device);
    }
}

/* ---- the path planner's rates (plan.json) ---------------------------------------------------- */

/* The rates for d over the entries of `array` (as a file), -1 when one is refused. */
static int plan_resolve_array(const cJSON *array, const clmla_device_info *d, clmla_plan_rates *r)
{
    char *text = cJSON_PrintUnformatted(array);
    plan_entry_list list;
    char why[512];
    const int refused = text ? clmla_plan_rates_parse(text, &list, why, sizeof(why)) : -1;
    free(text);
    const int got = refused == 0 ? clmla_plan_rates_resolve(&list, d, r) : -1;
    if (refused >= 0)
        clmla_plan_rates_list_free(&list);
    return got;
}

/* A device of the type an entry names, or the device it names (of the type whose rates it lists). */
static void plan_device_of(const cJSON *e, clmla_device_info *d)
{
    device_of(e, d);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(e, "device_type");
    int cpu = cJSON_IsString(type) && strcmp(type->valuestring, "cpu") == 0;
    if (!type) {
        const cJSON *p = NULL;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(e, "parameters"))
        {
            cpu |= strncmp(p->string, "cpu_", 4) == 0;
        }
    }
    d->kind = cpu ? CLMLA_DEVICE_KIND_CPU : CLMLA_DEVICE_KIND_GPU;
    if (type)
        snprintf(d->name, sizeof(d->name), "%s", cpu ? "Some CPU" : "Some GPU");
}

/* Every entry of plan.json parses, carries its provenance, has a key of its own and changes what
   stands behind it (the defaults, or its type's entry), each rate it lists included. */
static void check_plan_entries(void)
{
    const char *text = clmla_tuning_data_text("plan");
    CHECK(text != NULL, "plan.json is not embedded");
    if (!text)
        return;
    cJSON *array = cJSON_Parse(text);
    CHECK(cJSON_IsArray(array), "plan.json is not a JSON array");
    plan_entry_list list;
    char why[512];
    const int refused = clmla_plan_rates_parse(text, &list, why, sizeof(why));
    CHECK(refused == 0 && (int)list.count == cJSON_GetArraySize(array), "plan.json: %d of %d entries refused (%s)",
          refused, cJSON_GetArraySize(array), why);
    if (refused >= 0)
        clmla_plan_rates_list_free(&list);
    CHECK(cJSON_GetArraySize(array) >= 2, "plan.json: %d entries, expected one for each device type",
          cJSON_GetArraySize(array));
    int index = 0;
    cJSON *e = NULL;
    cJSON_ArrayForEach(e, array)
    {
        char who[160];
        text_field(who, sizeof(who), e, "device_type", "");
        if (!who[0])
            text_field(who, sizeof(who), e, "device", "?");
        const cJSON *date = cJSON_GetObjectItemCaseSensitive(e, "date");
        const cJSON *figure = cJSON_GetObjectItemCaseSensitive(e, "figure");
        const cJSON *on = cJSON_GetObjectItemCaseSensitive(e, "machine");
        CHECK(cJSON_IsString(date) && strlen(date->valuestring) == 10 && cJSON_IsString(figure) &&
                  figure->valuestring[0] && cJSON_IsString(on) && on->valuestring[0],
              "plan.json entry %d (%s): no \"date\" (YYYY-MM-DD), \"machine\" or \"figure\" text", index, who);
        const char *keys[] = {"device_type", "vendor", "device", "platform", "driver"};
        const cJSON *o = NULL;
        int same = 0;
        cJSON_ArrayForEach(o, array)
        {
            if (o == e)
                break;
            int all = 1;
            for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
                char a[160], b[160];
                text_field(a, sizeof(a), e, keys[i], "");
                text_field(b, sizeof(b), o, keys[i], "");
                all &= strcmp(a, b) == 0;
            }
            same |= all;
        }
        CHECK(!same, "plan.json entry %d (%s): the key of an earlier entry", index, who);

        clmla_device_info d;
        plan_device_of(e, &d);
        clmla_plan_rates with, behind;
        CHECK(plan_resolve_array(array, &d, &with) >= 1, "plan.json entry %d (%s) does not apply", index, who);
        cJSON *less = cJSON_Duplicate(array, 1);
        cJSON_DeleteItemFromArray(less, index);
        CHECK(plan_resolve_array(less, &d, &behind) >= 0 && memcmp(&with, &behind, sizeof(with)) != 0,
              "plan.json entry %d (%s) changes nothing", index, who);
        cJSON_Delete(less);
        const cJSON *p = NULL;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(e, "parameters"))
        {
            cJSON *without = cJSON_Duplicate(array, 1);
            cJSON_DeleteItemFromObjectCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(without, index), "parameters"), p->string);
            clmla_plan_rates r;
            const int got = plan_resolve_array(without, &d, &r);
            cJSON_Delete(without);
            CHECK(got >= 0 && memcmp(&r, &with, sizeof(r)) != 0, "plan.json entry %d (%s): %s is what stands behind it",
                  index, who, p->string);
        }
        index++;
    }
    cJSON_Delete(array);
}

/* The rates of the #defines the built-in entries replaced (host/mla/layer_plan.c before issue 57),
   written out by hand: CPU devices read the cpu_ ones, every other device the gpu_ ones. */
static void expect_plan(clmla_device_kind kind, const char *vendor, const char *name, const char *platform)
{
    clmla_device_info d = device(vendor, name, platform);
    d.kind = kind;
    clmla_plan_rates r;
    const int applied = clmla_plan_rates_resolve(NULL, &d, &r);
    CHECK(applied == 1, "plan rates for %s: %d entries applied, expected its type's", name, applied);
    CHECK(r.min_tokens == 16, "plan rates for %s: min_tokens %d, expected 16", name, r.min_tokens);
    if (kind == CLMLA_DEVICE_KIND_CPU)
        CHECK(r.cpu_absorbed_pair_rate == 1.12 && r.cpu_lanes_absorbed_pair_rate == 1.38 &&
                  r.cpu_decompressed_pair_rate == 0.47,
              "plan rates for %s: cpu %.17g %.17g %.17g, expected 1.12 1.38 0.47", name, r.cpu_absorbed_pair_rate,
              r.cpu_lanes_absorbed_pair_rate, r.cpu_decompressed_pair_rate);
    else
        CHECK(r.gpu_absorbed_pair_rate == 0.91 && r.gpu_tiled_pair_rate == 0.42 && r.gpu_tiled_key_rate == 0.172 &&
                  r.gpu_tiled_chunk_keys == 0.26 && r.gpu_decompressed_key_rate == 0.0197,
              "plan rates for %s: gpu %.17g %.17g %.17g %.17g %.17g, expected 0.91 0.42 0.172 0.26 0.0197", name,
              r.gpu_absorbed_pair_rate, r.gpu_tiled_pair_rate, r.gpu_tiled_key_rate, r.gpu_tiled_chunk_keys,
              r.gpu_decompressed_key_rate);
}

static void check_plan_old_rates(void)
{
    expect_plan(CLMLA_DEVICE_KIND_CPU, EPYC);
    expect_plan(CLMLA_DEVICE_KIND_CPU, EPYC512);
    expect_plan(CLMLA_DEVICE_KIND_CPU, XEON);
    expect_plan(CLMLA_DEVICE_KIND_CPU, "Some Vendor", "Some CPU", "Some Platform");
    expect_plan(CLMLA_DEVICE_KIND_GPU, H100);
    expect_plan(CLMLA_DEVICE_KIND_GPU, PVC);
    expect_plan(CLMLA_DEVICE_KIND_GPU, ARC);
    expect_plan(CLMLA_DEVICE_KIND_GPU, AMD_GPU("gfx942:sramecc+:xnack-"));
    expect_plan(CLMLA_DEVICE_KIND_GPU, "Some Vendor", "Some GPU", "Some Platform");
    expect_plan(CLMLA_DEVICE_KIND_ACCELERATOR, "Some Vendor", "Some Accelerator", "Some Platform");
    expect_plan(CLMLA_DEVICE_KIND_OTHER, "Some Vendor", "Some Device", "Some Platform");
}

/* The parser refuses a bad entry by name; a device's entry stands over its type's, each rate it
   does not list coming from behind it. */
static void check_plan_parser(void)
{
    static const struct {
        const char *entry, *names;
    } bad[] = {
        {"{\"kernel\":\"plan\",\"device_type\":\"cpu\",\"parameters\":{\"cpu_pair_rate\":1}}", "cpu_pair_rate"},
        {"{\"kernel\":\"plan\",\"device_type\":\"cpu\",\"parameters\":{\"gpu_tiled_key_rate\":0.5}}",
         "gpu_tiled_key_rate"},
        {"{\"kernel\":\"plan\",\"device_type\":\"gpu\",\"parameters\":{\"gpu_tiled_pair_rate\":0}}",
         "gpu_tiled_pair_rate"},
        {"{\"kernel\":\"plan\",\"device_type\":\"gpu\",\"parameters\":{\"gpu_tiled_chunk_keys\":2}}",
         "gpu_tiled_chunk_keys"},
        {"{\"kernel\":\"plan\",\"device_type\":\"gpu\",\"parameters\":{\"min_tokens\":2.5}}", "min_tokens"},
        {"{\"kernel\":\"plan\",\"device_type\":\"gpu\",\"parameters\":{\"gpu_tiled_key_rate\":\"fast\"}}",
         "gpu_tiled_key_rate"},
        {"{\"kernel\":\"plan\",\"device_type\":\"fpga\",\"parameters\":{}}", "device_type"},
        {"{\"kernel\":\"plan\",\"device_type\":\"cpu\",\"vendor\":\"V\",\"device\":\"D\",\"parameters\":{}}",
         "device_type"},
        {"{\"kernel\":\"plan\",\"vendor\":\"V\",\"parameters\":{}}", "device_type"},
        {"{\"kernel\":\"products\",\"device_type\":\"cpu\",\"parameters\":{}}", "kernel"},
        {"{\"kernel\":\"plan\",\"device_type\":\"cpu\"}", "parameters"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[1024], why[512];
        snprintf(text, sizeof(text), "[%s]", bad[i].entry);
        plan_entry_list list;
        const int refused = clmla_plan_rates_parse(text, &list, why, sizeof(why));
        CHECK(refused == 1 && list.count == 0 && strstr(why, bad[i].names),
              "plan entry %s: refused %d, kept %zu, why \"%s\" (should name %s)", bad[i].entry, refused, list.count,
              why, bad[i].names);
        if (refused >= 0)
            clmla_plan_rates_list_free(&list);
    }
    char why[512];
    plan_entry_list list;
    CHECK(clmla_plan_rates_parse("{}", &list, why, sizeof(why)) == -1, "plan rates: an object taken for a file");

    const char *layered = "[{\"kernel\":\"plan\",\"vendor\":\"V\",\"device\":\"D\",\"parameters\":"
                          "{\"gpu_tiled_key_rate\":0.5}},"
                          "{\"kernel\":\"plan\",\"device_type\":\"gpu\",\"parameters\":"
                          "{\"gpu_tiled_key_rate\":0.25,\"gpu_tiled_pair_rate\":0.75,\"min_tokens\":8}}]";
    const int refused = clmla_plan_rates_parse(layered, &list, why, sizeof(why));
    CHECK(refused == 0 && list.count == 2, "plan rates, layered entries: refused %d (%s)", refused, why);
    if (refused == 0) {
        clmla_device_info d = device("V", "D", "P");
        d.kind = CLMLA_DEVICE_KIND_GPU;
        clmla_plan_rates r;
        CHECK(clmla_plan_rates_resolve(&list, &d, &r) == 2 && r.gpu_tiled_key_rate == 0.5 &&
                  r.gpu_tiled_pair_rate == 0.75 && r.min_tokens == 8 && r.gpu_absorbed_pair_rate == 1,
              "plan rates, layered entries: %.17g %.17g %d %.17g", r.gpu_tiled_key_rate, r.gpu_tiled_pair_rate,
              r.min_tokens, r.gpu_absorbed_pair_rate);
        d.kind = CLMLA_DEVICE_KIND_CPU;
        CHECK(clmla_plan_rates_resolve(&list, &d, &r) == 1 && r.gpu_tiled_key_rate == 0.5 && r.min_tokens == 16,
              "plan rates, layered entries on a CPU: %.17g %d", r.gpu_tiled_key_rate, r.min_tokens);
    }
    if (refused >= 0)
        clmla_plan_rates_list_free(&list);
}

int main(void)
{
    check_kind(LATENT);
    check_kind(PRODUCTS);
    check_old_tables();
    check_clblast();
    check_plan_entries();
    check_plan_old_rates();
    check_plan_parser();
    return check_summary();
}
