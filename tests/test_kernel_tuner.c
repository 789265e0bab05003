/* The kernel searches of clmla_tuning.h (clmla_tune_latent, clmla_tune_prefill, clmla_tune_products)
   in their quick mode with a tiny budget: each result is one of the candidates the library's tables
   declare and satisfies their constraints, the progress callback sees every candidate it counts,
   and bad options are refused naming the field. Exit 77 without a device. */
#include "check.h"
#include "clmla_tuning.h"
#include "attention.h"
#include "gemm.h"
#include "tuner.h"

#include <stdio.h>
#include <string.h>

static clmla_context *ctx;

/* What the progress callback saw: per stage, the total announced and the candidates reported. */
typedef struct seen {
    int stages, bad_stage, best_events, timed;
    int total, counted; /* of the stage in progress */
    int last_index_ok;
} seen;

static void progress(void *user, const clmla_tune_event *e)
{
    seen *s = user;
    if (e->kind == CLMLA_TUNE_STAGE) {
        if (s->stages && s->counted != s->total)
            s->bad_stage++;
        s->stages++;
        s->total = e->total;
        s->counted = 0;
    } else if (e->kind == CLMLA_TUNE_CANDIDATE) {
        s->counted++;
        if (e->index != s->counted || e->total != s->total || !e->label || !e->tuning)
            s->bad_stage++;
        s->timed += e->timed;
    } else
        s->best_events++;
}

static void seen_end(seen *s)
{
    if (s->stages && s->counted != s->total)
        s->bad_stage++;
}

/* A refusal: CLMLA_ERROR_INVALID_ARGUMENT with the field's name in the message. */
static void check_refused(clmla_status st, const char *field, const char *what)
{
    CHECK(st == CLMLA_ERROR_INVALID_ARGUMENT, "%s: status %d", what, (int)st);
    CHECK(strstr(clmla_last_error(ctx), field) != NULL, "%s: the message does not name %s: %s", what, field,
          clmla_last_error(ctx));
}

static int in_list(const void *t, const void *cands, int n, size_t size)
{
    for (int i = 0; i < n; i++)
        if (memcmp((const char *)cands + (size_t)i * size, t, size) == 0)
            return 1;
    return 0;
}

static clmla_kernel_tune_options tiny(seen *s)
{
    clmla_kernel_tune_options o = {.quick = 1, .repetitions = 1, .max_candidates = 2, .progress = progress, .user = s};
    return o;
}

/* The candidates (at most 2) that space declares around base on c's device, for 16 heads at one
   token over a cache of dtype; fills info with the device's and returns how many. */
static int declared_candidates(clmla_context *c, const tune_space *space, clmla_cache_dtype dtype,
                               const clmla_latent_tuning *base, clmla_latent_tuning *cands, clmla_device_info *info)
{
    clmla_context_device(c, info);
    clmla_latent_tuning defaults;
    clmla_latent_tuning_defaults(&defaults);
    const int rows = clmla_attention_variant(c) == CLMLA_LATENT_ROWS;
    const tune_env env = {1, 16, rows, dtype, info->max_work_group_size, info};
    return clmla_tuner_enumerate(space, &env, base, &defaults, cands, 2);
}

static void latent_on(clmla_context *c, clmla_cache_dtype dtype, const char *what)
{
    clmla_context *saved = ctx;
    ctx = c;
    seen s;
    memset(&s, 0, sizeof(s));
    clmla_kernel_tune_options o = tiny(&s);
    o.cache_dtype = dtype;
    clmla_latent_tune_result r;
    CHECK_STATUS(clmla_tune_latent(c, &o, &r), CLMLA_SUCCESS, c);
    seen_end(&s);
    CHECK(s.stages >= 1 && s.bad_stage == 0 && s.best_events == 1, "%s: stages %d, bad %d, best %d", what, s.stages,
          s.bad_stage, s.best_events);
    CHECK(r.candidates >= 1 && r.candidates <= 2 && r.timed >= 1, "%s: %d candidates, %d timed", what,
          r.candidates, r.timed);
    CHECK(clmla_latent_tuning_check(&r.best, NULL) == CLMLA_SUCCESS, "%s: the best is not legal", what);
    /* the declared candidates around the same base */
    clmla_device_info info;
    clmla_latent_tuning cands[TUNE_MAX_CANDIDATES];
    const int rows = clmla_attention_variant(c) == CLMLA_LATENT_ROWS;
    const int n = declared_candidates(c, clmla_tuner_latent_space(rows, dtype), dtype, &r.base, cands, &info);
    CHECK(n == r.candidates, "%s: %d candidates declared, %d searched", what, n, r.candidates);
    CHECK(in_list(&r.best, cands, n, sizeof(r.best)), "%s: the best is not a declared candidate", what);
    CHECK(memcmp(&cands[0], &r.base, sizeof(r.base)) == 0, "%s: the first candidate is not the base", what);
    CHECK(r.ratio > 0 && r.ratio <= 1.0 + 1e-12 && r.best_us[0] > 0 && r.base_us[1] > 0, "%s: ratio %g, times %g %g",
          what, r.ratio, r.best_us[0], r.base_us[1]);
    if (!rows && r.best.group_max_items > (int)info.max_work_group_size)
        CHECK(0, "%s: group_max_items %d past the device's %zu", what, r.best.group_max_items, info.max_work_group_size);
    ctx = saved;
}

