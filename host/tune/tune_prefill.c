/* clmla_tune_prefill: the decompressed path's attention tiles, their spaces and their measure in
   prefill steps of a layer with random weights (tuner.h). */
#include "tuner.h"
#include "attention.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LT(f) #f, offsetof(clmla_latent_tuning, f)

static int latent_valid(const void *t)
{
    return clmla_latent_tuning_check(t, NULL) == CLMLA_SUCCESS;
}

/* attn_prefill_rows (CPU devices): the queries of one work-item. */
static const tune_axis rows_fields[] = {{LT(prefill_rows_queries), 0, {0}}};
static const tune_block rows_blocks[] = {
    {TUNE_QUICK, 0, NULL, NULL, 1, {{LT(prefill_rows_queries), 2, {8, 32}}}},
    {TUNE_FULL, 0, NULL, NULL, 1, {{LT(prefill_rows_queries), 5, {8, 12, 24, 32, 48}}}},
};
static const tune_space rows_space = {"attn_prefill_rows", sizeof(clmla_latent_tuning), 0, rows_fields, 1,
                                      rows_blocks, 2, latent_valid, NULL, NULL, 0};

/* attn_prefill_tiled (other devices): attn_prefill (or the tiles, where the base turned them off),
   then the tiles. */
static int tiled_label(const void *c, char *buf, size_t size)
{
    const clmla_latent_tuning *t = c;
    if (t->prefill_tiled)
        return 0;
    snprintf(buf, size, "prefill_tiled=0 (attn_prefill)");
    return 1;
}

static const tune_axis tiled_fields[] = {{LT(prefill_queries), 0, {0}}, {LT(prefill_keys), 0, {0}},
                                         {LT(prefill_chunk), 0, {0}}, {LT(prefill_item_keys), 0, {0}}};
static const tune_block tiled_blocks[] = {
    {TUNE_BOTH, 0, NULL, NULL, 1, {{LT(prefill_tiled), 1, {TUNE_TOGGLE}}}},
    {TUNE_QUICK, 1, NULL, NULL, 4,
     {{LT(prefill_tiled), 2, {1, 1}}, {LT(prefill_queries), 2, {16, 64}}, {LT(prefill_keys), 2, {16, 64}},
      {LT(prefill_chunk), 2, {32, 128}}}},
    {TUNE_FULL, 0, NULL, NULL, 4,
     {{LT(prefill_tiled), 1, {1}}, {LT(prefill_queries), 3, {16, 32, 64}}, {LT(prefill_keys), 3, {16, 32, 64}},
      {LT(prefill_chunk), 3, {32, 64, 128}}}},
    /* more items a group in the same local memory: blocks of 16 or 32 queries, 1 or 2 keys an item */
    {TUNE_QUICK, 1, NULL, NULL, 3, {{LT(prefill_tiled), 2, {1, 1}}, {LT(prefill_queries), 2, {16, 32}},
                                    {LT(prefill_item_keys), 2, {1, 2}}}},
    {TUNE_FULL, 0, NULL, NULL, 3, {{LT(prefill_tiled), 1, {1}}, {LT(prefill_queries), 2, {16, 32}},
                                   {LT(prefill_item_keys), 3, {1, 2, 4}}}},
};
static const tune_space tiled_space = {"attn_prefill_tiled", sizeof(clmla_latent_tuning), 0, tiled_fields, 4,
                                       tiled_blocks, 5, latent_valid, tiled_label, NULL, 0};

const tune_space *clmla_tuner_prefill_space(int rows)
{
    return rows ? &rows_space : &tiled_space;
}

/* ---- the measure ------------------------------------------------------------------------------- */

enum { PF_FIRST = 23, PF_SECOND = 18, PF_CHECK = PF_FIRST + PF_SECOND };

typedef struct pf_run {
    clmla_context *ctx;
    clmla_tuner_random_layer rl;
    int D, reps;
    int prompt, prefix, chunk;     /* timed: prompt tokens alone; chunk tokens after prefix */
    cl_mem x, out;                 /* [x_rows, D] */
    clmla_cache *cache;
    int32_t seq_prompt, seq_chunk; /* seq_chunk holds the prefix between uses */
} pf_run;

static clmla_status pf_step(pf_run *r, clmla_layer *layer, int32_t seq, int row, int tokens)
{
    clmla_batch_entry e = {seq, tokens};
    const clmla_forward_args args = {&e, 1, 0, CLMLA_PATH_DECOMPRESSED};
    return clmla_layer_forward_cl(layer, r->cache, &args, r->x, (size_t)row * r->D, r->out, (size_t)row * r->D, NULL);
}

static clmla_status pf_finish(pf_run *r)
{
    const cl_int err = clFinish(r->ctx->queue);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(r->ctx, err, "clFinish");
}

