/* clmla_tune_latent: the latent attention kernel's parameter spaces and its measure (tuner.h). */
#include "tuner.h"
#include "attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LT(f) #f, offsetof(clmla_latent_tuning, f)

static int latent_valid(const void *t)
{
    return clmla_latent_tuning_check(t, NULL) == CLMLA_SUCCESS;
}

static int is_nvidia(const tune_env *env)
{
    return strstr(env->info->vendor, "NVIDIA") != NULL;
}

static int is_f16(const tune_env *env)
{
    return env->dtype == CLMLA_CACHE_F16;
}

/* attn_latent_lanes with two vectors takes 32 heads or more */
static int lanes_fit(const void *c, const tune_env *env)
{
    return ((const clmla_latent_tuning *)c)->rows_lanes < 2 || env->heads >= 32;
}

/* a work-group of group_max_items items within the device's largest */
static int group_fits(const void *c, const tune_env *env)
{
    return env->max_work_group == 0 || (size_t)((const clmla_latent_tuning *)c)->group_max_items <= env->max_work_group;
}

/* The row kernels (CPU devices): attn_latent_rows's grid, then attn_latent_lanes. */
static const tune_axis rows_fields[] = {{LT(rows_heads), 0, {0}}, {LT(rows_keys), 0, {0}},
                                        {LT(rows_groups_per_cu), 0, {0}}, {LT(rows_lanes), 0, {0}}};
static const tune_block rows_blocks[] = {
    {TUNE_QUICK_FILL, 0, NULL, NULL, 4,
     {{LT(rows_lanes), 1, {0}}, {LT(rows_heads), 2, {8, 16}}, {LT(rows_keys), 3, {4, 8, 16}},
      {LT(rows_groups_per_cu), 3, {2, 4, 8}}}},
    {TUNE_FULL, 0, NULL, lanes_fit, 4,
     {{LT(rows_lanes), 2, {1, 2}}, {LT(rows_heads), 1, {TUNE_DEFAULT}}, {LT(rows_keys), 2, {8, 16}},
      {LT(rows_groups_per_cu), 3, {2, 4, 8}}}},
    {TUNE_QUICK, 0, NULL, NULL, 1, {{LT(rows_lanes), 1, {TUNE_TOGGLE}}}},
};
static const tune_space rows_space = {"attn_latent_rows / attn_latent_lanes", sizeof(clmla_latent_tuning), 1,
                                      rows_fields, 4, rows_blocks, 3, latent_valid, NULL, NULL, 0};

/* The work-group kernel over f32 caches: the query layout, the grid in both layouts, smaller
   splits, shared dot products, and on NVIDIA GPUs the tensor-core kernel. */
static const tune_axis group_fields[] = {{LT(group_heads), 0, {0}},          {LT(group_keys), 0, {0}},
                                         {LT(group_max_items), 0, {0}},      {LT(group_groups_per_cu), 0, {0}},
                                         {LT(group_query_layout), 0, {0}},   {LT(group_min_split_keys), 0, {0}},
                                         {LT(group_row_slices), 0, {0}}};
static const tune_block group_blocks[] = {
    {TUNE_BOTH, 0, NULL, NULL, 1, {{LT(group_query_layout), 1, {1}}}},
    {TUNE_FULL, 0, NULL, group_fits, 5,
     {{LT(group_query_layout), 2, {0, 1}}, {LT(group_heads), 2, {8, 16}}, {LT(group_keys), 3, {2, 4, 8}},
      {LT(group_max_items), 3, {64, 128, 256}}, {LT(group_groups_per_cu), 2, {4, 8}}}},
    {TUNE_FULL, 0, NULL, NULL, 1, {{LT(group_min_split_keys), 2, {32, 64}}}},
    {TUNE_FULL, 0, NULL, NULL, 2, {{LT(group_row_slices), 2, {2, 4}}, {LT(group_min_split_keys), 3, {TUNE_BASE, 32, 64}}}},
    {TUNE_BOTH, 0, is_nvidia, NULL, 1, {{LT(group_mma), 1, {TUNE_TOGGLE}}}},
};
static const tune_space group_space = {"attn_latent", sizeof(clmla_latent_tuning), 1, group_fields, 7,
                                       group_blocks, 5, latent_valid, NULL, NULL, 0};

/* The work-group kernel over decoded caches (f16, bf16, fp8): heads an item, whole-vector row loads
   (and, over f16, ushort4 loads), the tensor-core kernel on NVIDIA GPUs; the rest as in force. */
static const tune_axis decoded_fields[] = {{LT(group_decode_heads), 0, {0}}, {LT(group_aligned), 0, {0}},
                                           {LT(group_mma), 0, {0}}};
