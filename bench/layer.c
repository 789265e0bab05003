/* Phases "layer" and "prefill": one whole attention layer with random weights (clmla_layer_create,
 * like `clmla demo`), through clmla_layer_forward_cl on device buffers.
 *
 *   layer    a decode step: each of `batch` sequences, holding ctx tokens, gets one new token:
 *            projections, RMSNorm, RoPE, cache write, attention over ctx+1 keys, o_proj.
 *            The cache is filled with random latent rows (the attention does not care where they
 *            came from); each timed step appends a token, and the sequences are refilled to ctx
 *            between samples once they have grown by more than max(16, ctx/32) tokens, so the
 *            context stays within 3% of ctx (16 tokens for short contexts).
 *   prefill  `batch` fresh sequences of ctx prompt tokens each in one step: the sequences are freed
 *            and added again, untimed, before every call. With --prefix P each sequence is first
 *            filled, untimed, with P random rows, and the ctx tokens are a chunk after them (chunked
 *            prefill: P + ctx keys, each new token seeing the prefix and the chunk up to itself).
 * The float32 random weights are given to the layer with config.weights_dtype set to the row's
 * weights dtype: the library converts them once at creation and keeps them in it. */
#include "bench.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STEPS_PER_SAMPLE 16

typedef struct layer_state {
    bench_device *dev;
    const bench_shape *s;
    int batch, ctx, prefill, prefix, slack;
    clmla_layer *layer;
    clmla_cache *cache;
    int32_t *seq_ids;             /* [batch] */
    clmla_batch_entry *entries;   /* [batch] */
    clmla_forward_args args;
    cl_mem x, out, staging;       /* x, out [tokens, D]; staging [min(rows held, 8192), rkv + dr] */
    int grown;                    /* tokens appended since the last refill (layer) */
} layer_state;

/* Uniform in [-scale, scale) + bias from a 64-bit LCG. */
static float *random_floats(size_t n, float scale, float bias, uint64_t *state)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; p && i < n; i++) {
        *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = bias + scale * ((float)(*state >> 40) * (2.0f / 16777216.0f) - 1.0f);
    }
    return p;
}

/* The layer setting that keeps float32 weights in `dtype`. */
static clmla_weights_dtype weights_setting(clmla_dtype dtype)
{
    switch (dtype) {
    case CLMLA_DTYPE_F16:
        return CLMLA_WEIGHTS_F16;
    case CLMLA_DTYPE_BF16:
        return CLMLA_WEIGHTS_BF16;
    case CLMLA_DTYPE_FP8_E4M3:
        return CLMLA_WEIGHTS_FP8;
    default:
        return CLMLA_WEIGHTS_F32;
    }
}

void bench_layer_weights_free(bench_layer_weights *bw)
{
    for (int i = 0; i < BENCH_LAYER_ARRAYS; i++) {
        free(bw->arrays[i]);
        bw->arrays[i] = NULL;
    }
}

