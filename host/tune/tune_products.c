/* clmla_tune_products: the product kernels' parameter spaces (the decode-shaped kernels of either
   form, the prefill tiles of the CPU forms, the per-head absorption's K split of the work-group
   forms) and their measures (tuner.h). */
#include "tuner.h"
#include "dtype.h"
#include "gemm.h"
#include "kernel_tuning.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PT(f) #f, offsetof(clmla_product_tuning, f)

static int product_valid(const void *t)
{
    return clmla_product_tuning_check(t, NULL) == CLMLA_SUCCESS;
}

static int fits(int items, const tune_env *env)
{
    return env->max_work_group == 0 || (size_t)items <= env->max_work_group;
}

static int skinny_fits(const void *c, const tune_env *env)
{
    return fits(((const clmla_product_tuning *)c)->skinny_items, env);
}

/* the K split's slices within the work-group's items, and the items within the device's */
static int nn_fits(const void *c, const tune_env *env)
{
    const clmla_product_tuning *t = c;
    return t->skinny_nn_slices <= t->skinny_nn_items && fits(t->skinny_nn_items, env);
}

/* gemm_skinny_nt (work-group forms): a quick handful, or the grid at 4 values a load, then wider
   loads, then each width read as whole vectors the other way. */
static const tune_axis skinny_fields[] = {{PT(skinny_items), 0, {0}}, {PT(skinny_unroll), 0, {0}},
                                          {PT(skinny_columns), 0, {0}}, {PT(skinny_vector), 0, {0}},
                                          {PT(skinny_aligned), 0, {0}}};
static const tune_block skinny_blocks[] = {
    {TUNE_QUICK, 1, NULL, skinny_fits, 4,
     {{PT(skinny_items), 4, {256, 128, 128, 128}}, {PT(skinny_unroll), 4, {2, 4, 2, 2}},
      {PT(skinny_columns), 4, {4, 4, 8, 4}}, {PT(skinny_vector), 4, {4, 4, 4, 16}}}},
    {TUNE_FULL, 0, NULL, skinny_fits, 4,
     {{PT(skinny_vector), 1, {4}}, {PT(skinny_items), 3, {64, 128, 256}}, {PT(skinny_unroll), 3, {1, 2, 4}},
      {PT(skinny_columns), 3, {2, 4, 8}}}},
    {TUNE_FULL, 0, NULL, skinny_fits, 1, {{PT(skinny_vector), 2, {8, 16}}}},
    {TUNE_FULL, 0, NULL, skinny_fits, 2, {{PT(skinny_vector), 3, {4, 8, 16}}, {PT(skinny_aligned), 1, {TUNE_TOGGLE}}}},
};
static const tune_space skinny_space = {"decode products (gemm_skinny_nt)", sizeof(clmla_product_tuning), 1,
                                        skinny_fields, 5, skinny_blocks, 4, product_valid, NULL, NULL, 0};

/* gemm_packed_rows (CPU forms): items a compute unit and streams at 1 row, then fp8's block sums,
   the line-wide form and a floor on the panel each the other way. */
static const tune_axis packed_fields[] = {{PT(cpu_items_per_cu), 0, {0}}, {PT(packed_streams_1), 0, {0}},
                                          {PT(cpu_fp8_block_sums), 0, {0}}, {PT(cpu_wide), 0, {0}},
                                          {PT(cpu_min_panel), 0, {0}}};
static const tune_axis packed_defaults[] = {{PT(cpu_items_per_cu), 0, {0}}, {PT(packed_streams_1), 0, {0}}};
static const tune_block packed_blocks[] = {
    {TUNE_QUICK, 1, NULL, NULL, 2, {{PT(cpu_items_per_cu), 2, {4, 8}}, {PT(packed_streams_1), 2, {8, 4}}}},
    {TUNE_FULL, 0, NULL, NULL, 2, {{PT(cpu_items_per_cu), 3, {4, 8, 16}}, {PT(packed_streams_1), 3, {4, 6, 8}}}},
    {TUNE_FULL, 0, NULL, NULL, 1, {{PT(cpu_fp8_block_sums), 1, {TUNE_TOGGLE}}}},
    {TUNE_FULL, 0, NULL, NULL, 1, {{PT(cpu_wide), 1, {TUNE_TOGGLE}}}},
    {TUNE_FULL, 0, NULL, NULL, 1, {{PT(cpu_min_panel), 2, {0, 128}}}},
};
static const tune_space packed_space = {"decode products (gemm_packed_rows)", sizeof(clmla_product_tuning), 1,
                                        packed_fields, 5, packed_blocks, 5, product_valid, NULL,
                                        packed_defaults, 2};