static const tune_block decoded_blocks[] = {
    {TUNE_QUICK_FILL, 0, NULL, NULL, 1, {{LT(group_decode_heads), 3, {16, 8, 4}}}},
    {TUNE_QUICK, 0, NULL, NULL, 1, {{LT(group_aligned), 1, {TUNE_TOGGLE}}}},
    {TUNE_QUICK, 0, is_f16, NULL, 1, {{LT(group_aligned), 1, {2}}}},
    {TUNE_FULL, 0, NULL, NULL, 2, {{LT(group_aligned), 1, {TUNE_TOGGLE}}, {LT(group_decode_heads), 3, {16, 8, 4}}}},
    {TUNE_FULL, 0, is_f16, NULL, 2, {{LT(group_aligned), 1, {2}}, {LT(group_decode_heads), 3, {16, 8, 4}}}},
    {TUNE_BOTH, 0, is_nvidia, NULL, 1, {{LT(group_mma), 1, {TUNE_TOGGLE}}}},
};
static const tune_space decoded_space = {"attn_latent", sizeof(clmla_latent_tuning), 0, decoded_fields, 3,
                                         decoded_blocks, 6, latent_valid, NULL, NULL, 0};

const tune_space *clmla_tuner_latent_space(int rows, clmla_cache_dtype dtype)
{
    return dtype != CLMLA_CACHE_F32 ? &decoded_space : rows ? &rows_space : &group_space;
}

/* ---- the measure ------------------------------------------------------------------------------- */

#define LT_MAX_SEQS 8

typedef struct lt_run {
    clmla_context *ctx;
    int heads, rkv, dr, bt, ctx_len, reps;
    clmla_cache_dtype dtype;
    cl_mem ckv, kr; /* ctx_len random rows */
} lt_run;

/* A cache of `seqs` sequences of lengths len[], each holding the first rows of the run's, and the
   arguments of one call with token t attending to sequence t. */
typedef struct lt_case {
    clmla_cache *cache;
    cl_mem table, seq, clen, ql, qr, out;
    clmla_latent_attention_args a;
} lt_case;

static void lt_case_free(lt_case *c)
{
    cl_mem *m[] = {&c->table, &c->seq, &c->clen, &c->ql, &c->qr, &c->out};
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
        clmla_release_mem(*m[i]);
    clmla_cache_destroy(c->cache);
    memset(c, 0, sizeof(*c));
}

static cl_mem lt_buffer(clmla_context *ctx, size_t bytes, const void *host, clmla_status *st)
{
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0), bytes, (void *)host, &err);
    if (err != CL_SUCCESS && *st == CLMLA_SUCCESS)
        *st = clmla_fail_cl(ctx, err, "clCreateBuffer (tuning case)");
    return err == CL_SUCCESS ? m : NULL;
}