int bench_layer_weights_make(const bench_shape *s, unsigned seed, clmla_dtype weights, bench_layer_weights *bw)
{
    memset(bw, 0, sizeof(*bw));
    bw->config = s->config;
    bw->config.weights_dtype = weights_setting(weights);
    uint64_t rng = (uint64_t)seed * 0x9E3779B97F4A7C15ULL + 1;
    const float in_d = 1.0f / sqrtf((float)s->D);
    float **a = bw->arrays; /* q_a, q_a_norm, q_b, q, kv_a, kv_norm, kv_b, o */
    if (s->rq > 0) {
        a[0] = random_floats((size_t)s->rq * s->D, in_d, 0, &rng);
        a[1] = random_floats((size_t)s->rq, 0.1f, 1.0f, &rng);
        a[2] = random_floats((size_t)s->H * s->dq * s->rq, 1.0f / sqrtf((float)s->rq), 0, &rng);
    } else {
        a[3] = random_floats((size_t)s->H * s->dq * s->D, in_d, 0, &rng);
    }
    a[4] = random_floats((size_t)s->row * s->D, in_d, 0, &rng);
    a[5] = random_floats((size_t)s->rkv, 0.1f, 1.0f, &rng);
    a[6] = random_floats((size_t)s->H * (s->dn + s->dv) * s->rkv, 1.0f / sqrtf((float)s->rkv), 0, &rng);
    a[7] = random_floats((size_t)s->D * s->H * s->dv, 1.0f / sqrtf((float)(s->H * s->dv)), 0, &rng);
    if (!a[4] || !a[5] || !a[6] || !a[7] || (s->rq > 0 ? !a[0] || !a[1] || !a[2] : !a[3])) {
        bench_layer_weights_free(bw);
        fprintf(stderr, "clmla-bench: out of host memory for the weights\n");
        return 1;
    }
    clmla_layer_weights *w = &bw->weights;
    if (s->rq > 0) {
        w->q_a_proj = clmla_tensor_2d(a[0], s->rq, s->D);
        w->q_a_layernorm = clmla_tensor_1d(a[1], s->rq);
        w->q_b_proj = clmla_tensor_2d(a[2], (int64_t)s->H * s->dq, s->rq);
    } else {
        w->q_proj = clmla_tensor_2d(a[3], (int64_t)s->H * s->dq, s->D);
    }
    w->kv_a_proj_with_mqa = clmla_tensor_2d(a[4], s->row, s->D);
    w->kv_a_layernorm = clmla_tensor_1d(a[5], s->rkv);
    w->kv_b_proj = clmla_tensor_2d(a[6], (int64_t)s->H * (s->dn + s->dv), s->rkv);
    w->o_proj = clmla_tensor_2d(a[7], s->D, (int64_t)s->H * s->dv);
    return 0;
}

static int create_layer(layer_state *st, unsigned seed, clmla_dtype weights)
{
    bench_layer_weights bw;
    if (bench_layer_weights_make(st->s, seed, weights, &bw))
        return 1;
    const int rc = clmla_layer_create(st->dev->ctx, &bw.config, &bw.weights, &st->layer) != CLMLA_SUCCESS;
    if (rc)
        fprintf(stderr, "clmla-bench: %s\n", clmla_last_error(st->dev->ctx));
    bench_layer_weights_free(&bw);
    return rc;
}

static int fail(layer_state *st)
{
    fprintf(stderr, "clmla-bench: %s\n", clmla_last_error(st->dev->ctx));
    return 1;
}

/* The random rows a sequence holds before a timed call: ctx (layer) or the prefix (prefill). */
static int rows_held(const layer_state *st)
{
    return st->prefill ? st->prefix : st->ctx;
}

/* Frees the sequences and adds them again, filled with their random rows. */
static int refill(layer_state *st)
{
    const int reserve = st->prefill ? st->prefix + st->ctx : st->ctx + st->slack + MAX_STEPS_PER_SAMPLE;
    const int held = rows_held(st), chunk = held < 8192 ? held : 8192;
    for (int b = 0; b < st->batch; b++) {
        if (st->seq_ids[b] >= 0 && clmla_cache_seq_free(st->cache, st->seq_ids[b]) != CLMLA_SUCCESS)
            return fail(st);
        st->seq_ids[b] = -1;
    }
    for (int b = 0; b < st->batch; b++) {
        if (clmla_cache_seq_add(st->cache, &st->seq_ids[b]) != CLMLA_SUCCESS ||
            clmla_cache_seq_reserve(st->cache, st->seq_ids[b], reserve) != CLMLA_SUCCESS)
            return fail(st);
        st->entries[b].seq_id = st->seq_ids[b];
        st->entries[b].num_tokens = st->prefill ? st->ctx : 1;
        for (int t = 0; t < held; t += chunk) {
            const int n = held - t < chunk ? held - t : chunk;
            if (clmla_cache_append_cl(st->cache, 0, st->seq_ids[b], n, st->staging, 0, st->s->row, st->staging,
                                      (size_t)st->s->rkv, st->s->row, NULL) != CLMLA_SUCCESS)
                return fail(st);
        }
    }
    st->grown = 0;
    return 0;
}