/* gemm_tiled_rows (CPU forms, prefill rows): rows, columns and weight rows of a tile. */
static const tune_axis tiled_fields[] = {{PT(tiled_rows), 0, {0}}, {PT(tiled_columns), 0, {0}},
                                         {PT(tiled_weight_rows), 0, {0}}};
static const tune_block tiled_blocks[] = {
    {TUNE_QUICK, 1, NULL, NULL, 3,
     {{PT(tiled_rows), 3, {128, 256, 256}}, {PT(tiled_columns), 3, {48, 96, 48}}, {PT(tiled_weight_rows), 3, {3, 3, 2}}}},
    {TUNE_FULL, 0, NULL, NULL, 3,
     {{PT(tiled_rows), 2, {128, 256}}, {PT(tiled_columns), 3, {24, 48, 96}}, {PT(tiled_weight_rows), 3, {2, 3, 4}}}},
};
static const tune_space tiled_space = {"prefill products (gemm_tiled_rows)", sizeof(clmla_product_tuning), 1,
                                       tiled_fields, 3, tiled_blocks, 2, product_valid, NULL, NULL, 0};

/* gemm_skinny_nn (work-group forms): the per-head absorption's items and K slices. */
static const tune_axis nn_fields[] = {{PT(skinny_nn_items), 0, {0}}, {PT(skinny_nn_slices), 0, {0}}};
static const tune_block nn_blocks[] = {
    {TUNE_QUICK, 1, NULL, nn_fits, 2, {{PT(skinny_nn_items), 2, {64, 64}}, {PT(skinny_nn_slices), 2, {8, 16}}}},
    {TUNE_FULL, 0, NULL, nn_fits, 2, {{PT(skinny_nn_items), 3, {64, 128, 256}}, {PT(skinny_nn_slices), 5, {1, 4, 8, 16, 32}}}},
};
static const tune_space nn_space = {"per-head absorption x W^UK (gemm_skinny_nn)", sizeof(clmla_product_tuning), 0,
                                    nn_fields, 2, nn_blocks, 2, product_valid, NULL, NULL, 0};

const tune_space *clmla_tuner_products_space(int stage)
{
    switch (stage) {
    case TUNE_PRODUCTS_SKINNY:
        return &skinny_space;
    case TUNE_PRODUCTS_PACKED:
        return &packed_space;
    case TUNE_PRODUCTS_TILED:
        return &tiled_space;
    default:
        return &nn_space;
    }
}

/* ---- products on random weights ------------------------------------------------------------------ */

typedef struct pt_shape {
    const char *name;
    int n, k;
} pt_shape;

/* A weight of one shape and dtype as clmla_linear_create takes it. */
typedef struct pt_weight {
    const pt_shape *shape;
    clmla_dtype dtype;
    void *codes;
    float *scales; /* fp8 block scales */
} pt_weight;

static const char *dtype_name(clmla_dtype d)
{
    return d == CLMLA_DTYPE_F32 ? "f32" : d == CLMLA_DTYPE_BF16 ? "bf16" : d == CLMLA_DTYPE_FP8_E4M3 ? "fp8" : "f16";
}

static void pt_weight_free(pt_weight *w)
{
    free(w->codes);
    free(w->scales);
    memset(w, 0, sizeof(*w));
}

/* Random weights in [-1, 1] in the dtype; fp8: the nearest e4m3 to 448 times such a weight (each
   block's largest near 448, as a checkpoint's scales make it, so that subnormal codes are as rare
   as there) and block scales in [0.5, 1.5]. 0, or -1 when out of host memory. */
