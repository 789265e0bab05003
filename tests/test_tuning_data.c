/* The built-in tuning entries (the JSON files of host/mla/tuning_data, embedded at build): every entry parses
   through the user files' parser, carries its provenance ("date", "measured"), has a key of its own,
   and changes the defaults, each parameter it lists being off its default; the lookup gives, for
   every device and class of the C tables the files replaced, the values those tables gave (written
   out below from them). No device needed. */
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
        const cJSON *measured = cJSON_GetObjectItemCaseSensitive(e, "measured");
        CHECK(cJSON_IsString(date) && strlen(date->valuestring) == 10 && cJSON_IsString(measured) &&
                  measured->valuestring[0],
              "%s.json entry %d (%s): no \"date\" (YYYY-MM-DD) or \"measured\" text", name, index, device);
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

/* The values of the C tables the JSON files replaced (host/mla/kernel_tuning.c and tuning.c before
   issue 57), field by field in the structs' order; the fields that an old entry left out at its end
   (C's zero) are written out as 0; group_stage_keys, 0 in every one and removed since, is left out;
   group_large_grf, added since, is 0 in every one; PVC's entry has changed since (below). */
static const clmla_latent_tuning latent_old_defaults = {16, 8, 4, 16, 4, 128, 8, 1, 16, 1, 8,
                                                        128, 32, 32, 64, 16, 1, 0, 1, 0, 0};
static const clmla_latent_tuning latent_old_epyc = {16, 8, 4, 16, 4, 128, 8, 0, 16, 0, 4,
                                                    128, 32, 32, 64, 16, 0, 0, 1, 0, 0};
static const clmla_latent_tuning latent_old_xeon_16 = {16, 8, 4, 16, 4, 128, 8, 1, 16, 1, 8,
                                                       128, 32, 32, 64, 32, 0, 2, 1, 0, 0};
static const clmla_latent_tuning latent_old_xeon_other = {16, 8, 4, 16, 4, 128, 8, 1, 16, 1, 8,
                                                          128, 32, 32, 64, 16, 0, 2, 1, 0, 0};
static const clmla_latent_tuning latent_old_h100_16 = {16, 8, 4, 16, 4, 128, 4, 1, 16, 1, 8,
                                                       128, 32, 32, 64, 16, 1, 0, 1, 0, 0};
static const clmla_latent_tuning latent_old_h100_128 = {16, 8, 4, 16, 4, 256, 8, 1, 16, 1, 8,
                                                        128, 32, 32, 64, 16, 1, 0, 1, 0, 0};
static const clmla_latent_tuning latent_old_cdna_arc = {16, 8, 4, 8, 2, 256, 8, 1, 16, 1, 8,
                                                        128, 32, 32, 64, 16, 1, 0, 1, 0, 0};
/* PVC: changed since the tables, to IGC's 256-GRF mode (group_large_grf 1), where 512 items and 4
   heads an item in the score step (group_decode_heads) leave no spill (docs/VENDORS.md) */
static const clmla_latent_tuning latent_old_pvc = {16, 8, 4, 8, 1, 512, 8, 1, 16, 1, 4,
                                                   128, 32, 32, 64, 16, 1, 0, 1, 0, 1};

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

    const int heads[] = {0, 1, 16, 32, 64, 128};
    for (size_t i = 0; i < sizeof(heads) / sizeof(heads[0]); i++) {
        const int h = heads[i];
        expect_latent(EPYC, h, h == 16 ? &latent_old_epyc : &latent_old_defaults);
        expect_latent(EPYC512, h, h == 16 ? &latent_old_epyc : &latent_old_defaults);
        expect_latent(XEON, h, h == 16 ? &latent_old_xeon_16 : &latent_old_xeon_other);
        expect_latent(H100, h, h == 16 ? &latent_old_h100_16 : h == 128 ? &latent_old_h100_128 : &latent_old_defaults);
        expect_latent(AMD_GPU("gfx942:sramecc+:xnack-"), h, &latent_old_cdna_arc);
        expect_latent(AMD_GPU("gfx942:sramecc+:xnack+"), h, &latent_old_cdna_arc);
        expect_latent(AMD_GPU("gfx90a:sramecc+:xnack-"), h, &latent_old_cdna_arc);
        expect_latent(AMD_GPU("gfx90a:sramecc+:xnack+"), h, &latent_old_cdna_arc);
        expect_latent(ARC, h, &latent_old_cdna_arc);
        expect_latent(PVC, h, &latent_old_pvc);
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
        const cJSON *measured = cJSON_GetObjectItemCaseSensitive(e, "measured");
        CHECK(cJSON_IsString(date) && cJSON_IsString(measured), "clblast.json, %s: no \"date\" or \"measured\"",
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

int main(void)
{
    check_kind(LATENT);
    check_kind(PRODUCTS);
    check_old_tables();
    check_clblast();
    return check_summary();
}