static int layer_reset(void *user)
{
    layer_state *st = user;
    return st->prefill || st->grown > st->slack ? refill(st) : 0;
}

static int layer_enqueue(void *user, cl_event *last)
{
    layer_state *st = user;
    if (clmla_layer_forward_cl(st->layer, st->cache, &st->args, st->x, 0, st->out, 0, last) != CLMLA_SUCCESS)
        return fail(st);
    st->grown++;
    return 0;
}

/* Device memory of the row: weights, cache, the library's scratch for `tokens` tokens in a step
   (projections, absorbed or decompressed attention), x and out. */
static double layer_memory(const bench_shape *s, int batch, int ctx_blocks, int tokens, int ctx, int decompressed,
                           size_t elem)
{
    const double T = tokens, H = s->H;
    double scratch = T * (H * s->dq + s->row + H * s->dv + s->rq) * 4.0;
    if (decompressed)
        scratch += (double)ctx * (s->row + H * (s->dn + s->dv)) * 4.0;
    else
        scratch += 2.0 * T * H * s->rkv * 4.0;
    return bench_weight_bytes(s) + (double)batch * ctx_blocks * s->row * elem + scratch + 2.0 * T * s->D * 4.0;
}

int bench_layer(const bench_case *c, bench_row *row)
{
    const bench_shape *s = c->shape;
    bench_device *dev = c->dev;
    const int prefill = strcmp(c->phase, "prefill") == 0, B = c->batch, ctx = c->ctx;
    const size_t elem = c->dtype == CLMLA_CACHE_F32 ? 4 : 2;
    clmla_attention_path path;
    if (strcmp(c->path, "absorbed") == 0)
        path = CLMLA_PATH_ABSORBED;
    else if (strcmp(c->path, "decompressed") == 0)
        path = CLMLA_PATH_DECOMPRESSED;
    else if (strcmp(c->path, "auto") == 0)
        path = CLMLA_PATH_AUTO;
    else {
        snprintf(row->note, sizeof(row->note), "the %s phase runs the library's paths (absorbed, decompressed, auto), not %s",
                 c->phase, c->path);
        return -1;
    }
    const int step_tokens = prefill ? ctx : 1;
    const int slack = ctx / 32 > 16 ? ctx / 32 : 16;
    const int prefix = prefill ? c->prefix : 0;
    const int keys = prefill ? prefix + ctx : ctx + 1;
    const int cache_tokens = prefill ? prefix + ctx : ctx + slack + MAX_STEPS_PER_SAMPLE;
    const int blocks_per_seq = (cache_tokens + c->block_tokens - 1) / c->block_tokens;

    layer_state st = {.dev = dev, .s = s, .batch = B, .ctx = ctx, .prefill = prefill, .prefix = prefix, .slack = slack};
    /* The path auto picks is known only once the layer exists (its threshold); size the check for
       the costlier one. */
    const double memory = layer_memory(s, B, blocks_per_seq * c->block_tokens, B * step_tokens, keys,
                                       path != CLMLA_PATH_ABSORBED, elem);
    if (memory > (double)dev->memory_budget) {
        snprintf(row->note, sizeof(row->note), "needs about %.0f MiB, more than the %.0f MiB budget (--max-mem)",
                 memory / 1048576.0, dev->memory_budget / 1048576.0);
        return -1;
    }

    int rc = create_layer(&st, c->seed, c->weights);
    int decompressed = path == CLMLA_PATH_DECOMPRESSED;
    if (!rc && path == CLMLA_PATH_AUTO) {
        clmla_attention_path chosen = CLMLA_PATH_AUTO;
        rc = clmla_layer_auto_path(st.layer, keys - step_tokens, step_tokens, &chosen) != CLMLA_SUCCESS;
        decompressed = chosen == CLMLA_PATH_DECOMPRESSED;
        snprintf(row->note, sizeof(row->note), "path auto");
    }
    snprintf(row->path, sizeof(row->path), "%s", decompressed ? "decompressed" : "absorbed");

    if (!rc) {
        clmla_cache_config cc = {1, s->rkv, s->dr, c->block_tokens, B * blocks_per_seq, c->dtype, 0, CLMLA_CACHE_F32};
        rc = clmla_cache_create(dev->ctx, &cc, &st.cache) != CLMLA_SUCCESS;
        if (rc)
            fail(&st);
    }
    const size_t x_values = (size_t)B * step_tokens * s->D;
    st.seq_ids = malloc((size_t)B * sizeof(int32_t));
    st.entries = malloc((size_t)B * sizeof(clmla_batch_entry));
    if (!rc) {
        rc = !st.seq_ids || !st.entries;
        for (int b = 0; !rc && b < B; b++)
            st.seq_ids[b] = -1;
        st.x = rc ? NULL : bench_buffer(dev, x_values * sizeof(float), "hidden states");
        st.out = st.x ? bench_buffer(dev, x_values * sizeof(float), "layer output") : NULL;
        rc = rc || !st.x || !st.out || bench_fill(dev, st.x, x_values, 0, c->seed + 11, 1.0f);
        if (!rc && rows_held(&st) > 0) {
            const int chunk = rows_held(&st) < 8192 ? rows_held(&st) : 8192;
            st.staging = bench_buffer(dev, (size_t)chunk * s->row * sizeof(float), "cache staging rows");
            rc = !st.staging || bench_fill(dev, st.staging, (size_t)chunk * s->row, 0, c->seed + 12, 1.0f);
        }
        rc = rc || refill(&st);
    }
    st.args.entries = st.entries;
    st.args.num_entries = B;
    st.args.cache_layer = 0;
    st.args.path = path;

    row->prefix = prefix;
    row->tokens = (double)B * step_tokens;
    row->cache_bytes = bench_mla_cache_bytes(s, B, keys, c->dtype);
    row->mha_cache_bytes = bench_mha_cache_bytes(s, B, keys, elem);
    /* causal (query, key) pairs: a prefill token sees the prefix and the chunk up to itself */
    const double pairs = prefill ? (double)ctx * prefix + (double)ctx * (ctx + 1) / 2 : (double)keys;
    row->flops = (double)B * (step_tokens * bench_projection_flops(s, !decompressed) +
                              pairs * bench_pair_flops(s, !decompressed) +
                              (decompressed ? keys * bench_upproject_flops(s) : 0));
    /* Weights once, as the layer stores them (its own count: the dtype, FP8's scales; not the RoPE
       table, of which a step reads only its positions' rows), the cache read by the attention and
       the new row written (decode) or the rows written (prefill), as the cache stores them, x and out. */
    clmla_layer_memory lm;
    memset(&lm, 0, sizeof(lm));
    if (!rc && clmla_layer_get_memory(st.layer, &lm) != CLMLA_SUCCESS)
        rc = fail(&st);
    row->weight_bytes = (double)(lm.total - lm.rope_table);
    row->bytes = row->weight_bytes + bench_mla_cache_bytes(s, B, prefill ? keys : keys + 1, c->dtype) +
                 2.0 * x_values * sizeof(float);
    row->check_error = -1;

    bench_op op = {layer_enqueue, layer_reset, &st, prefill ? 1 : MAX_STEPS_PER_SAMPLE};
    if (!rc)
        rc = bench_time(dev, &op, c->timing, &row->t);

    clmla_cache_destroy(st.cache);
    clmla_layer_destroy(st.layer);
    bench_release(&st.x);
    bench_release(&st.out);
    bench_release(&st.staging);
    free(st.seq_ids);
    free(st.entries);
    return rc ? 1 : 0;
}