static clmla_status lt_case_make(lt_run *r, lt_case *c, int seqs, const int *len)
{
    memset(c, 0, sizeof(*c));
    int max_len = 0;
    for (int s = 0; s < seqs; s++)
        max_len = len[s] > max_len ? len[s] : max_len;
    const int per_seq = (max_len + r->bt - 1) / r->bt;
    clmla_cache_config cfg = {1, r->rkv, r->dr, r->bt, seqs * per_seq, r->dtype, 0, CLMLA_CACHE_F32};
    clmla_status st = clmla_cache_create(r->ctx, &cfg, &c->cache);
    if (st != CLMLA_SUCCESS)
        return st;
    const size_t nq = (size_t)seqs * r->heads;
    int32_t *table = calloc((size_t)seqs * per_seq, sizeof(int32_t));
    int32_t tseq[LT_MAX_SEQS];
    float *ql = malloc(nq * r->rkv * sizeof(float)), *qr = malloc(nq * r->dr * sizeof(float));
    if (!table || !ql || !qr)
        st = clmla_fail(r->ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory for a tuning case");
    for (int s = 0; st == CLMLA_SUCCESS && s < seqs; s++) {
        int32_t id = 0, nb = 0;
        st = clmla_cache_seq_add(c->cache, &id);
        if (st == CLMLA_SUCCESS)
            st = clmla_cache_append_cl(c->cache, 0, id, len[s], r->ckv, 0, r->rkv, r->kr, 0, r->dr, NULL);
        if (st == CLMLA_SUCCESS)
            st = clmla_cache_seq_blocks(c->cache, id, table + (size_t)s * per_seq, per_seq, &nb);
        tseq[s] = s;
    }
    uint32_t seed = 777;
    for (size_t i = 0; st == CLMLA_SUCCESS && i < nq * r->rkv; i++)
        ql[i] = clmla_tuner_rand(&seed);
    for (size_t i = 0; st == CLMLA_SUCCESS && i < nq * r->dr; i++)
        qr[i] = clmla_tuner_rand(&seed);
    if (st == CLMLA_SUCCESS) {
        c->table = lt_buffer(r->ctx, (size_t)seqs * per_seq * sizeof(int32_t), table, &st);
        c->seq = lt_buffer(r->ctx, (size_t)seqs * sizeof(int32_t), tseq, &st);
        c->clen = lt_buffer(r->ctx, (size_t)seqs * sizeof(int32_t), len, &st);
        c->ql = lt_buffer(r->ctx, nq * r->rkv * sizeof(float), ql, &st);
        c->qr = lt_buffer(r->ctx, nq * r->dr * sizeof(float), qr, &st);
        c->out = lt_buffer(r->ctx, nq * r->rkv * sizeof(float), NULL, &st);
    }
    free(table);
    free(ql);
    free(qr);
    if (st != CLMLA_SUCCESS) {
        lt_case_free(c);
        return st;
    }
    clmla_latent_attention_args *a = &c->a;
    memset(a, 0, sizeof(*a));
    a->num_tokens = seqs;
    a->num_heads = r->heads;
    a->softmax_scale = 1.0f / sqrtf((float)(r->rkv + r->dr));
    a->q_latent = c->ql;
    a->q_rope = c->qr;
    a->block_table = c->table;
    a->max_blocks_per_seq = per_seq;
    a->token_seq = c->seq;
    a->token_ctx_len = c->clen;
    a->max_ctx_len = max_len;
    a->out = c->out;
    return CLMLA_SUCCESS;
}

/* Median microseconds of reps calls with the first `tokens` tokens of the case (after a warm-up). */
static clmla_status lt_time(lt_run *r, lt_case *c, int tokens, double *us)
{
    clmla_latent_attention_args a = c->a;
    a.num_tokens = tokens;
    double t[32];
    for (int i = -1; i < r->reps; i++) {
        const double t0 = clmla_tuner_now();
        clmla_status st = clmla_attention_latent(c->cache, 0, &a, NULL);
        if (st != CLMLA_SUCCESS)
            return st;
        const cl_int err = clFinish(r->ctx->queue);
        if (err != CL_SUCCESS)
            return clmla_fail_cl(r->ctx, err, "clFinish");
        if (i >= 0)
            t[i] = (clmla_tuner_now() - t0) * 1e6;
    }
    *us = clmla_tuner_median(t, r->reps);
    return CLMLA_SUCCESS;
}

enum { LT_CHECK_SEQS = 2 };

static void check_lengths(const lt_run *r, int *len)
{
    len[0] = r->ctx_len < 300 ? r->ctx_len : 300;
    len[1] = 77;
}

/* The checked output: two sequences (of 300 and 77 keys) attended by every head; then batch 1 and
   batch 8 over ctx_len keys each. */
static clmla_status lt_measure(void *state, const void *tuning, float *out, double *times)
{
    lt_run *r = state;
    clmla_status st = clmla_context_set_latent_tuning(r->ctx, tuning);
    if (st != CLMLA_SUCCESS)
        return st;
    int len[LT_CHECK_SEQS];
    check_lengths(r, len);
    lt_case c;
    st = lt_case_make(r, &c, LT_CHECK_SEQS, len);
    if (st != CLMLA_SUCCESS)
        return st;
    st = clmla_attention_latent(c.cache, 0, &c.a, NULL);
    if (st == CLMLA_SUCCESS) {
        const cl_int err = clEnqueueReadBuffer(r->ctx->queue, c.out, CL_TRUE, 0,
                                               (size_t)LT_CHECK_SEQS * r->heads * r->rkv * sizeof(float), out, 0, NULL, NULL);
        if (err != CL_SUCCESS)
            st = clmla_fail_cl(r->ctx, err, "clEnqueueReadBuffer (tuning output)");
    }
    lt_case_free(&c);
    if (st != CLMLA_SUCCESS || !times)
        return st;
    int tlen[LT_MAX_SEQS];
    for (int i = 0; i < LT_MAX_SEQS; i++)
        tlen[i] = r->ctx_len;
    st = lt_case_make(r, &c, LT_MAX_SEQS, tlen);
    if (st != CLMLA_SUCCESS)
        return st;
    st = lt_time(r, &c, 1, &times[0]);
    if (st == CLMLA_SUCCESS)
        st = lt_time(r, &c, LT_MAX_SEQS, &times[1]);
    lt_case_free(&c);
    return st;
}

clmla_status clmla_tune_latent(clmla_context *ctx, const clmla_kernel_tune_options *options,
                               clmla_latent_tune_result *result)
{
    clmla_kernel_tune_options o;
    tune_settings s;
    int heads = 0, ctx_len = 0;
    clmla_status st = clmla_tuner_latent_start(ctx, "clmla_tune_latent", result, options, 0, &o, &s, &heads, &ctx_len);
    if (st != CLMLA_SUCCESS)
        return st;
    if ((int)o.cache_dtype < (int)CLMLA_CACHE_F32 || (int)o.cache_dtype > (int)CLMLA_CACHE_FP8)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_tune_latent: options->cache_dtype %d is not a cache dtype",
                          (int)o.cache_dtype);
    const int rows = clmla_attention_variant(ctx) == CLMLA_LATENT_ROWS;
    if (o.cache_dtype != CLMLA_CACHE_F32 && rows)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_tune_latent: options->cache_dtype other than f32 tunes attn_latent's parameters for "
                          "decoded caches; this context runs the row kernels, attn_latent_rows and attn_latent_lanes "
                          "(attention_kernels \"group\" runs the other)");
    memset(result, 0, sizeof(*result));
    const tune_env env = {s.quick, heads, rows, o.cache_dtype, ctx->info.max_work_group_size, &ctx->info};
    clmla_latent_tuning defaults, *cands = malloc(TUNE_MAX_CANDIDATES * sizeof(clmla_latent_tuning));
    if (!cands)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "clmla_tune_latent: out of host memory");
    clmla_latent_tuning_defaults(&defaults);
    result->source = "defaults";
    clmla_latent_tuning_lookup(&ctx->info, heads, &result->base, &result->source); /* a bad user file: ignored */
    const tune_space *space = clmla_tuner_latent_space(rows, o.cache_dtype);
    const int most = s.max_candidates && s.max_candidates < TUNE_MAX_CANDIDATES ? s.max_candidates : TUNE_MAX_CANDIDATES;
    const int n = clmla_tuner_enumerate(space, &env, &result->base, &defaults, cands, most);

    lt_run r = {ctx, heads, 512, 64, 64, s.quick ? 512 : ctx_len, s.reps, o.cache_dtype, NULL, NULL};
    const size_t nrows = (size_t)r.ctx_len;
    float *ckv = malloc(nrows * r.rkv * sizeof(float)), *kr = malloc(nrows * r.dr * sizeof(float));
    if (!ckv || !kr)
        st = clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "clmla_tune_latent: out of host memory for the cache rows");
    uint32_t seed = 4242;
    for (size_t i = 0; st == CLMLA_SUCCESS && i < nrows * r.rkv; i++)
        ckv[i] = clmla_tuner_rand(&seed);
    for (size_t i = 0; st == CLMLA_SUCCESS && i < nrows * r.dr; i++)
        kr[i] = clmla_tuner_rand(&seed);
    if (st == CLMLA_SUCCESS) {
        r.ckv = lt_buffer(ctx, nrows * r.rkv * sizeof(float), ckv, &st);
        r.kr = lt_buffer(ctx, nrows * r.dr * sizeof(float), kr, &st);
    }
    free(ckv);
    free(kr);
    if (st == CLMLA_SUCCESS) {
        static const char *names[] = {"batch 1", "batch 8"};
        char detail[512];
        snprintf(detail, sizeof(detail), "%d heads, rkv %d, dr %d, %s cache, ctx %d, batch 1 and 8", heads, r.rkv, r.dr,
                 o.cache_dtype == CLMLA_CACHE_F32   ? "f32"
                 : o.cache_dtype == CLMLA_CACHE_F16 ? "f16"
                 : o.cache_dtype == CLMLA_CACHE_BF16 ? "bf16"
                                                     : "fp8",
                 r.ctx_len);
        const tune_family f = {space,
                               &r,
                               (size_t)LT_CHECK_SEQS * heads * r.rkv,
                               2,
                               names,
                               o.cache_dtype == CLMLA_CACHE_F32 ? 1e-4 : 1e-3,
                               3,
                               detail,
                               lt_measure};
        tune_outcome out;
        st = clmla_tuner_search(ctx, &f, &s, &defaults, cands, n, &out);
        if (st == CLMLA_SUCCESS) {
            result->best = cands[out.best];
            result->candidates = out.candidates;
            result->timed = out.timed;
            result->ratio = out.ratio;
            memcpy(result->best_us, out.best_times, sizeof(result->best_us));
            memcpy(result->base_us, out.base_times, sizeof(result->base_us));
        }
    }
    clmla_release_mem(r.ckv);
    clmla_release_mem(r.kr);
    free(cands);
    clmla_context_set_latent_tuning(ctx, NULL);
    return st;
}