static int pt_weight_make(pt_weight *w, const pt_shape *shape, clmla_dtype dtype, uint32_t seed)
{
    memset(w, 0, sizeof(*w));
    w->shape = shape;
    w->dtype = dtype;
    const size_t n = (size_t)shape->n, k = (size_t)shape->k, count = n * k;
    const size_t eb = dtype == CLMLA_DTYPE_F32 ? 4 : dtype == CLMLA_DTYPE_FP8_E4M3 ? 1 : 2;
    const size_t sr = (n + 127) / 128, sc = (k + 127) / 128;
    w->codes = malloc(count * eb);
    if (dtype == CLMLA_DTYPE_FP8_E4M3)
        w->scales = malloc(sr * sc * sizeof(float));
    if (!w->codes || (dtype == CLMLA_DTYPE_FP8_E4M3 && !w->scales)) {
        pt_weight_free(w);
        return -1;
    }
    for (size_t i = 0; dtype == CLMLA_DTYPE_FP8_E4M3 && i < sr * sc; i++)
        w->scales[i] = 0.5f + 0.5f * (clmla_tuner_rand(&seed) + 1.0f);
    for (size_t i = 0; i < count; i++) {
        const float v = clmla_tuner_rand(&seed);
        if (dtype == CLMLA_DTYPE_F32)
            ((float *)w->codes)[i] = v;
        else if (dtype == CLMLA_DTYPE_BF16) {
            uint32_t bits;
            memcpy(&bits, &v, 4);
            ((uint16_t *)w->codes)[i] = (uint16_t)(bits >> 16);
        } else
            ((uint8_t *)w->codes)[i] = clmla_double_to_e4m3(448.0 * (double)v);
    }
    return 0;
}

typedef struct pt_run {
    clmla_context *ctx;
    int reps, m;              /* rows of x of the stage */
    const pt_weight *ws;      /* the stage's weights */
    int nw;
    cl_mem x, y;
    float *h_y;
} pt_run;

/* The checked output: y = x W^T at m rows for every weight, each after it; then, where asked, the
   median microseconds of reps products of each (after the first, which builds the kernels). */
static clmla_status pt_measure(void *state, const void *tuning, float *out, double *times)
{
    pt_run *r = state;
    clmla_status st = clmla_context_set_product_tuning(r->ctx, tuning);
    size_t at = 0;
    for (int w = 0; w < r->nw && st == CLMLA_SUCCESS; w++) {
        const pt_weight *wt = &r->ws[w];
        const size_t n = (size_t)wt->shape->n;
        clmla_tensor t = {.data = wt->codes, .ndim = 2, .shape[0] = (int64_t)n, .shape[1] = (int64_t)wt->shape->k,
                          .dtype = wt->dtype, .scale = wt->scales};
        clmla_linear *lin = NULL;
        st = clmla_linear_create(r->ctx, &t, &lin);
        if (st == CLMLA_SUCCESS)
            st = clmla_linear_forward_cl(lin, r->m, r->x, 0, r->y, 0, NULL);
        if (st == CLMLA_SUCCESS) {
            const cl_int err = clEnqueueReadBuffer(r->ctx->queue, r->y, CL_TRUE, 0, (size_t)r->m * n * sizeof(float),
                                                   out + at, 0, NULL, NULL);
            if (err != CL_SUCCESS)
                st = clmla_fail_cl(r->ctx, err, "clEnqueueReadBuffer (tuning output)");
        }
        at += (size_t)r->m * n;
        if (times) {
            double t_us[32];
            for (int i = 0; i < r->reps && st == CLMLA_SUCCESS; i++) {
                const double t0 = clmla_tuner_now();
                st = clmla_linear_forward_cl(lin, r->m, r->x, 0, r->y, 0, NULL);
                if (st == CLMLA_SUCCESS) {
                    const cl_int err = clFinish(r->ctx->queue);
                    if (err != CL_SUCCESS)
                        st = clmla_fail_cl(r->ctx, err, "clFinish");
                }
                t_us[i] = (clmla_tuner_now() - t0) * 1e6;
            }
            if (st == CLMLA_SUCCESS)
                times[w] = clmla_tuner_median(t_us, r->reps);
        }
        clmla_linear_destroy(lin);
    }
    return st;
}

/* ---- the per-head absorption in decode steps --------------------------------------------------- */

#define NN_PREFIX 15 /* tokens in the cache before the timed steps */
#define NN_BATCH 8   /* the most sequences of a timed step */