/* The checked output: two chunks of one sequence (the second after the first, so that tiles cross
   both the prefix and the diagonal) through a layer built with the candidate; then the median
   microseconds of a prompt alone and of a chunk after the prefix (written once, at the first
   timing). */
static clmla_status pf_measure(void *state, const void *tuning, float *out, double *times)
{
    pf_run *r = state;
    clmla_layer *layer = NULL;
    int32_t check = -1;
    clmla_status st = clmla_context_set_latent_tuning(r->ctx, tuning);
    if (st == CLMLA_SUCCESS)
        st = clmla_layer_create(r->ctx, &r->rl.cfg, &r->rl.w, &layer);
    if (st == CLMLA_SUCCESS)
        st = clmla_cache_seq_add(r->cache, &check);
    if (st == CLMLA_SUCCESS)
        st = pf_step(r, layer, check, 0, PF_FIRST);
    if (st == CLMLA_SUCCESS)
        st = pf_step(r, layer, check, PF_FIRST, PF_SECOND);
    if (st == CLMLA_SUCCESS) {
        const cl_int err = clEnqueueReadBuffer(r->ctx->queue, r->out, CL_TRUE, 0, (size_t)PF_CHECK * r->D * sizeof(float),
                                               out, 0, NULL, NULL);
        if (err != CL_SUCCESS)
            st = clmla_fail_cl(r->ctx, err, "clEnqueueReadBuffer (tuning output)");
    }
    if (check >= 0)
        clmla_cache_seq_free(r->cache, check);
    int len = 0;
    if (st == CLMLA_SUCCESS && times)
        st = clmla_cache_seq_length(r->cache, r->seq_chunk, 0, &len);
    if (st == CLMLA_SUCCESS && times && len == 0) { /* the prefix, once: every candidate writes the same rows */
        st = pf_step(r, layer, r->seq_chunk, 0, r->prefix);
        if (st == CLMLA_SUCCESS)
            st = pf_finish(r);
    }
    for (int k = 0; k < 2 && st == CLMLA_SUCCESS && times; k++) {
        const int32_t seq = k ? r->seq_chunk : r->seq_prompt;
        const int keep = k ? r->prefix : 0;
        double tm[32];
        for (int i = -1; i < r->reps && st == CLMLA_SUCCESS; i++) { /* -1: a warm-up */
            const double t0 = clmla_tuner_now();
            st = pf_step(r, layer, seq, k ? r->prefix : 0, k ? r->chunk : r->prompt);
            if (st == CLMLA_SUCCESS)
                st = pf_finish(r);
            if (i >= 0)
                tm[i] = (clmla_tuner_now() - t0) * 1e6;
            if (st == CLMLA_SUCCESS)
                st = clmla_cache_seq_truncate(r->cache, seq, keep);
        }
        if (st == CLMLA_SUCCESS)
            times[k] = clmla_tuner_median(tm, r->reps);
    }
    clmla_layer_destroy(layer);
    return st;
}

/* The fields this search sets (both kernels'), copied from src into dst; the rest of dst stays. */
static void copy_prefill_fields(clmla_latent_tuning *dst, const clmla_latent_tuning *src)
{
    dst->prefill_tiled = src->prefill_tiled;
    dst->prefill_queries = src->prefill_queries;
    dst->prefill_keys = src->prefill_keys;
    dst->prefill_chunk = src->prefill_chunk;
    dst->prefill_item_keys = src->prefill_item_keys;
    dst->prefill_rows_queries = src->prefill_rows_queries;
}