static void part_latent(void)
{
    latent_on(ctx, CLMLA_CACHE_F32, "latent f32");
    /* the decoded caches' space on the work-group kernel */
    clmla_context_options co;
    memset(&co, 0, sizeof(co));
    co.attention_kernels = "group";
    clmla_context *g = NULL;
    if (clmla_context_create_opts(&co, &g) == CLMLA_SUCCESS) {
        latent_on(g, CLMLA_CACHE_BF16, "latent bf16, group");
        clmla_context_destroy(g);
    } else
        CHECK(0, "a context with the group kernels: %s", clmla_last_error(NULL));

    /* the time allowed spent at once: every candidate after the first reported as skipped */
    seen s;
    memset(&s, 0, sizeof(s));
    clmla_kernel_tune_options o = tiny(&s);
    o.max_candidates = 0;
    o.max_seconds = 1e-9;
    clmla_latent_tune_result r;
    CHECK_STATUS(clmla_tune_latent(ctx, &o, &r), CLMLA_SUCCESS, ctx);
    seen_end(&s);
    CHECK(s.bad_stage == 0 && s.timed == 1 && r.timed == 1, "max_seconds: bad %d, timed %d", s.bad_stage,
          s.timed);
    CHECK(memcmp(&r.best, &r.base, sizeof(r.base)) == 0, "max_seconds: the base was not kept");
}

static void part_prefill(void)
{
    seen s;
    memset(&s, 0, sizeof(s));
    clmla_kernel_tune_options o = tiny(&s);
    clmla_latent_tune_result r;
    CHECK_STATUS(clmla_tune_prefill(ctx, &o, &r), CLMLA_SUCCESS, ctx);
    seen_end(&s);
    CHECK(s.stages >= 1 && s.bad_stage == 0 && s.best_events == 1, "prefill: stages %d, bad %d", s.stages, s.bad_stage);
    CHECK(clmla_latent_tuning_check(&r.best, NULL) == CLMLA_SUCCESS, "prefill: the best is not legal");
    clmla_device_info info;
    clmla_latent_tuning cands[TUNE_MAX_CANDIDATES];
    const int rows = clmla_attention_variant(ctx) == CLMLA_LATENT_ROWS;
    const int n = declared_candidates(ctx, clmla_tuner_prefill_space(rows), CLMLA_CACHE_F32, &r.base, cands, &info);
    CHECK(n == r.candidates, "prefill: %d declared, %d searched", n, r.candidates);
    /* the best is the base with a declared candidate's prefill fields (here the candidates differ
       from the base in those fields alone) */
    CHECK(in_list(&r.best, cands, n, sizeof(r.best)), "prefill: the best is not a declared candidate");
    /* from: the parameters kept beside the winner's prefill fields */
    clmla_latent_tuning from = r.base;
    from.group_keys = from.group_keys == 4 ? 2 : 4;
    memset(&s, 0, sizeof(s));
    o = tiny(&s);
    o.max_candidates = 1;
    o.from = &from;
    CHECK_STATUS(clmla_tune_prefill(ctx, &o, &r), CLMLA_SUCCESS, ctx);
    CHECK(r.best.group_keys == from.group_keys && strcmp(r.source, "options") == 0, "prefill from: group_keys %d, %s",
          r.best.group_keys, r.source);
}

