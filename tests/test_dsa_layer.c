/* A sparse-attention layer (DeepSeek Sparse Attention: DeepSeek-V3.2, GLM-5) end to end: a layer
   with an indexer, its index keys written into the cache's index-key cache at every step, and the
   steps where some query sees more than index_topk keys attending only to the keys the indexer
   selects. Held to idx_ref_dsa_forward (ref/indexer_ref.c: the float64 indexer, its selection and
   sparse latent attention, the cache's rounding of c^KV / k^R and of the index keys) at float32's
   tolerance, on odd sizes (D 44, H 3, rq 20, rkv 36 (128 over an fp8 latent cache), dn/dr/dv 10/6/12, H_I 5, d_I 10 or 16, top-k 4
   or 3) in 3-token blocks, so that contexts end mid-block:
     sequence: one sequence prefilled in chunks that cross top-k, then decoded token by token;
     batch:    three sequences in mixed steps (decode entries beside a prefill chunk), each checked
               against its own reference run;
     both pairings of the indexer's RoPE, f32, bf16, f16 and fp8 (DeepSeek's: Hadamard-rotated e4m3 with a
     scale per key) index keys, f32, f16 and bf16 latent caches, each
     path asked for (sparse steps run absorbed whatever is asked; the steps before run the path);
     keys:     the index keys the cache holds (clmla_cache_read_index) against the reference's;
     select:   clmla_index_select on those keys against the float64 top-k, and its refusals;
     topk1:    top-k 1 (one key per query from the second token on);
     group:    the two parts above with the work-group (GPU) kernels forced;
     pieces:   sequence and batch with the absorbed path's attention in pieces of 2 rows;
   A selecting step attends to the selection on the path asked for: absorbed through the sparse
   latent kernels, decompressed through attn_prefill(_rows) built with -D SPARSE.
     dense:    top-k past every context gives the layer without an indexer;
     refusals: a cache without index keys, a missing or misshapen indexer tensor, indexer tensors
               given to a layer without one, and configurations the indexer cannot take, each naming
               what is wrong and leaving nothing behind.
   Every comparison first checks that the reference's selections are unambiguous (DSA.md 6.4), so a
   pass means the same keys were selected. */
#include "attention.h"
#include "check.h"
#include "hooks.h"
#include "checkpoint_writer.h"
#include "clmla.h"
#include "indexer_ref.h"
#include "internal.h"
#include "mla_ref.h"
#include "test_util.h"
#include "tolerance.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static clmla_context *ctx;

enum { BT = 3, MAX_T = 24 };

/* A DSA layer's configuration, weights (MLA's from tu_weights, the indexer's here) and views. */
typedef struct dsa_model {
    clmla_layer_config config;
    tu_weights base;
    float *wq, *wk, *kn, *kb, *ww;
    clmla_layer_weights layer;
    idx_ref_config icfg;
    idx_ref_weights iref;
} dsa_model;

static void fill(float *a, size_t n, float center, float amp, tu_rng *rng)
{
    tu_fill_uniform(a, n, center, amp, rng);
}

/* the models' kv_lora_rank: 36, or 128 for the fp8 latent cache (FlashMLA's layout needs a multiple
   of 128; part_fp8_latent) */
static int model_rkv = 36;

static int model_make(dsa_model *m, int index_dim, int topk, clmla_rope_pairing pairing, uint64_t seed)
{
    memset(m, 0, sizeof(*m));
    clmla_layer_config c = tu_small_config(44, 3, 20, model_rkv, 10, 6, 12);
    c.index_n_heads = 5;
    c.index_head_dim = index_dim;
    c.index_topk = topk;
    c.index_rope_pairing = pairing;
    m->config = c;
    if (tu_weights_make(&m->base, &c, seed) != 0)
        return -1;
    const size_t HI = 5, dI = (size_t)index_dim, D = 44, rq = 20;
    m->wq = malloc(HI * dI * rq * sizeof(float));
    m->wk = malloc(dI * D * sizeof(float));
    m->kn = malloc(dI * sizeof(float));
    m->kb = malloc(dI * sizeof(float));
    m->ww = malloc(HI * D * sizeof(float));
    if (!m->wq || !m->wk || !m->kn || !m->kb || !m->ww)
        return -1;
    tu_rng rng = tu_rng_seed(seed * 7919 + 11);
    fill(m->wq, HI * dI * rq, 0.0f, sqrtf(3.0f / (float)rq), &rng);
    fill(m->wk, dI * D, 0.0f, sqrtf(3.0f / (float)D), &rng);
    fill(m->kn, dI, 1.0f, 0.25f, &rng);
    fill(m->kb, dI, 0.0f, 0.2f, &rng);
    fill(m->ww, HI * D, 0.0f, sqrtf(3.0f / (float)D), &rng);
    m->layer = m->base.layer;
    m->layer.indexer_wq_b = clmla_tensor_2d(m->wq, (int64_t)(HI * dI), (int64_t)rq);
    m->layer.indexer_wk = clmla_tensor_2d(m->wk, (int64_t)dI, (int64_t)D);
    m->layer.indexer_k_norm = clmla_tensor_1d(m->kn, (int64_t)dI);
    m->layer.indexer_k_norm_bias = clmla_tensor_1d(m->kb, (int64_t)dI);
    m->layer.indexer_weights_proj = clmla_tensor_2d(m->ww, (int64_t)HI, (int64_t)D);
    m->icfg = (idx_ref_config){(int)D, (int)rq, (int)HI, index_dim, 6, pairing == CLMLA_ROPE_INTERLEAVED, 1e-6};
    m->iref = (idx_ref_weights){m->wq, m->wk, m->kn, m->kb, m->ww};
    return 0;
}

static void model_free(dsa_model *m)
{
    tu_weights_free(&m->base);
    free(m->wq), free(m->wk), free(m->kn), free(m->kb), free(m->ww);
}

/* model_make, failing the test (out of host memory) where it fails; m is then freed. */
static int model_make_or_fail(dsa_model *m, int index_dim, int topk, clmla_rope_pairing pairing, uint64_t seed)
{
    if (model_make(m, index_dim, topk, pairing, seed) == 0)
        return 0;
    CHECK(0, "out of host memory");
    model_free(m);
    return -1;
}

/* The reference of one sequence of T tokens: out [T, D] and its index keys [T, d_I]. */
static double *reference(const dsa_model *m, int T, const float *x, clmla_cache_dtype keys, clmla_cache_dtype latent,
                         const char *what)
{
    double *out = malloc((size_t)T * 44 * sizeof(double));
    mla_ref_features f;
    memset(&f, 0, sizeof(f));
    f.cache_type = (mla_ref_cache_type)latent;
    int ambiguous = -1;
    const int rc = out ? idx_ref_dsa_forward(&m->base.ref_config, &f, &m->base.ref, &m->icfg, &m->iref,
                                             m->config.index_topk, (mla_ref_cache_type)keys, T, x, out, NULL, &ambiguous)
                       : -1;
    CHECK(rc == 0, "%s: the reference failed", what);
    /* a selection the reference does not fix would make a mismatch meaningless: these inputs must
       have none (fixed seeds) */
    CHECK(ambiguous == 0, "%s: %d tokens' selections are ambiguous in the reference; choose other inputs", what,
          ambiguous);
    if (rc != 0) {
        free(out);
        return NULL;
    }
    return out;
}

static clmla_cache *cache_for(const dsa_model *m, int blocks, clmla_cache_dtype latent, clmla_cache_dtype keys)
{
    clmla_cache_config cc = {1, m->config.kv_lora_rank, m->config.qk_rope_head_dim, BT, blocks, latent,
                             m->config.index_head_dim, keys};
    clmla_cache *cache = NULL;
    clmla_status st = clmla_cache_create(ctx, &cc, &cache);
    CHECK(st == CLMLA_SUCCESS, "cache: %s", clmla_last_error(ctx));
    return cache;
}

static const char *dtype_name(clmla_cache_dtype d)
{
    return d == CLMLA_CACHE_F32 ? "f32" : d == CLMLA_CACHE_F16 ? "f16" : d == CLMLA_CACHE_BF16 ? "bf16" : "fp8";
}

/* One sequence: chunks (prefill, crossing top-k) then single tokens; every output row and the
   index keys against the reference. */