typedef struct nn_layer {
    const char *name;
    clmla_tuner_random_layer rl;
    clmla_layer *layer;
    clmla_cache *cache;
    cl_mem x, out;         /* [NN_BATCH, D]: every row the same input */
    int32_t seq[NN_BATCH]; /* forks of one prefilled sequence, NN_PREFIX tokens each between uses */
    int batches, D;
} nn_layer;

typedef struct nn_run {
    clmla_context *ctx;
    nn_layer layers[2];
    int nl, reps;
} nn_run;

static void nn_free(nn_layer *n)
{
    clmla_layer_destroy(n->layer);
    clmla_cache_destroy(n->cache);
    clmla_release_mem(n->x);
    clmla_release_mem(n->out);
    clmla_tuner_random_layer_free(&n->rl);
    memset(n, 0, sizeof(*n));
}

/* The layer of `preset` kept as `want`, an f32 cache holding NN_PREFIX tokens of random inputs in
   NN_BATCH sequences. */
static clmla_status nn_make(clmla_context *ctx, nn_layer *n, const char *name, clmla_preset preset,
                            clmla_weights_dtype want, int batches)
{
    memset(n, 0, sizeof(*n));
    n->name = name;
    n->batches = batches;
    uint64_t rng = 0x5DEECE66DULL + (uint64_t)preset;
    clmla_status st = clmla_tuner_random_layer_make(ctx, &n->rl, preset, want, &rng);
    if (st != CLMLA_SUCCESS)
        return st;
    const clmla_layer_config *cfg = &n->rl.cfg;
    const int D = n->D = cfg->hidden_size;
    float *h_x = clmla_tuner_random_floats((size_t)(NN_PREFIX + 1) * D, 1.0f, 0, &rng);
    float *scratch = malloc((size_t)NN_PREFIX * D * sizeof(float));
    if (!h_x || !scratch) {
        free(h_x);
        free(scratch);
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory for the %s layer", name);
    }
    cl_int err = CL_SUCCESS;
    n->x = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, (size_t)NN_BATCH * D * sizeof(float), NULL, &err);
    if (err == CL_SUCCESS)
        n->out = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, (size_t)NN_BATCH * D * sizeof(float), NULL, &err);
    for (int b = 0; b < NN_BATCH && err == CL_SUCCESS; b++) /* every timed row is the last input */
        err = clEnqueueWriteBuffer(ctx->queue, n->x, CL_TRUE, (size_t)b * D * sizeof(float), (size_t)D * sizeof(float),
                                   h_x + (size_t)NN_PREFIX * D, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        st = clmla_fail_cl(ctx, err, "clCreateBuffer (per-head tuning rows)");
    /* a block each for the prefix's sequence and every fork's copy of it, and for the warm-up */
    const int bt = 64, steps = 64;
    const clmla_cache_config cc = {1, cfg->kv_lora_rank, cfg->qk_rope_head_dim, bt,
                                   (NN_BATCH + 1) * ((NN_PREFIX + steps) / bt + 2) + CLMLA_WARMUP_TOKENS / bt + 2,
                                   CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
    int32_t prefix = -1;
    clmla_batch_entry e = {0, NN_PREFIX};
    const clmla_forward_args args = {&e, 1, 0, CLMLA_PATH_AUTO};
    if (st == CLMLA_SUCCESS)
        st = clmla_layer_create(ctx, cfg, &n->rl.w, &n->layer);
    if (st == CLMLA_SUCCESS)
        st = clmla_cache_create(ctx, &cc, &n->cache);
    if (st == CLMLA_SUCCESS)
        st = clmla_cache_seq_add(n->cache, &prefix);
    e.seq_id = prefix;
    if (st == CLMLA_SUCCESS)
        st = clmla_layer_forward(n->layer, n->cache, &args, h_x, scratch);
    for (int b = 0; b < NN_BATCH && st == CLMLA_SUCCESS; b++)
        st = clmla_cache_seq_fork(n->cache, prefix, &n->seq[b]);
    if (st == CLMLA_SUCCESS)
        st = clmla_cache_seq_free(n->cache, prefix);
    free(h_x);
    free(scratch);
    return st;
}

/* The checked output: each layer's next token at batch 1; then the median microseconds of reps
   steps of 1 and, where the layer takes them, NN_BATCH sequences; every sequence is cut back to
   the prefix after. */
static clmla_status nn_measure(void *state, const void *tuning, float *out, double *times)
{
    nn_run *r = state;
    clmla_status st = clmla_context_set_product_tuning(r->ctx, tuning);
    size_t at = 0;
    int ti = 0;
    for (int l = 0; l < r->nl && st == CLMLA_SUCCESS; l++) {
        nn_layer *n = &r->layers[l];
        clmla_batch_entry e[NN_BATCH];
        for (int b = 0; b < NN_BATCH; b++) {
            e[b].seq_id = n->seq[b];
            e[b].num_tokens = 1;
        }
        clmla_forward_args args = {e, 1, 0, CLMLA_PATH_ABSORBED};
        st = clmla_layer_forward_cl(n->layer, n->cache, &args, n->x, 0, n->out, 0, NULL);
        if (st == CLMLA_SUCCESS) {
            const cl_int err = clEnqueueReadBuffer(r->ctx->queue, n->out, CL_TRUE, 0, (size_t)n->D * sizeof(float),
                                                   out + at, 0, NULL, NULL);
            if (err != CL_SUCCESS)
                st = clmla_fail_cl(r->ctx, err, "clEnqueueReadBuffer (tuning output)");
        }
        at += (size_t)n->D;
        for (int k = 0; k < n->batches && st == CLMLA_SUCCESS && times; k++) {
            args.num_entries = k ? NN_BATCH : 1;
            double t[32];
            for (int i = -1; i < r->reps && st == CLMLA_SUCCESS; i++) { /* -1: builds the kernels of this many rows */
                const double t0 = clmla_tuner_now();
                st = clmla_layer_forward_cl(n->layer, n->cache, &args, n->x, 0, n->out, 0, NULL);
                if (st == CLMLA_SUCCESS) {
                    const cl_int err = clFinish(r->ctx->queue);
                    if (err != CL_SUCCESS)
                        st = clmla_fail_cl(r->ctx, err, "clFinish");
                }
                if (i >= 0)
                    t[i] = (clmla_tuner_now() - t0) * 1e6;
            }
            for (int b = 0; b < NN_BATCH && st == CLMLA_SUCCESS; b++)
                st = clmla_cache_seq_truncate(n->cache, n->seq[b], NN_PREFIX);
            if (st == CLMLA_SUCCESS)
                times[ti++] = clmla_tuner_median(t, r->reps);
        }
        for (int b = 0; b < NN_BATCH; b++)
            clmla_cache_seq_truncate(n->cache, n->seq[b], NN_PREFIX);
    }
    return st;
}

/* ---- the call ------------------------------------------------------------------------------------ */

/* The fields of a stage's space copied from `from` into `to`. */
static void take_fields(const tune_space *s, clmla_product_tuning *to, const clmla_product_tuning *from)
{
    for (int f = 0; f < s->nfields; f++)
        memcpy((char *)to + s->fields[f].offset, (const char *)from + s->fields[f].offset, sizeof(int));
}

/* One stage's search around *best (updated with the stage's fields of the winner); its ratio in *ratio. */
static clmla_status stage_search(clmla_context *ctx, const tune_settings *s, const tune_env *env, const tune_space *space,
                                 void *state, size_t out_count, int num_times, const char *detail,
                                 clmla_status (*measure)(void *, const void *, float *, double *),
                                 clmla_product_tuning *best, double *ratio)
{
    clmla_product_tuning defaults, *cands = malloc(TUNE_MAX_CANDIDATES * sizeof(clmla_product_tuning));
    if (!cands)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "clmla_tune_products: out of host memory");
    clmla_product_tuning_defaults(&defaults);
    const int most = s->max_candidates && s->max_candidates < TUNE_MAX_CANDIDATES ? s->max_candidates : TUNE_MAX_CANDIDATES;
    const int n = clmla_tuner_enumerate(space, env, best, &defaults, cands, most);
    const tune_family f = {space, state, out_count, num_times, NULL, 1e-4, 1, detail, measure};
    tune_outcome o;
    clmla_status st = clmla_tuner_search(ctx, &f, s, &defaults, cands, n, &o);
    if (st == CLMLA_SUCCESS) {
        take_fields(space, best, &cands[o.best]);
        *ratio = o.ratio;
    }
    free(cands);
    return st;
}