clmla_status clmla_tune_prefill(clmla_context *ctx, const clmla_kernel_tune_options *options,
                                clmla_latent_tune_result *result)
{
    clmla_kernel_tune_options o;
    tune_settings s;
    int heads = 0, ctx_len = 0;
    clmla_status st = clmla_tuner_latent_start(ctx, "clmla_tune_prefill", result, options, 1, &o, &s, &heads, &ctx_len);
    if (st != CLMLA_SUCCESS)
        return st;
    if (o.from && clmla_latent_tuning_check(o.from, NULL) != CLMLA_SUCCESS) {
        const char *why = NULL;
        clmla_latent_tuning_check(o.from, &why);
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_tune_prefill: options->from: %s", why ? why : "illegal");
    }
    memset(result, 0, sizeof(*result));
    const int rows = clmla_attention_variant(ctx) == CLMLA_LATENT_ROWS;
    const tune_env env = {s.quick, heads, rows, CLMLA_CACHE_F32, ctx->info.max_work_group_size, &ctx->info};
    result->source = "defaults";
    clmla_latent_tuning_lookup(&ctx->info, heads, &result->base, &result->source); /* a bad user file: ignored */
    if (o.from) {
        result->base = *o.from;
        result->source = "options";
    }
    clmla_latent_tuning defaults, *cands = malloc(TUNE_MAX_CANDIDATES * sizeof(clmla_latent_tuning));
    if (!cands)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "clmla_tune_prefill: out of host memory");
    clmla_latent_tuning_defaults(&defaults);
    const tune_space *space = clmla_tuner_prefill_space(rows);
    const int most = s.max_candidates && s.max_candidates < TUNE_MAX_CANDIDATES ? s.max_candidates : TUNE_MAX_CANDIDATES;
    const int n = clmla_tuner_enumerate(space, &env, &result->base, &defaults, cands, most);
    /* the reference: the defaults' prefill parameters, the rest as the base */
    clmla_latent_tuning reference = result->base;
    copy_prefill_fields(&reference, &defaults);

    pf_run r = {.ctx = ctx, .reps = s.reps, .prompt = s.quick ? 80 : (ctx_len < 2048 ? ctx_len : 2048),
                .prefix = s.quick ? 100 : ctx_len, .chunk = s.quick ? 40 : 512};
    r.seq_prompt = r.seq_chunk = -1;
    int x_rows = r.prompt > r.prefix + r.chunk ? r.prompt : r.prefix + r.chunk;
    x_rows = x_rows > PF_CHECK ? x_rows : PF_CHECK;
    const clmla_preset preset = heads == 16 ? CLMLA_PRESET_DEEPSEEK_V2_LITE : CLMLA_PRESET_DEEPSEEK_V3;
    uint64_t rng = 0x9E3779B97F4A7C15ULL + (uint64_t)preset;
    st = clmla_tuner_random_layer_make(ctx, &r.rl, preset, heads == 16 ? CLMLA_WEIGHTS_BF16 : CLMLA_WEIGHTS_FP8, &rng);
    float *h_x = NULL;
    if (st == CLMLA_SUCCESS) {
        r.D = r.rl.cfg.hidden_size;
        h_x = clmla_tuner_random_floats((size_t)x_rows * r.D, 1.0f, 0, &rng);
        if (!h_x)
            st = clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "clmla_tune_prefill: out of host memory for the inputs");
    }
    if (st == CLMLA_SUCCESS) {
        cl_int err = CL_SUCCESS;
        const size_t bytes = (size_t)x_rows * r.D * sizeof(float);
        r.x = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, h_x, &err);
        if (err == CL_SUCCESS)
            r.out = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
        if (err != CL_SUCCESS)
            st = clmla_fail_cl(ctx, err, "clCreateBuffer (prefill tuning rows)");
    }
    free(h_x);
    if (st == CLMLA_SUCCESS) {
        const int bt = 64;
        const int blocks = (PF_CHECK + bt - 1) / bt + (r.prompt + bt - 1) / bt + (r.prefix + r.chunk + bt - 1) / bt +
                           CLMLA_WARMUP_TOKENS / bt + 4;
        const clmla_cache_config cc = {1, r.rl.cfg.kv_lora_rank, r.rl.cfg.qk_rope_head_dim, bt, blocks, CLMLA_CACHE_F32, 0,
                                       CLMLA_CACHE_F32};
        st = clmla_cache_create(ctx, &cc, &r.cache);
        if (st == CLMLA_SUCCESS)
            st = clmla_cache_seq_add(r.cache, &r.seq_prompt);
        if (st == CLMLA_SUCCESS)
            st = clmla_cache_seq_add(r.cache, &r.seq_chunk);
    }
    if (st == CLMLA_SUCCESS) {
        static const char *names[] = {"prompt", "chunk"};
        char detail[512];
        snprintf(detail, sizeof(detail),
                 "a random %s layer (%d heads, weights %s), the decompressed path, a prompt of %d tokens and %d after "
                 "%d; whole steps",
                 heads == 16 ? "V2-Lite" : "V3", heads, heads == 16 ? "bf16" : "fp8", r.prompt, r.chunk, r.prefix);
        const tune_family f = {space, &r, (size_t)PF_CHECK * r.D, 2, names, 1e-4, 3, detail, pf_measure};
        tune_outcome out;
        st = clmla_tuner_search(ctx, &f, &s, &reference, cands, n, &out);
        if (st == CLMLA_SUCCESS) {
            const clmla_latent_tuning *b = &cands[out.best];
            result->best = result->base;
            copy_prefill_fields(&result->best, b);
            result->candidates = out.candidates;
            result->timed = out.timed;
            result->ratio = out.ratio;
            memcpy(result->best_us, out.best_times, sizeof(result->best_us));
            memcpy(result->base_us, out.base_times, sizeof(result->base_us));
        }
    }
    clmla_cache_destroy(r.cache);
    clmla_release_mem(r.x);
    clmla_release_mem(r.out);
    clmla_tuner_random_layer_free(&r.rl);
    free(cands);
    clmla_context_set_latent_tuning(ctx, NULL);
    return st;
}