static void one_sequence(const dsa_model *m, clmla_cache_dtype latent, clmla_cache_dtype keys,
                         clmla_attention_path path, const int *chunks, const char *name)
{
    char what[200];
    snprintf(what, sizeof(what), "%s: d_I %d top-k %d %s pairing, %s latent, %s keys, path %d", name,
             m->config.index_head_dim, m->config.index_topk,
             m->config.index_rope_pairing == CLMLA_ROPE_HALF_SPLIT ? "half-split" : "interleaved", dtype_name(latent),
             dtype_name(keys), (int)path);
    int T = 0;
    for (int i = 0; chunks[i] > 0; i++)
        T += chunks[i];
    float *x = tu_random_inputs(T, 44, 1234 + (uint64_t)T);
    float *got = malloc((size_t)T * 44 * sizeof(float));
    double *want = x ? reference(m, T, x, keys, latent, what) : NULL;
    clmla_layer *layer = NULL;
    clmla_cache *cache = NULL;
    clmla_status st = clmla_layer_create(ctx, &m->config, &m->layer, &layer);
    CHECK(st == CLMLA_SUCCESS, "%s: layer: %s", what, clmla_last_error(ctx));
    if (st == CLMLA_SUCCESS)
        cache = cache_for(m, (T + BT - 1) / BT + 1, latent, keys);
    int32_t seq = -1;
    if (cache && got && want && clmla_cache_seq_add(cache, &seq) == CLMLA_SUCCESS) {
        int t = 0;
        for (int i = 0; chunks[i] > 0 && st == CLMLA_SUCCESS; t += chunks[i], i++) {
            clmla_batch_entry e = {seq, chunks[i]};
            clmla_forward_args a = {&e, 1, 0, path};
            st = clmla_layer_forward(layer, cache, &a, x + (size_t)t * 44, got + (size_t)t * 44);
            CHECK(st == CLMLA_SUCCESS, "%s: step at %d (%d tokens): %s", what, t, chunks[i], clmla_last_error(ctx));
        }
        if (st == CLMLA_SUCCESS) {
            CHECK_CLOSE(got, want, (size_t)T * 44, 44, TOL_F32_CACHE, "%s", what);
            /* the index keys the cache holds, against the reference's (bf16: the same rounding) */
            float *k = malloc((size_t)T * m->config.index_head_dim * sizeof(float));
            double *kw = malloc((size_t)T * m->config.index_head_dim * sizeof(double));
            double c[8], s[8];
            for (int i = 0; k && kw && i < T; i++) {
                idx_ref_rope_row(&m->base.ref_config, NULL, i, c, s);
                idx_ref_key(&m->icfg, m->wk, m->kn, m->kb, x + (size_t)i * 44, c, s, kw + (size_t)i * m->config.index_head_dim);
                if (keys == CLMLA_CACHE_FP8) { /* stored rotated and quantised */
                    idx_ref_hadamard(kw + (size_t)i * m->config.index_head_dim, m->config.index_head_dim);
                    idx_ref_quantize_fp8(kw + (size_t)i * m->config.index_head_dim, m->config.index_head_dim);
                }
                for (int d = 0; (keys == CLMLA_CACHE_F16 || keys == CLMLA_CACHE_BF16) && d < m->config.index_head_dim; d++) {
                    double *v = &kw[(size_t)i * m->config.index_head_dim + d];
                    *v = keys == CLMLA_CACHE_BF16 ? mla_ref_round_bf16(*v) : mla_ref_round_f16(*v);
                }
            }
            st = k && kw ? clmla_cache_read_index(cache, 0, seq, 0, T, k) : CLMLA_ERROR_OUT_OF_HOST_MEMORY;
            CHECK(st == CLMLA_SUCCESS, "%s: clmla_cache_read_index: %s", what, clmla_last_error(ctx));
            if (st == CLMLA_SUCCESS)
                CHECK_CLOSE(k, kw, (size_t)T * m->config.index_head_dim, m->config.index_head_dim,
                            keys == CLMLA_CACHE_FP8 ? 1e-6 : keys == CLMLA_CACHE_BF16 ? 1.0 / 128 : keys == CLMLA_CACHE_F16 ? 1.0 / 1024 : 1e-5,
                            "%s: index keys", what);
            free(k);
            free(kw);
        }
    }
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    free(x);
    free(got);
    free(want);
}

static void part_sequence(void)
{
    static const int prefill_then_decode[] = {2, 5, 1, 1, 1, 1, 1, 1, 1, 1, 0}; /* top-k 4: the 2nd chunk selects */
    static const int one_prefill[] = {13, 1, 1, 0};
    static const clmla_rope_pairing pairings[] = {CLMLA_ROPE_HALF_SPLIT, CLMLA_ROPE_INTERLEAVED};
    for (int p = 0; p < 2; p++) {
        dsa_model m;
        if (model_make(&m, p ? 10 : 16, 4, pairings[p], 6 + (uint64_t)p) == 0) {
            one_sequence(&m, CLMLA_CACHE_F32, CLMLA_CACHE_F32, CLMLA_PATH_AUTO, prefill_then_decode, "chunks, decode");
            one_sequence(&m, CLMLA_CACHE_F32, CLMLA_CACHE_F32, CLMLA_PATH_DECOMPRESSED, one_prefill, "one prefill");
            one_sequence(&m, CLMLA_CACHE_F16, CLMLA_CACHE_BF16, CLMLA_PATH_ABSORBED, prefill_then_decode,
                         "chunks, decode");
            one_sequence(&m, CLMLA_CACHE_BF16, CLMLA_CACHE_F16, CLMLA_PATH_AUTO, one_prefill, "one prefill");
            if (m.config.index_head_dim == 16) /* fp8 keys: a power of two */
                one_sequence(&m, CLMLA_CACHE_F32, CLMLA_CACHE_FP8, CLMLA_PATH_AUTO, prefill_then_decode,
                             "chunks, decode");
        } else {
            CHECK(0, "out of host memory");
        }
        model_free(&m);
    }
}

/* top-k 1: from the second token on, each query attends to the one key its indexer ranks first */
static void part_topk1(void)
{
    static const int chunks[] = {3, 4, 1, 1, 1, 1, 0};
    dsa_model m;
    if (model_make(&m, 16, 1, CLMLA_ROPE_INTERLEAVED, 41) == 0) {
        one_sequence(&m, CLMLA_CACHE_F32, CLMLA_CACHE_F32, CLMLA_PATH_AUTO, chunks, "top-k 1");
        one_sequence(&m, CLMLA_CACHE_F16, CLMLA_CACHE_FP8, CLMLA_PATH_DECOMPRESSED, chunks, "top-k 1");
    } else {
        CHECK(0, "out of host memory");
    }
    model_free(&m);
}

/* A sparse layer over an fp8 latent cache (rkv 128), against the reference that rounds its cache
   alike: the selection reads the index keys, attention the fp8 rows, on both paths and kernels. */
static void part_fp8_latent(void)
{
    static const int prefill_then_decode[] = {2, 5, 1, 1, 1, 1, 1, 1, 1, 1, 0};
    static const int one_prefill[] = {13, 1, 1, 0};
    model_rkv = 128;
    dsa_model m;
    if (model_make(&m, 16, 4, CLMLA_ROPE_HALF_SPLIT, 61) == 0) {
        for (int variant = CLMLA_LATENT_GROUP; variant <= CLMLA_LATENT_ROWS; variant++) {
            clmla_attention_set_variant(ctx, variant);
            one_sequence(&m, CLMLA_CACHE_FP8, CLMLA_CACHE_FP8, CLMLA_PATH_ABSORBED, prefill_then_decode, "fp8 latent");
            one_sequence(&m, CLMLA_CACHE_FP8, CLMLA_CACHE_F32, CLMLA_PATH_DECOMPRESSED, one_prefill, "fp8 latent");
        }
        clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
    } else {
        CHECK(0, "out of host memory");
    }
    model_free(&m);
    model_rkv = 36;
}

/* sequence and topk1 again with the work-group (GPU) attention kernels, latent and decompressed:
   the parts above run the device's own (on a CPU, the row-walking ones) */
static void part_group(void)
{
    clmla_attention_set_variant(ctx, CLMLA_LATENT_GROUP);
    part_sequence();
    part_topk1();
    clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
}

/* A batched step over S sequences, tokens[s] tokens of sequence s (0: not in the step): its
   entries, in sequence order, into e; returns how many. */
static int step_entries(clmla_batch_entry *e, const int32_t *seq, const int *tokens, int S)
{
    int n = 0;
    for (int s = 0; s < S; s++)
        if (tokens[s] > 0)
            e[n++] = (clmla_batch_entry){seq[s], tokens[s]};
    return n;
}

/* The step's input rows (44 values each) in the entries' order: sequence s's next tokens[s] rows
   of src[s], past the done[s] already run. */
static void step_gather(float *dst, float *const *src, const int *tokens, const int *done, int S)
{
    for (int s = 0, row = 0; s < S; s++)
        if (tokens[s] > 0) {
            memcpy(dst + (size_t)row * 44, src[s] + (size_t)done[s] * 44, (size_t)tokens[s] * 44 * sizeof(float));
            row += tokens[s];
        }
}

/* The step's output rows back into each sequence's got[s] past its done[s] rows, which then count
   the step's tokens too. */