clmla_status clmla_tune_products(clmla_context *ctx, const clmla_kernel_tune_options *options, size_t k,
                                 clmla_product_tune_result *result)
{
    clmla_kernel_tune_options o;
    tune_settings s;
    clmla_status st = clmla_tuner_settings_resolve(ctx, "clmla_tune_products", result, options, &o, &s);
    if (st != CLMLA_SUCCESS)
        return st;
    if (k == 0)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_tune_products: k must be a product's K (its class: <= 4096 small, else large), not 0");
    memset(result, 0, sizeof(*result));
    const int cpu = clmla_products_rows(ctx);
    const int small = k <= CLMLA_PRODUCT_SMALL_K;
    const tune_env env = {s.quick, 0, cpu, CLMLA_CACHE_F32, ctx->info.max_work_group_size, &ctx->info};
    result->source = "defaults";
    clmla_product_tuning_lookup(&ctx->info, small ? 2048 : 7168, &result->base, &result->source);
    result->best = result->base;

    /* V2-Lite's and V3's projections (docs/MLA.md): the fused q / kv_a product and o_proj of V2-Lite,
       V3's q_b_proj (K 1536), its fused q_a / kv_a product (K 7168) and its kv_a_proj alone (576
       rows: the product of few rows that cpu_min_panel is for). */
    static const pt_shape small_full[] = {{"v2-lite q+kv_a", 3648, 2048}, {"v2-lite o_proj", 2048, 2048},
                                          {"v3 q_b", 24576, 1536}};
    static const pt_shape large_full[] = {{"v3 q_a+kv_a", 2112, 7168}, {"v3 kv_a", 576, 7168}};
    static const pt_shape small_quick[] = {{"v2-lite o_proj", 2048, 2048}};
    static const clmla_dtype dtypes[] = {CLMLA_DTYPE_F32, CLMLA_DTYPE_BF16, CLMLA_DTYPE_FP8_E4M3};
    const pt_shape *shapes = s.quick ? small_quick : small ? small_full : large_full;
    const int nshapes = s.quick ? 1 : small ? 3 : 2, ndt = s.quick ? 2 : 3;
    const int tiled_m = s.quick ? 128 : 512;
    pt_weight ws[16];
    int nw = 0;
    size_t max_k = 0, max_n = 0, out1 = 0;
    for (int i = 0; i < nshapes && st == CLMLA_SUCCESS; i++) {
        max_k = (size_t)shapes[i].k > max_k ? (size_t)shapes[i].k : max_k;
        max_n = (size_t)shapes[i].n > max_n ? (size_t)shapes[i].n : max_n;
        for (int d = 0; d < ndt && st == CLMLA_SUCCESS; d++) {
            if (pt_weight_make(&ws[nw], &shapes[i], dtypes[d], 1000u + (uint32_t)(7 * i + d)))
                st = clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "clmla_tune_products: out of host memory for the weights");
            else
                out1 += (size_t)shapes[i].n, nw++;
        }
    }
    pt_run r;
    memset(&r, 0, sizeof(r));
    r.ctx = ctx;
    r.reps = s.reps;
    if (st == CLMLA_SUCCESS) {
        const size_t xn = (size_t)tiled_m * max_k;
        float *h_x = malloc(xn * sizeof(float));
        if (!h_x)
            st = clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "clmla_tune_products: out of host memory for x");
        uint32_t seed = 31337;
        for (size_t i = 0; h_x && i < xn; i++)
            h_x[i] = clmla_tuner_rand(&seed);
        cl_int err = CL_SUCCESS;
        if (st == CLMLA_SUCCESS)
            r.x = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, xn * sizeof(float), h_x, &err);
        if (st == CLMLA_SUCCESS && err == CL_SUCCESS)
            r.y = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, (size_t)tiled_m * max_n * sizeof(float), NULL, &err);
        if (st == CLMLA_SUCCESS && err != CL_SUCCESS)
            st = clmla_fail_cl(ctx, err, "clCreateBuffer (product tuning buffers)");
        free(h_x);
    }
    char detail[1024];
    if (st == CLMLA_SUCCESS) { /* the decode-shaped kernels at 1 row */
        int len = snprintf(detail, sizeof(detail), "1 rows, on");
        for (int w = 0; w < nw && len > 0 && (size_t)len < sizeof(detail); w++)
            len += snprintf(detail + len, sizeof(detail) - (size_t)len, "%s %s %s (%d x %d)", w ? "," : "", ws[w].shape->name,
                            dtype_name(ws[w].dtype), ws[w].shape->n, ws[w].shape->k);
        r.m = 1;
        r.ws = ws;
        r.nw = nw;
        st = stage_search(ctx, &s, &env, clmla_tuner_products_space(cpu ? TUNE_PRODUCTS_PACKED : TUNE_PRODUCTS_SKINNY), &r, out1, nw,
                          detail, pt_measure, &result->best, &result->ratio);
    }
    if (st == CLMLA_SUCCESS && cpu) { /* the tiles, on the first shape only (prefill costs a FLOP per weight per row) */
        int ntw = 0;
        for (int w = 0; w < nw; w++)
            ntw += ws[w].shape == &shapes[0];
        snprintf(detail, sizeof(detail), "%d rows, on %s in %d dtypes (%d x %d)", tiled_m, shapes[0].name, ntw, shapes[0].n,
                 shapes[0].k);
        r.m = tiled_m;
        r.nw = ntw; /* the first shape's weights come first */
        st = stage_search(ctx, &s, &env, clmla_tuner_products_space(TUNE_PRODUCTS_TILED), &r, (size_t)ntw * tiled_m * shapes[0].n,
                          ntw, detail, pt_measure, &result->best, &result->tiled_ratio);
        result->tiled_rows = tiled_m;
    }
    for (int w = 0; w < nw; w++)
        pt_weight_free(&ws[w]);
    clmla_release_mem(r.x);
    clmla_release_mem(r.y);
    if (st == CLMLA_SUCCESS && !cpu && small) { /* the per-head absorption's K split (K = 128: the small class) */
        nn_run nr;
        memset(&nr, 0, sizeof(nr));
        nr.ctx = ctx;
        nr.reps = s.reps;
        nr.nl = s.quick ? 1 : 2;
        st = nn_make(ctx, &nr.layers[0], "v2-lite", CLMLA_PRESET_DEEPSEEK_V2_LITE,
                     s.quick ? CLMLA_WEIGHTS_FP8 : CLMLA_WEIGHTS_BF16, s.quick ? 1 : 2);
        if (st == CLMLA_SUCCESS && !s.quick)
            st = nn_make(ctx, &nr.layers[1], "v3", CLMLA_PRESET_DEEPSEEK_V3, CLMLA_WEIGHTS_FP8, 2);
        if (st == CLMLA_SUCCESS) {
            int len = snprintf(detail, sizeof(detail), "K %d, in a decode step, on", nr.layers[0].rl.cfg.qk_nope_head_dim);
            int times = 0;
            size_t outs = 0;
            for (int l = 0; l < nr.nl && len > 0 && (size_t)len < sizeof(detail); l++) {
                len += snprintf(detail + len, sizeof(detail) - (size_t)len, "%s %s (%d heads, weights %s)", l ? "," : "",
                                nr.layers[l].name, nr.layers[l].rl.cfg.num_heads, s.quick ? "fp8" : l ? "fp8" : "bf16");
                times += nr.layers[l].batches;
                outs += (size_t)nr.layers[l].D;
            }
            if (len > 0 && (size_t)len < sizeof(detail))
                snprintf(detail + len, sizeof(detail) - (size_t)len, ": step times in us at batch 1%s",
                         nr.layers[0].batches > 1 ? " and 8" : "");
            st = stage_search(ctx, &s, &env, clmla_tuner_products_space(TUNE_PRODUCTS_NN), &nr, outs, times, detail, nn_measure,
                              &result->best, &result->nn_ratio);
        }
        for (int l = 0; l < 2; l++)
            nn_free(&nr.layers[l]);
    }
    clmla_context_set_product_tuning(ctx, NULL);
    return st;
}