static void part_products(void)
{
    seen s;
    memset(&s, 0, sizeof(s));
    clmla_kernel_tune_options o = tiny(&s);
    clmla_product_tune_result r;
    CHECK_STATUS(clmla_tune_products(ctx, &o, 2048, &r), CLMLA_SUCCESS, ctx);
    seen_end(&s);
    CHECK(s.stages >= 1 && s.bad_stage == 0 && s.best_events >= 1, "products: stages %d, bad %d", s.stages, s.bad_stage);
    CHECK(clmla_product_tuning_check(&r.best, NULL) == CLMLA_SUCCESS, "products: the best is not legal");
    CHECK(r.ratio > 0 && r.ratio <= 1.0 + 1e-12, "products: ratio %g", r.ratio);
    clmla_device_info info;
    clmla_context_device(ctx, &info);
    clmla_product_tuning defaults, cands[TUNE_MAX_CANDIDATES];
    clmla_product_tuning_defaults(&defaults);
    const int cpu = clmla_products_rows(ctx);
    const tune_env env = {1, 0, cpu, CLMLA_CACHE_F32, info.max_work_group_size, &info};
    const tune_space *sp = clmla_tuner_products_space(cpu ? TUNE_PRODUCTS_PACKED : TUNE_PRODUCTS_SKINNY);
    const int n = clmla_tuner_enumerate(sp, &env, &r.base, &defaults, cands, 2);
    int found = 0; /* the decode stage's fields of the best are a declared candidate's */
    for (int i = 0; i < n && !found; i++) {
        int same = 1;
        for (int f = 0; f < sp->nfields; f++)
            same &= memcmp((const char *)&cands[i] + sp->fields[f].offset, (const char *)&r.best + sp->fields[f].offset,
                           sizeof(int)) == 0;
        found = same;
    }
    CHECK(found, "products: the best's decode fields are not a declared candidate's");
    CHECK(cpu ? r.tiled_rows == 128 && r.tiled_ratio > 0 : r.nn_ratio > 0, "products: tiled rows %d ratio %g, nn %g",
          r.tiled_rows, r.tiled_ratio, r.nn_ratio);
    if (!cpu)
        CHECK(r.best.skinny_nn_slices <= r.best.skinny_nn_items, "products: slices %d > items %d", r.best.skinny_nn_slices,
              r.best.skinny_nn_items);
}

static void part_refusals(void)
{
    clmla_kernel_tune_options o;
    clmla_latent_tune_result lr;
    clmla_product_tune_result pr;
    memset(&o, 0, sizeof(o));
    o.heads = 2000;
    check_refused(clmla_tune_latent(ctx, &o, &lr), "heads", "latent heads 2000");
    memset(&o, 0, sizeof(o));
    o.ctx_len = 10;
    check_refused(clmla_tune_latent(ctx, &o, &lr), "ctx_len", "latent ctx_len 10");
    memset(&o, 0, sizeof(o));
    o.cache_dtype = (clmla_cache_dtype)42;
    check_refused(clmla_tune_latent(ctx, &o, &lr), "cache_dtype", "latent cache_dtype 42");
    memset(&o, 0, sizeof(o));
    o.repetitions = 99;
    check_refused(clmla_tune_latent(ctx, &o, &lr), "repetitions", "latent repetitions 99");
    memset(&o, 0, sizeof(o));
    o.max_seconds = -1;
    check_refused(clmla_tune_prefill(ctx, &o, &lr), "max_seconds", "prefill max_seconds -1");
    memset(&o, 0, sizeof(o));
    o.max_candidates = -3;
    check_refused(clmla_tune_products(ctx, &o, 2048, &pr), "max_candidates", "products max_candidates -3");
    memset(&o, 0, sizeof(o));
    o.quick = 7;
    check_refused(clmla_tune_products(ctx, &o, 2048, &pr), "quick", "products quick 7");
    memset(&o, 0, sizeof(o));
    o.heads = 64;
    check_refused(clmla_tune_prefill(ctx, &o, &lr), "heads", "prefill heads 64");
    memset(&o, 0, sizeof(o));
    check_refused(clmla_tune_products(ctx, &o, 0, &pr), "k ", "products k 0");
    check_refused(clmla_tune_latent(ctx, &o, NULL), "result", "latent result NULL");
    if (clmla_attention_variant(ctx) == CLMLA_LATENT_ROWS) {
        o.cache_dtype = CLMLA_CACHE_FP8;
        check_refused(clmla_tune_latent(ctx, &o, &lr), "cache_dtype", "latent fp8 on the row kernels");
    }
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(void);
    } parts[] = {{"refusals", part_refusals}, {"latent", part_latent}, {"prefill", part_prefill}, {"products", part_products}};
    if (clmla_context_create(NULL, &ctx) != CLMLA_SUCCESS) {
        printf("no OpenCL device (%s): skipped\n", clmla_last_error(NULL));
        return 77;
    }
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        int run = argc < 2;
        for (int a = 1; a < argc; a++)
            run |= strcmp(argv[a], parts[i].name) == 0;
        if (!run)
            continue;
        const int before = check_failed;
        parts[i].run();
        printf("# part %-9s %d failed\n", parts[i].name, check_failed - before);
    }
    clmla_context_destroy(ctx);
    return check_summary();
}