static void step_scatter(float **got, const float *out, const int *tokens, int *done, int S)
{
    for (int s = 0, row = 0; s < S; s++)
        if (tokens[s] > 0) {
            memcpy(got[s] + (size_t)done[s] * 44, out + (size_t)row * 44, (size_t)tokens[s] * 44 * sizeof(float));
            row += tokens[s];
            done[s] += tokens[s];
        }
}

/* Three sequences of different lengths, stepped together: entry lists mixing a prefill chunk with
   decode tokens; each sequence against its own reference. */
static void part_batch(void)
{
    dsa_model m;
    if (model_make_or_fail(&m, 10, 3, CLMLA_ROPE_HALF_SPLIT, 17) != 0)
        return;
    enum { S = 3 };
    static const int lens[S] = {11, 7, 14};
    /* tokens per step and sequence (0: not in the step) */
    static const int steps[][S] = {{5, 2, 1}, {1, 3, 6}, {1, 1, 1}, {4, 1, 1}, {0, 0, 5}};
    float *x[S];
    double *want[S];
    float *got[S];
    for (int s = 0; s < S; s++) {
        x[s] = tu_random_inputs(lens[s], 44, 300 + (uint64_t)s);
        got[s] = calloc((size_t)lens[s] * 44, sizeof(float));
        want[s] = x[s] ? reference(&m, lens[s], x[s], CLMLA_CACHE_F32, CLMLA_CACHE_F32, "batch") : NULL;
    }
    clmla_layer *layer = NULL;
    clmla_status st = clmla_layer_create(ctx, &m.config, &m.layer, &layer);
    CHECK(st == CLMLA_SUCCESS, "batch: layer: %s", clmla_last_error(ctx));
    clmla_cache *cache = st == CLMLA_SUCCESS ? cache_for(&m, 20, CLMLA_CACHE_F32, CLMLA_CACHE_F32) : NULL;
    int32_t seq[S];
    int done[S] = {0, 0, 0};
    for (int s = 0; cache && s < S; s++)
        clmla_cache_seq_add(cache, &seq[s]);
    float *xin = malloc(MAX_T * 44 * sizeof(float)), *yout = malloc(MAX_T * 44 * sizeof(float));
    for (size_t k = 0; cache && xin && yout && st == CLMLA_SUCCESS && k < sizeof(steps) / sizeof(steps[0]); k++) {
        clmla_batch_entry e[S];
        const int n = step_entries(e, seq, steps[k], S);
        step_gather(xin, x, steps[k], done, S);
        clmla_forward_args a = {e, n, 0, CLMLA_PATH_AUTO};
        st = clmla_layer_forward(layer, cache, &a, xin, yout);
        CHECK(st == CLMLA_SUCCESS, "batch: step %zu: %s", k, clmla_last_error(ctx));
        step_scatter(got, yout, steps[k], done, S);
    }
    for (int s = 0; st == CLMLA_SUCCESS && s < S; s++) {
        CHECK(done[s] == lens[s], "batch: sequence %d ran %d of %d tokens", s, done[s], lens[s]);
        if (want[s])
            CHECK_CLOSE(got[s], want[s], (size_t)lens[s] * 44, 44, TOL_F32_CACHE, "batch: sequence %d (%d tokens)", s,
                        lens[s]);
    }
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    for (int s = 0; s < S; s++)
        free(x[s]), free(got[s]), free(want[s]);
    free(xin);
    free(yout);
    model_free(&m);
}

/* top-k past every context: the indexer runs (keys written) but selects everything, so the output
   is the plain layer's, which the reference without an indexer gives. */
static void part_dense(void)
{
    dsa_model m;
    if (model_make_or_fail(&m, 10, 64, CLMLA_ROPE_INTERLEAVED, 23) != 0)
        return;
    static const int chunks[] = {6, 1, 1, 1, 0};
    const int T = 9;
    float *x = tu_random_inputs(T, 44, 99);
    double *want = malloc((size_t)T * 44 * sizeof(double));
    CHECK(x && want && mla_ref_forward(&m.base.ref_config, &m.base.ref, T, x, MLA_REF_ABSORBED, want, NULL, NULL, NULL,
                                       NULL, NULL, NULL) == 0,
          "dense: reference");
    float *got = malloc((size_t)T * 44 * sizeof(float));
    clmla_layer *layer = NULL;
    clmla_status st = clmla_layer_create(ctx, &m.config, &m.layer, &layer);
    CHECK(st == CLMLA_SUCCESS, "dense: layer: %s", clmla_last_error(ctx));
    clmla_cache *cache = st == CLMLA_SUCCESS ? cache_for(&m, 4, CLMLA_CACHE_F32, CLMLA_CACHE_F32) : NULL;
    int32_t seq = -1;
    if (cache && got && clmla_cache_seq_add(cache, &seq) == CLMLA_SUCCESS) {
        for (int i = 0, t = 0; chunks[i] > 0 && st == CLMLA_SUCCESS; t += chunks[i], i++) {
            clmla_batch_entry e = {seq, chunks[i]};
            clmla_forward_args a = {&e, 1, 0, CLMLA_PATH_AUTO};
            st = clmla_layer_forward(layer, cache, &a, x + (size_t)t * 44, got + (size_t)t * 44);
        }
        CHECK(st == CLMLA_SUCCESS, "dense: %s", clmla_last_error(ctx));
        if (st == CLMLA_SUCCESS)
            CHECK_CLOSE(got, want, (size_t)T * 44, 44, TOL_F32_CACHE, "dense: top-k 64 over 9 tokens");
    }
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    free(x), free(want), free(got);
    model_free(&m);
}

/* A refused step: one CHECK_STATUS that layer's forward of args returns want, one CHECK that the
   error names a and b (b NULL: a alone); what names the case in the message. */
static void check_refused(clmla_layer *layer, clmla_cache *cache, const clmla_forward_args *args, const float *x,
                          float *y, clmla_status want, const char *a, const char *b, const char *what)
{
    CHECK_STATUS(clmla_layer_forward(layer, cache, args, x, y), want, ctx);
    const char *e = clmla_last_error(ctx);
    CHECK(strstr(e, a) && (!b || strstr(e, b)), "%s: %s", what, e);
}

static void part_refusals(void)
{
    dsa_model m;
    if (model_make_or_fail(&m, 10, 4, CLMLA_ROPE_HALF_SPLIT, 31) != 0)
        return;
    clmla_layer *layer = NULL;
    /* a missing indexer tensor, named */
    clmla_layer_weights w = m.layer;
    w.indexer_wk.data = NULL;
    CHECK_STATUS(clmla_layer_create(ctx, &m.config, &w, &layer), CLMLA_ERROR_MISSING_TENSOR, ctx);
    CHECK(layer == NULL && strstr(clmla_last_error(ctx), "indexer.wk"), "missing wk: %s", clmla_last_error(ctx));
    /* a misshapen one: both shapes named */
    w = m.layer;
    w.indexer_wq_b.shape[0] = 49;
    clmla_status st = clmla_layer_create(ctx, &m.config, &w, &layer);
    CHECK(st != CLMLA_SUCCESS && layer == NULL && strstr(clmla_last_error(ctx), "indexer.wq_b") &&
              strstr(clmla_last_error(ctx), "50") && strstr(clmla_last_error(ctx), "49"),
          "wq_b [49, 20]: %s", clmla_last_error(ctx));
    /* indexer tensors for a layer without an indexer */
    clmla_layer_config plain = m.config;
    plain.index_n_heads = 0;
    CHECK_STATUS(clmla_layer_create(ctx, &plain, &m.layer, &layer), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK(layer == NULL && strstr(clmla_last_error(ctx), "index_n_heads is 0"), "plain: %s", clmla_last_error(ctx));
    /* configurations */
    struct {
        clmla_layer_config c;
        const char *says;
    } bad[5];
    for (int i = 0; i < 5; i++)
        bad[i].c = m.config;
    bad[0].c.index_topk = 0, bad[0].says = "index_topk 0";
    bad[1].c.index_head_dim = 4, bad[1].says = "index_head_dim 4"; /* below dr 6 */
    bad[2].c.index_head_dim = 11, bad[2].says = "index_head_dim 11";
    bad[3].c.dense_max_keys = 8, bad[3].says = "dense_max_keys 8";
    bad[4].c.q_lora_rank = 0, bad[4].says = "q_lora_rank is 0";
    for (int i = 0; i < 5; i++) {
        st = clmla_layer_config_validate(&bad[i].c);
        CHECK(st == CLMLA_ERROR_INVALID_CONFIG && strstr(clmla_last_error(NULL), bad[i].says),
              "config %d: status %d, '%s', want '%s'", i, (int)st, clmla_last_error(NULL), bad[i].says);
    }
    /* a cache without an index-key cache: refused, the sequence unchanged */
    st = clmla_layer_create(ctx, &m.config, &m.layer, &layer);
    CHECK(st == CLMLA_SUCCESS, "layer: %s", clmla_last_error(ctx));
    clmla_cache_config cc = {1, 36, 6, BT, 8, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
    clmla_cache *cache = NULL;
    if (st == CLMLA_SUCCESS && clmla_cache_create(ctx, &cc, &cache) == CLMLA_SUCCESS) {
        int32_t seq = -1;
        clmla_cache_seq_add(cache, &seq);
        float x[2 * 44] = {0}, y[2 * 44];
        clmla_batch_entry e = {seq, 2};
        clmla_forward_args a = {&e, 1, 0, CLMLA_PATH_AUTO};
        check_refused(layer, cache, &a, x, y, CLMLA_ERROR_SHAPE_MISMATCH, "10", "index_head_dim", "no index keys");
        int len = -1;
        clmla_cache_seq_length(cache, seq, 0, &len);
        CHECK(len == 0, "the refused step left %d tokens", len);
        float k[10];
        CHECK_STATUS(clmla_cache_read_index(cache, 0, seq, 0, 0, k), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    }
    /* the layer's memory counts the indexer: wq_b 50x20, wk 10x44, weights_proj 5x44, norm 2x10 */
    if (layer) {
        clmla_layer_memory mem;
        CHECK(clmla_layer_get_memory(layer, &mem) == CLMLA_SUCCESS, "memory");
        const size_t want = (50 * 20 + 10 * 44 + 5 * 44 + 20) * sizeof(float);
        CHECK(mem.indexer >= want && mem.indexer <= want + want / 100 + 4096, "indexer bytes %zu, want %zu", mem.indexer,
              want);
    }
    clmla_cache_info info;
    clmla_cache *with = cache_for(&m, 8, CLMLA_CACHE_F16, CLMLA_CACHE_BF16);
    if (with && clmla_cache_get_info(with, &info) == CLMLA_SUCCESS)
        CHECK(info.index_bytes_per_token_per_layer == 20 && info.bytes_per_token_per_layer == 84 &&
                  info.bytes_per_block == BT * (20 + 84),
              "cache info: index %zu, latent %zu, block %zu bytes", info.index_bytes_per_token_per_layer,
              info.bytes_per_token_per_layer, info.bytes_per_block);
    clmla_cache_destroy(with);
    /* fp8 keys: index_head_dim codes and a float32 scale a token (DeepSeek's 132 bytes at 128) */
    dsa_model m16;
    if (model_make(&m16, 16, 4, CLMLA_ROPE_HALF_SPLIT, 31) == 0) {
        clmla_cache *fp8 = cache_for(&m16, 8, CLMLA_CACHE_F32,
                                     CLMLA_CACHE_FP8);
        if (fp8 && clmla_cache_get_info(fp8, &info) == CLMLA_SUCCESS)
            CHECK(info.index_bytes_per_token_per_layer == 20 && info.bytes_per_block == BT * (20 + 168),
                  "fp8 keys: %zu bytes a token, %zu a block", info.index_bytes_per_token_per_layer, info.bytes_per_block);
        clmla_cache_destroy(fp8);
    }
    model_free(&m16);
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    model_free(&m);
}

/* clmla_index_select (the public selection) over keys a layer wrote: random queries and weights for
   two tokens of one sequence, against idx_ref_topk of float64 scores of the keys read back; then
   its refusals, each naming the value, with nothing written. */
static void part_select(void)
{
    dsa_model m;
    if (model_make_or_fail(&m, 16, 4, CLMLA_ROPE_HALF_SPLIT, 6) != 0)
        return;
    enum { T = 2, HI = 3, K = 5, N = 14, DI = 16 };
    float *x = tu_random_inputs(N, 44, 77), y[N * 44];
    clmla_layer *layer = NULL;
    clmla_cache *cache = NULL;
    clmla_status st = clmla_layer_create(ctx, &m.config, &m.layer, &layer);
    if (st == CLMLA_SUCCESS)
        cache = cache_for(&m, 6, CLMLA_CACHE_F32, CLMLA_CACHE_F32);
    int32_t seq = -1;
    if (x && cache && clmla_cache_seq_add(cache, &seq) == CLMLA_SUCCESS) {
        clmla_batch_entry e = {seq, N};
        clmla_forward_args a = {&e, 1, 0, CLMLA_PATH_AUTO};
        st = clmla_layer_forward(layer, cache, &a, x, y);
        CHECK(st == CLMLA_SUCCESS, "select: step: %s", clmla_last_error(ctx));
        float keys[N * DI], q[T * HI * DI], w[T * HI];
        int32_t table[8], ctx_len[T] = {N, 7}, tseq[T] = {0, 0}, got[T * K];
        int nb = 0;
        clmla_cache_seq_blocks(cache, seq, table, 8, &nb);
        clmla_cache_read_index(cache, 0, seq, 0, N, keys);
        tu_rng rng = tu_rng_seed(5);
        tu_fill_uniform(q, sizeof(q) / sizeof(float), 0.0f, 1.0f, &rng);
        tu_fill_uniform(w, sizeof(w) / sizeof(float), 0.2f, 1.0f, &rng);
        cl_context cl = clmla_context_cl_context(ctx);
        cl_int err = CL_SUCCESS;
        cl_mem qb = clCreateBuffer(cl, CL_MEM_COPY_HOST_PTR, sizeof(q), q, &err);
        cl_mem wb = clCreateBuffer(cl, CL_MEM_COPY_HOST_PTR, sizeof(w), w, &err);
        cl_mem tb = clCreateBuffer(cl, CL_MEM_COPY_HOST_PTR, (size_t)nb * 4, table, &err);
        cl_mem sb = clCreateBuffer(cl, CL_MEM_COPY_HOST_PTR, sizeof(tseq), tseq, &err);
        cl_mem lb = clCreateBuffer(cl, CL_MEM_COPY_HOST_PTR, sizeof(ctx_len), ctx_len, &err);
        cl_mem ob = clCreateBuffer(cl, CL_MEM_READ_WRITE, sizeof(got), NULL, &err);
        clmla_index_select_args sa = {T, HI, K, qb, 0, wb, 0, tb, nb, sb, lb, N, ob, 0};
        st = clmla_index_select(cache, 0, &sa, NULL);
        CHECK(st == CLMLA_SUCCESS, "clmla_index_select: %s", clmla_last_error(ctx));
        if (st == CLMLA_SUCCESS &&
            clEnqueueReadBuffer(clmla_context_queue(ctx), ob, CL_TRUE, 0, sizeof(got), got, 0, NULL, NULL) == CL_SUCCESS)
            for (int t = 0; t < T; t++) {
                double qd[HI * DI], wd[HI], kd[N * DI], sc[N];
                for (int i = 0; i < HI * DI; i++)
                    qd[i] = q[t * HI * DI + i];
                for (int i = 0; i < HI; i++)
                    wd[i] = w[t * HI + i];
                for (int i = 0; i < N * DI; i++)
                    kd[i] = keys[i];
                idx_ref_scores(HI, DI, qd, wd, 1.0, ctx_len[t], kd, sc);
                const double eps = idx_ref_score_bound(HI, DI, qd, wd, 1.0, ctx_len[t], kd, 0);
                int strict = 0;
                char why[160] = "";
                CHECK(idx_ref_selection_ok(sc, ctx_len[t], K, eps, got + t * K, &strict, why, sizeof(why)) == 1 && strict,
                      "clmla_index_select token %d: %s (strict %d)", t, why, strict);
            }
        /* refusals: nothing written over the indices */
        const int32_t before = got[0];
        clmla_index_select_args bad = sa;
        bad.top_k = 0;
        CHECK_STATUS(clmla_index_select(cache, 0, &bad, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK(strstr(clmla_last_error(ctx), "top_k 0"), "top_k 0: %s", clmla_last_error(ctx));
        bad = sa;
        bad.top_k = 64; /* 2 x 64 int32 do not fit the 40 bytes of ob */
        CHECK_STATUS(clmla_index_select(cache, 0, &bad, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK(strstr(clmla_last_error(ctx), "indices"), "short indices: %s", clmla_last_error(ctx));
        bad = sa;
        bad.max_ctx_len = 8 * BT;
        CHECK_STATUS(clmla_index_select(cache, 0, &bad, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK_STATUS(clmla_index_select(cache, 1, &sa, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        clmla_cache_config plain = {1, 36, 6, BT, 4, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
        clmla_cache *no_keys = NULL;
        if (clmla_cache_create(ctx, &plain, &no_keys) == CLMLA_SUCCESS) {
            CHECK_STATUS(clmla_index_select(no_keys, 0, &sa, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
            CHECK(strstr(clmla_last_error(ctx), "no index-key cache"), "no keys: %s", clmla_last_error(ctx));
            cl_mem none = NULL;
            CHECK_STATUS(clmla_cache_index_buffer(no_keys, 0, &none), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
            clmla_cache_destroy(no_keys);
        }
        clEnqueueReadBuffer(clmla_context_queue(ctx), ob, CL_TRUE, 0, sizeof(got), got, 0, NULL, NULL);
        CHECK(got[0] == before, "a refused call wrote the indices");
        cl_mem mine = NULL;
        CHECK(clmla_cache_index_buffer(cache, 0, &mine) == CLMLA_SUCCESS && mine, "clmla_cache_index_buffer");
        cl_mem bufs[] = {qb, wb, tb, sb, lb, ob};
        for (int i = 0; i < 6; i++)
            if (bufs[i])
                clReleaseMemObject(bufs[i]);
    }
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    free(x);
    model_free(&m);
}

/* The sequence and batch parts with the absorbed path's attention in pieces of 2 rows (a test hook;
   the library's pieces hold up to 1 GiB of its scratch), so that pieces cut the selecting steps'
   entries and each piece reads its rows of the index lists. */
static void part_pieces(void)
{
    clmla_test_hooks_of(ctx)->absorbed_piece_rows = 2;
    part_sequence();
    part_batch();
    clmla_test_hooks_of(ctx)->absorbed_piece_rows = 0;
}

/* ---- shared layers (glm_moe_dsa's indexer_types "shared") ---------------------------------------- */

/* A full layer (cache layer 0) and a shared layer with weights of its own (cache layer 1) over one
   cache, run step after step on different inputs: the shared layer's output against
   idx_ref_shared_forward over the selection the full layer's reference made. Two sequences in
   mixed steps; the selections must be unambiguous in the reference. */
typedef struct shared_case {
    clmla_cache_dtype latent, keys;
    clmla_attention_path path;
} shared_case;

static void shared_run(const dsa_model *m, const tu_weights *sw, const clmla_layer_config *sc, const shared_case *k)
{
    enum { S = 2 };
    static const int lens[S] = {12, 9};
    static const int steps[][S] = {{2, 3}, {5, 1}, {1, 3}, {1, 1}, {1, 0}, {2, 1}};
    const int K = m->config.index_topk;
    char what[160];
    snprintf(what, sizeof(what), "shared: %s latent, %s keys, path %d", dtype_name(k->latent), dtype_name(k->keys),
             (int)k->path);
    float *x[S], *xs[S], *got[S];
    double *want[S];
    int ok = 1;
    for (int s = 0; s < S; s++) {
        x[s] = tu_random_inputs(lens[s], 44, 500 + (uint64_t)s);
        xs[s] = tu_random_inputs(lens[s], 44, 600 + (uint64_t)s);
        got[s] = calloc((size_t)lens[s] * 44, sizeof(float));
        want[s] = malloc((size_t)lens[s] * 44 * sizeof(double));
        double *full = malloc((size_t)lens[s] * 44 * sizeof(double));
        int32_t *sel = malloc((size_t)lens[s] * K * sizeof(int32_t));
        mla_ref_features f;
        memset(&f, 0, sizeof(f));
        f.cache_type = (mla_ref_cache_type)k->latent;
        int ambiguous = -1;
        ok = ok && x[s] && xs[s] && got[s] && want[s] && full && sel &&
             idx_ref_dsa_forward(&m->base.ref_config, &f, &m->base.ref, &m->icfg, &m->iref, K,
                                 (mla_ref_cache_type)k->keys, lens[s], x[s], full, sel, &ambiguous) == 0 &&
             idx_ref_shared_forward(&sw->ref_config, &f, &sw->ref, K, lens[s], xs[s], sel, want[s]) == 0;
        CHECK(ok, "%s: the reference failed", what);
        CHECK(ambiguous == 0, "%s: %d selections are ambiguous in the reference; choose other inputs", what, ambiguous);
        free(full);
        free(sel);
    }
    clmla_layer *fl = NULL, *sl = NULL;
    clmla_status st = clmla_layer_create(ctx, &m->config, &m->layer, &fl);
    CHECK(st == CLMLA_SUCCESS, "%s: full layer: %s", what, clmla_last_error(ctx));
    if (st == CLMLA_SUCCESS) {
        st = clmla_layer_create(ctx, sc, &sw->layer, &sl);
        CHECK(st == CLMLA_SUCCESS, "%s: shared layer: %s", what, clmla_last_error(ctx));
    }
    clmla_cache_config cc = {2, m->config.kv_lora_rank, m->config.qk_rope_head_dim, BT, 12, k->latent,
                             m->config.index_head_dim, k->keys};
    clmla_cache *cache = NULL;
    if (st == CLMLA_SUCCESS) {
        st = clmla_cache_create(ctx, &cc, &cache);
        CHECK(st == CLMLA_SUCCESS, "%s: cache: %s", what, clmla_last_error(ctx));
    }
    int32_t seq[S];
    int done[S] = {0, 0};
    for (int s = 0; st == CLMLA_SUCCESS && s < S; s++)
        st = clmla_cache_seq_add(cache, &seq[s]);
    float *xin = malloc(MAX_T * 44 * sizeof(float)), *xsin = malloc(MAX_T * 44 * sizeof(float));
    float *yout = malloc(MAX_T * 44 * sizeof(float));
    for (size_t j = 0; ok && xin && xsin && yout && st == CLMLA_SUCCESS && j < sizeof(steps) / sizeof(steps[0]); j++) {
        clmla_batch_entry e[S];
        const int n = step_entries(e, seq, steps[j], S);
        step_gather(xin, x, steps[j], done, S);
        step_gather(xsin, xs, steps[j], done, S);
        clmla_forward_args a = {e, n, 0, k->path};
        st = clmla_layer_forward(fl, cache, &a, xin, yout);
        CHECK(st == CLMLA_SUCCESS, "%s: step %zu, full layer: %s", what, j, clmla_last_error(ctx));
        a.cache_layer = 1;
        if (st == CLMLA_SUCCESS)
            st = clmla_layer_forward(sl, cache, &a, xsin, yout);
        CHECK(st == CLMLA_SUCCESS, "%s: step %zu, shared layer: %s", what, j, clmla_last_error(ctx));
        step_scatter(got, yout, steps[j], done, S);
    }
    for (int s = 0; ok && st == CLMLA_SUCCESS && s < S; s++) {
        CHECK(done[s] == lens[s], "%s: sequence %d ran %d of %d tokens", what, s, done[s], lens[s]);
        CHECK_CLOSE(got[s], want[s], (size_t)lens[s] * 44, 44, TOL_F32_CACHE, "%s: sequence %d", what, s);
    }
    clmla_cache_destroy(cache);
    clmla_layer_destroy(fl);
    clmla_layer_destroy(sl);
    for (int s = 0; s < S; s++)
        free(x[s]), free(xs[s]), free(got[s]), free(want[s]);
    free(xin), free(xsin), free(yout);
}

/* The shared layer's configuration: the model's, without an indexer of its own. */
static clmla_layer_config shared_config(const dsa_model *m)
{
    clmla_layer_config c = m->config;
    c.index_n_heads = 0;
    c.index_shared = 1;
    return c;
}

/* The cases over a model made from seed and its shared layer's weights (seed + 2): on the attention
   kernel in force, or (each_kernel) on the work-group and the row-walking ones in turn. */
static void shared_cases(const shared_case *cases, size_t n, uint64_t seed, int each_kernel)
{
    dsa_model m;
    tu_weights sw;
    memset(&sw, 0, sizeof(sw));
    if (model_make(&m, 16, 4, CLMLA_ROPE_INTERLEAVED, seed) == 0) {
        const clmla_layer_config sc = shared_config(&m);
        const int first = each_kernel ? CLMLA_LATENT_GROUP : 0, last = each_kernel ? CLMLA_LATENT_ROWS : 0;
        if (tu_weights_make(&sw, &sc, seed + 2) == 0)
            for (int variant = first; variant <= last; variant++) {
                if (each_kernel)
                    clmla_attention_set_variant(ctx, variant);
                for (size_t i = 0; i < n; i++)
                    shared_run(&m, &sw, &sc, &cases[i]);
            }
        else
            CHECK(0, "out of host memory");
        if (each_kernel)
            clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
    } else {
        CHECK(0, "out of host memory");
    }
    tu_weights_free(&sw);
    model_free(&m);
}

static void part_shared(void)
{
    static const shared_case cases[] = {
        {CLMLA_CACHE_F32, CLMLA_CACHE_F32, CLMLA_PATH_AUTO},
        {CLMLA_CACHE_F32, CLMLA_CACHE_F32, CLMLA_PATH_DECOMPRESSED},
        {CLMLA_CACHE_F16, CLMLA_CACHE_BF16, CLMLA_PATH_ABSORBED},
        {CLMLA_CACHE_BF16, CLMLA_CACHE_FP8, CLMLA_PATH_AUTO},
    };
    shared_cases(cases, sizeof(cases) / sizeof(cases[0]), 41, 0);
}

/* Shared layers over FlashMLA's fp8 latent cache (kv_lora_rank 128), with fp8 index keys, on the
   row-walking and the work-group attention kernels. */
static void part_shared_fp8(void)
{
    static const shared_case cases[] = {{CLMLA_CACHE_FP8, CLMLA_CACHE_FP8, CLMLA_PATH_AUTO},
                                        {CLMLA_CACHE_FP8, CLMLA_CACHE_F32, CLMLA_PATH_DECOMPRESSED}};
    model_rkv = 128;
    shared_cases(cases, sizeof(cases) / sizeof(cases[0]), 67, 1);
    model_rkv = 36;
}

/* Lengths of a sequence in both layers of a two-layer cache. */
static void lengths(clmla_cache *cache, int32_t seq, int *l0, int *l1)
{
    *l0 = *l1 = -1;
    clmla_cache_seq_length(cache, seq, 0, l0);
    clmla_cache_seq_length(cache, seq, 1, l1);
}

/* A shared layer refuses to run over a selection that is not its step's, naming why, and leaves the
   cache as it was. */
static void part_shared_refusals(void)
{
    dsa_model m;
    tu_weights sw;
    memset(&sw, 0, sizeof(sw));
    if (model_make_or_fail(&m, 10, 3, CLMLA_ROPE_INTERLEAVED, 47) != 0)
        return;
    clmla_layer_config sc = shared_config(&m);
    clmla_layer *fl = NULL, *sl = NULL, *other = NULL;
    clmla_cache *cache = NULL;
    clmla_cache_config cc = {2, m.config.kv_lora_rank, m.config.qk_rope_head_dim, BT, 10, CLMLA_CACHE_F32,
                             m.config.index_head_dim, CLMLA_CACHE_F32};
    float *x = tu_random_inputs(8, 44, 77), *y = malloc(8 * 44 * sizeof(float));
    int ok = x && y && tu_weights_make(&sw, &sc, 49) == 0 &&
             clmla_layer_create(ctx, &m.config, &m.layer, &fl) == CLMLA_SUCCESS &&
             clmla_layer_create(ctx, &sc, &sw.layer, &sl) == CLMLA_SUCCESS &&
             clmla_cache_create(ctx, &cc, &cache) == CLMLA_SUCCESS;
    CHECK(ok, "shared refusals: setup: %s", clmla_last_error(ctx));
    /* the configuration: an indexer's heads in a shared layer, and no top-k */
    clmla_layer_config bad = sc;
    bad.index_n_heads = 5;
    CHECK_STATUS(clmla_layer_config_validate(&bad), CLMLA_ERROR_INVALID_CONFIG, NULL);
    CHECK(strstr(clmla_last_error(NULL), "index_shared") && strstr(clmla_last_error(NULL), "index_n_heads"),
          "shared with heads: %s", clmla_last_error(NULL));
    bad = sc;
    bad.index_topk = 0;
    CHECK_STATUS(clmla_layer_config_validate(&bad), CLMLA_ERROR_INVALID_CONFIG, NULL);
    CHECK(strstr(clmla_last_error(NULL), "index_topk"), "shared without top-k: %s", clmla_last_error(NULL));
    int32_t seq = -1, seq2 = -1;
    if (ok)
        ok = clmla_cache_seq_add(cache, &seq) == CLMLA_SUCCESS && clmla_cache_seq_add(cache, &seq2) == CLMLA_SUCCESS;
    int l0, l1;
    if (ok) {
        /* no full layer has run */
        clmla_batch_entry e = {seq, 5};
        clmla_forward_args a = {&e, 1, 1, CLMLA_PATH_AUTO};
        check_refused(sl, cache, &a, x, y, CLMLA_ERROR_INVALID_ARGUMENT, "no full layer has run", NULL,
                      "before any full layer");
        lengths(cache, seq, &l0, &l1);
        CHECK(l0 == 0 && l1 == 0, "a refused step changed the cache: lengths %d, %d", l0, l1);
        /* the full layer's step (5 tokens: selecting past top-k 3), then the shared one with other tokens */
        a.cache_layer = 0;
        CHECK(clmla_layer_forward(fl, cache, &a, x, y) == CLMLA_SUCCESS, "full step: %s", clmla_last_error(ctx));
        clmla_batch_entry other_count = {seq, 4};
        clmla_forward_args b = {&other_count, 1, 1, CLMLA_PATH_AUTO};
        check_refused(sl, cache, &b, x, y, CLMLA_ERROR_INVALID_ARGUMENT, "4 tokens", "5 tokens", "other token count");
        clmla_batch_entry other_seq = {seq2, 5};
        b.entries = &other_seq;
        check_refused(sl, cache, &b, x, y, CLMLA_ERROR_INVALID_ARGUMENT, "sequence 1", "sequence 0", "other sequence");
        clmla_batch_entry two[2] = {{seq, 5}, {seq2, 1}};
        b.entries = two;
        b.num_entries = 2;
        check_refused(sl, cache, &b, x, y, CLMLA_ERROR_INVALID_ARGUMENT, "2 entries", NULL, "another entry count");
        /* a shared layer of another top-k */
        clmla_layer_config sc2 = sc;
        sc2.index_topk = 4;
        CHECK(clmla_layer_create(ctx, &sc2, &sw.layer, &other) == CLMLA_SUCCESS, "top-k 4: %s", clmla_last_error(ctx));
        a.cache_layer = 1;
        if (other) {
            check_refused(other, cache, &a, x, y, CLMLA_ERROR_INVALID_CONFIG, "index_topk 4", "index_topk 3",
                          "another top-k");
        }
        lengths(cache, seq, &l0, &l1);
        CHECK(l0 == 5 && l1 == 0, "refused steps changed the cache: lengths %d, %d", l0, l1);
        /* the right step runs; the same shared step again (stale: its positions moved) is refused */
        CHECK(clmla_layer_forward(sl, cache, &a, x, y) == CLMLA_SUCCESS, "shared step: %s", clmla_last_error(ctx));
        clmla_batch_entry one = {seq, 1};
        clmla_forward_args c = {&one, 1, 1, CLMLA_PATH_AUTO};
        check_refused(sl, cache, &c, x, y, CLMLA_ERROR_INVALID_ARGUMENT, "position 5", "position 0",
                      "the next step without its full layer");
        /* a truncate makes the record stale, even where the positions would match again */
        CHECK(clmla_cache_seq_truncate(cache, seq, 0) == CLMLA_SUCCESS, "truncate: %s", clmla_last_error(ctx));
        check_refused(sl, cache, &a, x, y, CLMLA_ERROR_INVALID_ARGUMENT, "truncated", NULL, "after a truncate");
        lengths(cache, seq, &l0, &l1);
        CHECK(l0 == 0 && l1 == 0, "refused steps changed the cache: lengths %d, %d", l0, l1);
        /* a warm-up of the shared layer runs without a full layer and leaves no record behind */
        clmla_cache *big = NULL;
        cc.num_blocks = (CLMLA_WARMUP_TOKENS + BT - 1) / BT + 1;
        CHECK(clmla_cache_create(ctx, &cc, &big) == CLMLA_SUCCESS, "warm-up cache: %s", clmla_last_error(ctx));
        int32_t s3 = -1;
        if (big) {
            CHECK(clmla_layer_warmup(sl, big, 1) == CLMLA_SUCCESS, "warm-up: %s", clmla_last_error(ctx));
            CHECK(clmla_cache_seq_add(big, &s3) == CLMLA_SUCCESS, "sequence: %s", clmla_last_error(ctx));
            clmla_batch_entry e3 = {s3, 5};
            clmla_forward_args d = {&e3, 1, 1, CLMLA_PATH_AUTO};
            CHECK_STATUS(clmla_layer_forward(sl, big, &d, x, y), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        }
        clmla_cache_destroy(big);
    }
    clmla_cache_destroy(cache);
    clmla_layer_destroy(fl);
    clmla_layer_destroy(sl);
    clmla_layer_destroy(other);
    tu_weights_free(&sw);
    free(x), free(y);
    model_free(&m);
}

/* ---- a model of full and shared layers (clmla_model) ------------------------------------------- */

enum { ML = 4 }; /* layers: full, shared, shared, full */

typedef struct named_tensor {
    const char *name;
    const float *data;
    int64_t rows, cols; /* cols 0: 1-D */
} named_tensor;

/* Appends one layer's tensors (and its indexer's, for a full layer) to t. */
static int layer_tensors(ckpt_tensor *t, char names[][96], int l, const tu_weights *w, const dsa_model *full)
{
    const clmla_layer_config *c = &w->config;
    const int64_t D = c->hidden_size, H = c->num_heads, rq = c->q_lora_rank, rkv = c->kv_lora_rank;
    const int64_t dq = c->qk_nope_head_dim + c->qk_rope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    named_tensor list[12] = {{"q_a_proj.weight", w->q_a_proj, rq, D},
                  {"q_a_layernorm.weight", w->q_a_layernorm, rq, 0},
                  {"q_b_proj.weight", w->q_b_proj, H * dq, rq},
                  {"kv_a_proj_with_mqa.weight", w->kv_a_proj_with_mqa, rkv + dr, D},
                  {"kv_a_layernorm.weight", w->kv_a_layernorm, rkv, 0},
                  {"kv_b_proj.weight", w->kv_b_proj, H * (c->qk_nope_head_dim + dv), rkv},
                  {"o_proj.weight", w->o_proj, D, H * dv}};
    int n = 7;
    if (full) {
        const int64_t HI = full->config.index_n_heads, dI = full->config.index_head_dim;
        list[n++] = (named_tensor){"indexer.wq_b.weight", full->wq, HI * dI, rq};
        list[n++] = (named_tensor){"indexer.wk.weight", full->wk, dI, D};
        list[n++] = (named_tensor){"indexer.k_norm.weight", full->kn, dI, 0};
        list[n++] = (named_tensor){"indexer.k_norm.bias", full->kb, dI, 0};
        list[n++] = (named_tensor){"indexer.weights_proj.weight", full->ww, HI, D};
    }
    for (int i = 0; i < n; i++) {
        snprintf(names[i], 96, "model.layers.%d.self_attn.%s", l, list[i].name);
        t[i].name = names[i];
        t[i].dtype = "F32";
        t[i].ndim = list[i].cols ? 2 : 1;
        t[i].shape[0] = list[i].rows;
        t[i].shape[1] = list[i].cols;
        t[i].data = list[i].data;
        t[i].bytes = (size_t)list[i].rows * (size_t)(list[i].cols ? list[i].cols : 1) * sizeof(float);
    }
    return n;
}

/* clmla_model_run's callback: the next attention's input is that layer's own inputs (each layer has a
   reference of its own); stop_after > 0 stops the step after that attention. */
typedef struct next_inputs {
    float *x[ML]; /* [ML][T, D] */
    size_t bytes; /* of one layer's inputs */
    int calls, stop_after;
} next_inputs;

static int run_between(void *user, int index, const float *out, float *x)
{
    next_inputs *n = user;
    (void)out;
    n->calls++;
    if (n->stop_after && index == n->stop_after)
        return 1;
    memcpy(x, n->x[index + 1], n->bytes);
    return 0;
}

/* Steps of one sequence through every attention of a model, attention by attention, each on its
   own layer's inputs x[l]; got[l] against want[l]. */
static void model_steps(clmla_model *model, int32_t seq, const int *chunks, float *const *x, float *const *got, float *xin,
                        double *const *want, const char *what)
{
    int ok = 1, T = 0;
    for (int i = 0, at = 0; ok && chunks[i] > 0; at += chunks[i], i++) {
        const clmla_batch_entry e = {seq, chunks[i]};
        for (int l = 0; ok && l < ML; l++) {
            memcpy(xin, x[l] + (size_t)at * 44, (size_t)chunks[i] * 44 * sizeof(float));
            ok = clmla_model_forward(model, l, &e, 1, CLMLA_PATH_AUTO, xin, got[l] + (size_t)at * 44) == CLMLA_SUCCESS;
            CHECK(ok, "%s: step at %d, attention %d: %s", what, at, l, clmla_last_error(ctx));
        }
        T = at + chunks[i];
    }
    for (int l = 0; ok && l < ML; l++)
        CHECK_CLOSE(got[l], want[l], (size_t)T * 44, 44, TOL_F32_CACHE, "%s: attention %d", what, l);
}

static void part_model(void)
{
    dsa_model m0, m3;
    tu_weights w1, w2;
    memset(&w1, 0, sizeof(w1));
    memset(&w2, 0, sizeof(w2));
    char dir[512] = "";
    int ok = model_make(&m0, 16, 4, CLMLA_ROPE_INTERLEAVED, 51) == 0 && model_make(&m3, 16, 4, CLMLA_ROPE_INTERLEAVED, 53) == 0;
    const clmla_layer_config sc = shared_config(&m0);
    ok = ok && tu_weights_make(&w1, &sc, 55) == 0 && tu_weights_make(&w2, &sc, 57) == 0 &&
         ckpt_make_temp_dir(dir, sizeof(dir), "dsa-model") == 0;
    CHECK(ok, "model: setup");
    /* the folder: config.json with the indexer's fields and indexer_types, one safetensors file */
    char *json = ok ? ckpt_config_json(&m0.config, ML, "glm_moe_dsa", 1, 0) : NULL;
    char *cfg = json ? malloc(strlen(json) + 256) : NULL;
    if (cfg) {
        char *end = strrchr(json, '}');
        *end = '\0';
        sprintf(cfg, "%s, \"index_n_heads\": 5, \"index_head_dim\": 16, \"index_topk\": 4, \"indexer_types\": "
                     "[\"full\", \"shared\", \"shared\", \"full\"]}",
                json);
    }
    ckpt_tensor t[48];
    char names[48][96];
    int nt = 0;
    const tu_weights *ws[ML] = {&m0.base, &w1, &w2, &m3.base};
    const dsa_model *fulls[ML] = {&m0, NULL, NULL, &m3};
    for (int l = 0; ok && l < ML; l++)
        nt += layer_tensors(t + nt, names + nt, l, ws[l], fulls[l]);
    char path[600];
    ok = ok && cfg && ckpt_write_text(ckpt_path(path, sizeof(path), dir, "config.json"), cfg) == 0 &&
         ckpt_write_safetensors(ckpt_path(path, sizeof(path), dir, "model.safetensors"), t, nt) == 0;
    CHECK(ok, "model: writing the folder");
    free(json);
    free(cfg);

    /* a range that starts on a shared layer names both layers; a shared layer alone loads as one */
    clmla_model *model = NULL;
    clmla_model_spec spec;
    memset(&spec, 0, sizeof(spec));
    spec.first_layer = 1;
    spec.num_blocks = 8;
    spec.block_tokens = BT;
    if (ok) {
        CHECK_STATUS(clmla_model_create(ctx, dir, &spec, &model), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK(!model && strstr(clmla_last_error(ctx), "layer 1 is a \"shared\"") &&
                  strstr(clmla_last_error(ctx), "start the range at layer 0"),
              "range from a shared layer: %s", clmla_last_error(ctx));
        clmla_model_options mo;
        memset(&mo, 0, sizeof(mo));
        mo.layer = 2;
        clmla_layer *one = NULL;
        clmla_layer_config got;
        CHECK(clmla_layer_create_from_model_opts(ctx, dir, &mo, &one) == CLMLA_SUCCESS &&
                  clmla_layer_get_config(one, &got) == CLMLA_SUCCESS && got.index_shared == 1 && got.index_n_heads == 0 &&
                  got.index_topk == 4,
              "layer 2 alone: %s", clmla_last_error(ctx));
        clmla_layer_destroy(one);
    }
    spec.first_layer = 0;
    spec.num_blocks = 12;
    ok = ok && clmla_model_create(ctx, dir, &spec, &model) == CLMLA_SUCCESS;
    CHECK(ok, "model: %s", clmla_last_error(ctx));
    int count = 0;
    clmla_model_attention info[ML];
    static const clmla_attention_kind kinds[ML] = {CLMLA_ATTENTION_INDEXED, CLMLA_ATTENTION_SHARED,
                                                   CLMLA_ATTENTION_SHARED, CLMLA_ATTENTION_INDEXED};
    static const int sources[ML] = {-1, 0, 0, -1};
    if (ok) {
        CHECK(clmla_model_num_attentions(model, &count) == CLMLA_SUCCESS && count == ML, "attentions: %d", count);
        for (int i = 0; i < ML && i < count; i++) {
            CHECK(clmla_model_attention_info(model, i, &info[i]) == CLMLA_SUCCESS && info[i].layer == i &&
                      info[i].cache_layer == i && info[i].kind == kinds[i] && info[i].source == sources[i],
                  "attention %d: layer %d, cache layer %d, kind %d, source %d", i, info[i].layer, info[i].cache_layer,
                  (int)info[i].kind, info[i].source);
        }
        /* index keys only for the two full layers */
        clmla_cache *cache = NULL;
        clmla_cache_info ci;
        CHECK(clmla_model_cache(model, &cache) == CLMLA_SUCCESS && clmla_cache_get_info(cache, &ci) == CLMLA_SUCCESS &&
                  ci.bytes_total == (4 * ci.bytes_per_token_per_layer + 2 * ci.index_bytes_per_token_per_layer) * 12 * BT &&
                  ci.index_bytes_per_token_per_layer == 16 * sizeof(float),
              "the model's cache: %zu bytes", ci.bytes_total);
    }

    /* steps through the model (clmla_model_run), every layer against its reference */
    enum { T = 10 };
    static const int chunks[] = {3, 4, 1, 1, 1, 0};
    float *x[ML];
    double *want[ML];
    float *got[ML];
    int32_t *sel = malloc((size_t)T * 4 * sizeof(int32_t));
    for (int l = 0; l < ML; l++) {
        x[l] = tu_random_inputs(T, 44, 700 + (uint64_t)l);
        want[l] = malloc((size_t)T * 44 * sizeof(double));
        got[l] = calloc((size_t)T * 44, sizeof(float));
        ok = ok && x[l] && want[l] && got[l];
    }
    for (int l = 0; ok && l < ML; l++) {
        int ambiguous = -1;
        if (fulls[l])
            ok = idx_ref_dsa_forward(&ws[l]->ref_config, NULL, &ws[l]->ref, &fulls[l]->icfg, &fulls[l]->iref, 4,
                                     MLA_REF_CACHE_F32, T, x[l], want[l], l == 0 ? sel : NULL, &ambiguous) == 0 &&
                 ambiguous == 0;
        else
            ok = idx_ref_shared_forward(&ws[l]->ref_config, NULL, &ws[l]->ref, 4, T, x[l], sel, want[l]) == 0;
        CHECK(ok, "model: reference of layer %d (%d ambiguous)", l, ambiguous);
    }
    clmla_cache *cache = NULL;
    int32_t seq = -1;
    if (ok)
        ok = clmla_model_cache(model, &cache) == CLMLA_SUCCESS && clmla_cache_seq_add(cache, &seq) == CLMLA_SUCCESS;
    float *xin = malloc((size_t)T * 44 * sizeof(float)), *yout = malloc((size_t)T * 44 * sizeof(float));
    if (ok && xin && yout)
        model_steps(model, seq, chunks, x, got, xin, want, "model from the folder");

    /* the same layers as a model of the caller's layers, over a cache of its own; a shared layer
       first is refused */
    clmla_layer *ls[ML];
    for (int l = 0; ok && l < ML; l++)
        ok = clmla_model_layer(model, l, &ls[l]) == CLMLA_SUCCESS;
    clmla_model *mine = NULL;
    if (ok) {
        CHECK_STATUS(clmla_model_create_from_layers(ctx, ls + 1, 2, &spec, &mine), CLMLA_ERROR_INVALID_CONFIG, ctx);
        CHECK(!mine && strstr(clmla_last_error(ctx), "layer 0 is a shared"), "from layers, shared first: %s",
              clmla_last_error(ctx));
        ok = clmla_model_create_from_layers(ctx, ls, ML, &spec, &mine) == CLMLA_SUCCESS;
        CHECK(ok, "from layers: %s", clmla_last_error(ctx));
        clmla_model_attention a;
        for (int l = 0; ok && l < ML; l++)
            CHECK(clmla_model_attention_info(mine, l, &a) == CLMLA_SUCCESS && a.kind == kinds[l] && a.source == sources[l],
                  "from layers: attention %d kind %d source %d", l, (int)a.kind, a.source);
        clmla_cache *c2 = NULL;
        int32_t s2 = -1;
        if (ok && clmla_model_cache(mine, &c2) == CLMLA_SUCCESS && clmla_cache_seq_add(c2, &s2) == CLMLA_SUCCESS)
            model_steps(mine, s2, chunks, x, got, xin, want, "model of the caller's layers");
    }
    clmla_model_destroy(mine); /* the layers stay the folder model's */

    /* the order is checked: a shared attention before its source in a step names both */
    const clmla_batch_entry one = {seq, 1};
    if (ok) {
        CHECK_STATUS(clmla_model_forward(model, 2, &one, 1, CLMLA_PATH_AUTO, xin, yout), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK(strstr(clmla_last_error(ctx), "attention 2 (decoder layer 2)") &&
                  strstr(clmla_last_error(ctx), "attention 0 (decoder layer 0)") &&
                  strstr(clmla_last_error(ctx), "attention 3's"),
              "shared before its source: %s", clmla_last_error(ctx));
        int len = -1;
        clmla_cache_seq_length(cache, seq, 2, &len);
        CHECK(len == T, "a refused step changed the cache: %d tokens", len);
        CHECK_STATUS(clmla_model_forward(model, 4, &one, 1, CLMLA_PATH_AUTO, xin, yout), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK(strstr(clmla_last_error(ctx), "out of range"), "attention 4: %s", clmla_last_error(ctx));
    }
    /* clmla_model_run: a whole step through every attention with the callback between them; a
       callback that stops the step names the attention */
    if (ok) {
        CHECK(clmla_cache_seq_truncate(cache, seq, 0) == CLMLA_SUCCESS, "truncate: %s", clmla_last_error(ctx));
        next_inputs n;
        memset(&n, 0, sizeof(n));
        for (int l = 0; l < ML; l++)
            n.x[l] = x[l];
        n.bytes = (size_t)T * 44 * sizeof(float);
        const clmla_batch_entry all = {seq, T};
        memcpy(xin, x[0], (size_t)T * 44 * sizeof(float));
        CHECK_STATUS(clmla_model_run(model, &all, 1, CLMLA_PATH_AUTO, xin, yout, NULL, NULL), CLMLA_ERROR_INVALID_ARGUMENT,
                     ctx);
        CHECK(strstr(clmla_last_error(ctx), "between is NULL"), "run without between: %s", clmla_last_error(ctx));
        ok = clmla_model_run(model, &all, 1, CLMLA_PATH_AUTO, xin, yout, run_between, &n) == CLMLA_SUCCESS;
        CHECK(ok && n.calls == ML - 1, "model run: %s (%d calls)", clmla_last_error(ctx), n.calls);
        if (ok)
            CHECK_CLOSE(yout, want[ML - 1], (size_t)T * 44, 44, TOL_F32_CACHE, "model run: the last attention");
        CHECK(clmla_cache_seq_truncate(cache, seq, 0) == CLMLA_SUCCESS, "truncate: %s", clmla_last_error(ctx));
        n.calls = 0;
        n.stop_after = 1;
        memcpy(xin, x[0], (size_t)T * 44 * sizeof(float));
        CHECK_STATUS(clmla_model_run(model, &all, 1, CLMLA_PATH_AUTO, xin, yout, run_between, &n),
                     CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK(strstr(clmla_last_error(ctx), "after attention 1"), "a stopped run: %s", clmla_last_error(ctx));
    }
    /* the cache holds no index keys for the shared layers: reading them is refused; a fork's copy on
       write copies the index keys only of the layers that hold some */
    if (ok) {
        float keys[16];
        int32_t fork = -1;
        CHECK_STATUS(clmla_cache_read_index(cache, 1, seq, 0, 1, keys), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK(strstr(clmla_last_error(ctx), "layer 1 holds no index keys"), "index keys of a shared layer: %s",
              clmla_last_error(ctx));
        CHECK(clmla_cache_seq_truncate(cache, seq, 0) == CLMLA_SUCCESS, "truncate: %s", clmla_last_error(ctx));
        const clmla_batch_entry five = {seq, 5};
        for (int l = 0; ok && l < ML; l++)
            ok = clmla_model_forward(model, l, &five, 1, CLMLA_PATH_AUTO, x[l], yout) == CLMLA_SUCCESS;
        ok = ok && clmla_cache_seq_fork(cache, seq, &fork) == CLMLA_SUCCESS;
        const clmla_batch_entry next = {fork, 1};
        for (int l = 0; ok && l < ML; l++)
            ok = clmla_model_forward(model, l, &next, 1, CLMLA_PATH_AUTO, x[l] + 5 * 44, yout) == CLMLA_SUCCESS;
        CHECK(ok, "a fork's step through the model: %s", clmla_last_error(ctx));
        if (ok) /* the fork's token 5 of the last layer is the reference's: it saw the copied block */
            CHECK_CLOSE(yout, want[ML - 1] + 5 * 44, 44, 44, TOL_F32_CACHE, "model: a fork's step");
    }
    clmla_model_destroy(model);
    for (int l = 0; l < ML; l++)
        free(x[l]), free(want[l]), free(got[l]);
    free(sel), free(xin), free(yout);
    if (dir[0])
        ckpt_remove_dir(dir);
    tu_weights_free(&w1);
    tu_weights_free(&w2);
    model_free(&m0);
    model_free(&m3);
}

int main(int argc, char **argv)
{
    static const tu_part parts[] = {
        {"sequence", part_sequence}, {"batch", part_batch}, {"dense", part_dense}, {"topk1", part_topk1}, {"group", part_group},
        {"select", part_select}, {"fp8-latent", part_fp8_latent}, {"pieces", part_pieces},
        {"refusals", part_refusals}, {"shared", part_shared}, {"shared-fp8", part_shared_fp8},
        {"shared-refusals", part_shared_refusals},
        {"model", part_model}};
    return tu_parts_exit(tu_run_parts(argc, argv, parts, sizeof(parts) / sizeof(parts[0]), NULL, &ctx, &check_failed));
}
