/* One MLA attention layer: weights on the device and the forward step (docs/MLA.md section 2).
 *
 * A step over T new tokens of several sequences:
 *   q  = x W_q^T                    or  c^Q = RMSNorm(x W_qa^T), q = c^Q W_qb^T      [T, H*dq]
 *   kv = x W_kva^T, RMSNorm of its first rkv columns                                [T, rkv+dr]
 *   RoPE on q's rope dims and on kv's k^R; c^KV and k^R written to the paged cache
 *   absorbed entries:     q~ = q^C W^UK (per head), latent attention, o = o-bar W^UV^T
 *   decompressed entries: gather the sequence's cache rows, [k^C v^C] = c^KV W^UKV^T,
 *                         causal attention with head dims dq / dv
 *   out = o W_o^T                                                                   [T, D]
 * A sparse-attention layer (an indexer: DeepSeek-V3.2, GLM-5) also writes each new token's index key
 * k = RoPE(LayerNorm(x W_k^T)) into the cache's index-key cache, and in a step where some query sees
 * more than index_topk keys, scores every visible key per token (queries RoPE(c^Q W_q^T), weights
 * x W_w^T), keeps the index_topk best, and attends over those keys only, on either path (the
 * decompressed kernels built with -D SPARSE walk each query's list beside the keys). */
#include "attention.h"
#include "clcall.h"
#include "gemm.h"
#include "indexer.h"
#include "program.h"
#include "layer_config.h"
#include "rope.h"
#include "scratch.h"
#include "kernel_tuning.h"
#include "weight.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tables a step writes to the device: [T] rows of the RoPE table by token, query scales (when
   the layer has them), cache slots, the entry of each token and its context length for latent
   attention (0 on the decompressed path); [entries, max_blocks] the entries' block tables; in
   indexer layers [T] the keys each token sees, for the selection; [T] the first row of each
   token's entry, for latent attention's multi-token groups. */
typedef enum step_table {
    TABLE_POSITIONS, TABLE_QSCALE, TABLE_SLOTS, TABLE_TOKEN_SEQ, TABLE_TOKEN_CTX, TABLE_BLOCKS,
    TABLE_VISIBLE, /* indexer layers: [T] keys each token sees (its position + 1), for the selection */
    TABLE_TOKEN_FIRST,
    STEP_TABLES
} step_table;

/* The decompressed path's attention: the one kernel the context runs (build_prefill), attn_prefill_rows
   (CPUs), or attn_prefill_tiled where the latent tuning asks for it (prefill_tiled) and a block fits,
   else attn_prefill; a launch gives each work-group of `items` items `queries` queries. */
typedef struct prefill_kernels {
    cl_kernel kernel;
    int rows, tiled; /* kernel is attn_prefill_rows, attn_prefill_tiled */
    int items, queries;
} prefill_kernels;

struct clmla_layer {
    clmla_context *ctx;
    clmla_layer_config config; /* defaults resolved */
    int D, H, rq, rkv, dn, dr, dv, dq, row;
    float scale;
    /* projections in their weights dtype, checkpoint layout (weight.h; packed on CPU devices but
       kv_b_proj, which the absorbed path reads by head) */
    /* qkv_a: the two products of the hidden state in one matrix, [q_proj (or q_a_proj);
       kv_a_proj_with_mqa], qa_rows + row rows of D: one launch reads both (docs/DESIGN.md; the
       numbers in docs/perf-log.md, "Products") */
    clmla_weight qkv_a, q_b_proj, kv_b_proj, o_proj;
    cl_mem q_a_layernorm, kv_a_layernorm; /* float32 */
    /* where kv_a_proj_with_mqa's rows start in qkv_a: the rows of q_proj (H*dq) or q_a_proj (rq),
       rounded up to a multiple of 128 for fp8 (its block scales); qa_rows + row */
    int qa_rows, qkv_ld;
    /* optional biases (attention_bias): [qkv_ld] for the stacked product (zeros over q_proj's
       columns, which never have one), [D] for o_proj; NULL when the layer has none */
    cl_mem qkv_bias, o_bias;
    /* RoPE (A cos, A sin) for positions [0, rope_positions); LongRoPE's long factors in a second
       block of as many rows after the short ones */
    cl_mem rope_table;
    int rope_positions;
    cl_kernel rmsnorm, rope;
    /* decompressed attention: [0] dense, [1] with -D SPARSE (indexer layers only) */
    prefill_kernels prefill[2];
    cl_kernel add_bias;
    int rmsnorm_threads;
    int auto_threshold;
    double auto_chunk_keys; /* AUTO: keys each of the entry's own tokens counts as in the decompressed cost (auto_threshold_of) */
    /* The tables a step writes for its kernels (step_table, parts of one staged block, scratch.h),
       kept between steps (docs/DESIGN.md, "Step buffers"); `written` is the completion of the last
       step's writes, which the host waits for before it rewrites the block. */
    clmla_staged tables;
    cl_event written;
    /* The lightning indexer (config.index_n_heads > 0, else all 0): its heads, head dim and top-k,
       the three products (W_q of c^Q, W_k and W_w of x) and the key LayerNorm's weight and bias.
       Its kernels depend on the cache's blocks and key dtype: the cache keeps them
       (clmla_index_kernels_for), built at the first step with it or by clmla_layer_warmup. */
    int HI, dI, topk;
    /* a shared layer (config.index_shared; HI 0, topk the model's): its steps attend to the cache's
       selection record (cache.h, cache_selection). `warming`: clmla_layer_warmup's steps, which
       attend to a selection of their own instead. */
    int shared, warming;
    clmla_weight idx_wq, idx_wk, idx_ww;
    cl_mem idx_norm_w, idx_norm_b;
    /* host only, [3, entries]: each entry's first row, cached prefix and path (step_plan) */
    int *entry_info;
    int entry_info_capacity;
};

/* The layer attends to index_topk selected keys in a step where some query sees more: it has an
   indexer, or it is a shared layer. */
static int selects(const clmla_layer *L)
{
    return L->HI > 0 || L->shared;
}

/* ---- weights -------------------------------------------------------------------------------- */

/* Tensor `name`.`kind` ("weight" or "bias") must have shape [rows, cols], or [rows] when cols is
   0; a missing one is an error unless optional. */
static clmla_status check_shape(clmla_context *ctx, const char *name, const char *kind, const clmla_tensor *t, int64_t rows,
                                int64_t cols, int optional)
{
    if (!t->data)
        return optional ? CLMLA_SUCCESS
                        : clmla_fail(ctx, CLMLA_ERROR_MISSING_TENSOR, "missing tensor %s.%s (expected shape [%lld%s%lld])",
                                     name, kind, (long long)rows, cols ? ", " : "", (long long)cols);
    const int want_ndim = cols ? 2 : 1;
    if (t->ndim != want_ndim || t->shape[0] != rows || (cols && t->shape[1] != cols)) {
        char got[64], want[64];
        clmla_tensor_shape_text(t, got, sizeof(got));
        clmla_tensor expected = {NULL, want_ndim, {rows, cols}, CLMLA_DTYPE_F32, NULL};
        clmla_tensor_shape_text(&expected, want, sizeof(want));
        return clmla_fail(ctx, CLMLA_ERROR_SHAPE_MISMATCH, "tensor %s.%s has shape %s, expected %s", name, kind, got, want);
    }
    return CLMLA_SUCCESS;
}

static clmla_status check_tensor(clmla_context *ctx, const char *name, const clmla_tensor *t, int64_t rows, int64_t cols)
{
    return check_shape(ctx, name, "weight", t, rows, cols, 0);
}

/* Which part of a head-sharded weight a tensor-parallel shard keeps (docs/MODELS.md, "Tensor-parallel
   shards"): rows (q_b_proj, q_proj, kv_b_proj) or columns (o_proj) of heads [h0, h0 + heads), `per`
   of them per head. */
typedef struct head_slice {
    int64_t h0, heads, heads_total, per;
    int columns;
} head_slice;

/* Weight `name` of a shard must be the whole tensor [rows, cols] (the shard keeps its slice) or the
   shard's slice already (heads_total / heads times fewer rows or columns); *b is the block it keeps. */
static clmla_status check_sharded(clmla_context *ctx, const char *name, const clmla_tensor *t, int64_t rows, int64_t cols,
                                  const head_slice *s, size_t block[4] /* r0, rows, c0, cols */)
{
    if (s->heads == s->heads_total) {
        block[0] = 0, block[1] = (size_t)rows, block[2] = 0, block[3] = (size_t)cols;
        return check_tensor(ctx, name, t, rows, cols);
    }
    const int64_t part = s->heads * s->per, start = s->h0 * s->per;
    const int64_t srows = s->columns ? rows : part, scols = s->columns ? part : cols;
    if (t->data && t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols) {
        block[0] = s->columns ? 0 : (size_t)start, block[1] = (size_t)srows;
        block[2] = s->columns ? (size_t)start : 0, block[3] = (size_t)scols;
        return CLMLA_SUCCESS;
    }
    if (t->data && t->ndim == 2 && t->shape[0] == srows && t->shape[1] == scols) {
        block[0] = 0, block[1] = (size_t)srows, block[2] = 0, block[3] = (size_t)scols;
        return CLMLA_SUCCESS;
    }
    char got[64] = "";
    clmla_tensor_shape_text(t, got, sizeof(got));
    return clmla_fail(ctx, t->data ? CLMLA_ERROR_SHAPE_MISMATCH : CLMLA_ERROR_MISSING_TENSOR,
                      "%s %s.weight%s%s: tensor-parallel shard %lld of %lld (%lld of %lld heads) takes the whole tensor "
                      "[%lld, %lld] or its slice [%lld, %lld]",
                      t->data ? "tensor" : "missing tensor", name, t->data ? " has shape " : "", t->data ? got : "",
                      (long long)(s->h0 / s->heads), (long long)(s->heads_total / s->heads), (long long)s->heads,
                      (long long)s->heads_total, (long long)rows, (long long)cols, (long long)srows, (long long)scols);
}

/* A float32 1-D weight (norms, biases) to the device. */
static clmla_status upload_weight(clmla_context *ctx, const char *name, const clmla_tensor *t, cl_mem *buffer)
{
    char full[128];
    snprintf(full, sizeof(full), "%s.weight", name);
    return clmla_weight_copy(ctx, full, t->data, (size_t)t->shape[0] * sizeof(float), buffer);
}

/* A 1-D weight as float32, multiplied by `scale` (1: its values as given). */
static clmla_status upload_scaled(clmla_context *ctx, const char *name, const clmla_tensor *t, double scale, cl_mem *buffer)
{
    const float *values = NULL;
    float *owned = NULL;
    clmla_status st = clmla_tensor_values(ctx, name, t, &values, &owned);
    if (st != CLMLA_SUCCESS)
        return st;
    const size_t n = (size_t)t->shape[0];
    float *scaled = scale == 1.0 ? NULL : malloc(n * sizeof(float));
    if (scale != 1.0 && !scaled) {
        free(owned);
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "scaling %s.weight: out of host memory", name);
    }
    for (size_t i = 0; scaled && i < n; i++)
        scaled[i] = (float)((double)values[i] * scale);
    const clmla_tensor s = clmla_tensor_1d(scaled ? scaled : values, (int64_t)n);
    st = upload_weight(ctx, name, &s, buffer);
    free(scaled);
    free(owned);
    return st;
}

/* The biases of the stacked product ([q_a_proj or q_proj; kv_a_proj_with_mqa]) and of o_proj. */
static clmla_status upload_biases(clmla_layer *L, const clmla_layer_weights *w)
{
    clmla_context *ctx = L->ctx;
    if (w->q_a_proj_bias.data || w->kv_a_proj_with_mqa_bias.data) {
        float *stacked = calloc((size_t)L->qkv_ld, sizeof(float));
        if (!stacked)
            return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "stacking the biases: out of host memory");
        const struct {
            const clmla_tensor *t;
            const char *name;
            int at, n;
        } parts[2] = {{&w->q_a_proj_bias, "q_a_proj.bias", 0, L->rq},
                      {&w->kv_a_proj_with_mqa_bias, "kv_a_proj_with_mqa.bias", L->qa_rows, L->row}};
        clmla_status st = CLMLA_SUCCESS;
        for (int i = 0; i < 2 && st == CLMLA_SUCCESS; i++) {
            const float *values = NULL;
            float *owned = NULL;
            if (!parts[i].t->data)
                continue;
            st = clmla_tensor_values(ctx, parts[i].name, parts[i].t, &values, &owned);
            if (st == CLMLA_SUCCESS)
                memcpy(stacked + parts[i].at, values, (size_t)parts[i].n * sizeof(float));
            free(owned);
        }
        const clmla_tensor t = clmla_tensor_1d(stacked, L->qkv_ld);
        if (st == CLMLA_SUCCESS)
            st = upload_weight(ctx, "q_a_proj+kv_a_proj_with_mqa bias", &t, &L->qkv_bias);
        free(stacked);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    /* The shards' outputs are summed: only rank 0 adds o_proj's bias. */
    if (w->o_proj_bias.data && L->config.tp_rank == 0)
        return upload_scaled(ctx, "o_proj.bias", &w->o_proj_bias, 1.0, &L->o_bias);
    return CLMLA_SUCCESS;
}

/* rmsnorm's local memory (cl/rmsnorm.cl): a partial sum per item */
static size_t rmsnorm_local_bytes(int items, const void *arg)
{
    (void)arg;
    return (size_t)items * sizeof(float);
}

/* attn_prefill_tiled's local memory (cl/attn_prefill.cl) with blocks of bq queries, tiles of bk keys
   staged kc dimensions at a time: the block's queries, a key chunk or the tile's values (the larger),
   the weights, and two floats a query. */
static size_t tiled_local_bytes(const clmla_layer *L, int bq, int bk, int kc)
{
    const size_t q4 = (size_t)(L->dq + 3) / 4 + 1, k4 = (size_t)kc / 4 + 1, v4 = (size_t)L->dv / 4;
    const size_t kv4 = (size_t)bk * (k4 > v4 ? k4 : v4);
    return ((size_t)bq * q4 + kv4) * 16 + (size_t)bq * (size_t)(bk + 1) * 4 + 2 * (size_t)bq * 4;
}

/* attn_prefill_tiled into pk when the tuning tn asks for it and a block fits, else pk left empty.
   The tuning's tile of keys and chunk of dimensions; its block of queries, or the largest smaller
   one whose local memory and work-group (queries / 2 x keys / 4 items) fit the device. */
static clmla_status build_prefill_tiled(clmla_layer *L, const clmla_latent_tuning *tn, prefill_kernels *pk)
{
    clmla_context *ctx = L->ctx;
    if (!tn->prefill_tiled || L->dv % 4)
        return CLMLA_SUCCESS;
    const int bk = tn->prefill_keys, kc = tn->prefill_chunk;
    for (int bq = tn->prefill_queries; bq >= 4; bq /= 2) {
        const int items = bq / 2 * (bk / 4);
        if ((size_t)items > ctx->info.max_work_group_size || tiled_local_bytes(L, bq, bk, kc) > ctx->info.local_mem_bytes)
            continue;
        char options[256];
        snprintf(options, sizeof(options), "-D DN=%d -D DR=%d -D DV=%d -D TILED -D BQ=%d -D BK=%d -D KC=%d", L->dn, L->dr,
                 L->dv, bq, bk, kc);
        pk->tiled = 1;
        pk->queries = bq;
        pk->items = items;
        return clmla_kernel_create(ctx, "attn_prefill", options, "attn_prefill_tiled", &pk->kernel);
    }
    clmla_log(ctx, CLMLA_LOG_INFO, "attn_prefill_tiled: no block of queries fits this device with tiles of %d keys; "
              "attn_prefill runs", bk);
    return CLMLA_SUCCESS;
}

/* The decompressed path's attention kernel that the context's attention kernels select, built with
   `extra` build options: where the row kernels run (CPUs) attn_prefill_rows with the latent tuning's
   prefill_rows_queries queries per item; elsewhere, for dense steps, attn_prefill_tiled where it
   applies (build_prefill_tiled), else attn_prefill with NT queries per group (up to 32) and KT keys
   staged in local memory. */
static clmla_status build_prefill(clmla_layer *L, const char *extra, prefill_kernels *pk, int dense)
{
    clmla_context *ctx = L->ctx;
    clmla_latent_tuning tn;
    clmla_latent_tuning_for(ctx, L->H, &tn);
    char options[256];
    if (clmla_attention_variant(ctx) == CLMLA_LATENT_ROWS) {
        pk->rows = 1;
        pk->items = 1;
        pk->queries = tn.prefill_rows_queries;
        snprintf(options, sizeof(options), "-D DN=%d -D DR=%d -D DV=%d -D QBC=%d%s", L->dn, L->dr, L->dv, pk->queries,
                 extra);
        return clmla_kernel_create(ctx, "attn_prefill", options, "attn_prefill_rows", &pk->kernel);
    }
    if (dense) {
        const clmla_status st = build_prefill_tiled(L, &tn, pk);
        if (st != CLMLA_SUCCESS || pk->kernel)
            return st;
    }
    int kt = 16;
    while (kt > 1 && (size_t)kt * (L->dq + L->dv) * sizeof(float) > ctx->info.local_mem_bytes / 2)
        kt /= 2;
    snprintf(options, sizeof(options), "-D DN=%d -D DR=%d -D DV=%d -D KT=%d%s", L->dn, L->dr, L->dv, kt, extra);
    const clmla_kernel_fit fit = {"attn_prefill", "attn_prefill", options, "NT", 32, 1, NULL, NULL};
    clmla_status st = clmla_kernel_create_fitted(ctx, &fit, &pk->kernel, &pk->items);
    if (st == CLMLA_SUCCESS && !pk->kernel)
        st = clmla_fail(ctx, CLMLA_ERROR_UNSUPPORTED, "attn_prefill%s: no work-group size fits this device", extra);
    pk->queries = pk->items; /* one query an item */
    return st;
}

static clmla_status build_kernels(clmla_layer *L)
{
    clmla_context *ctx = L->ctx;
    char options[256];
    /* A row per work-group. Each item's loads run in turn, and a GPU waits out each one's latency:
       64 items took 6.5 us for V2-Lite's 512 latent values and 14 us for V3's 1536 query latents on
       an H100 (docs/perf-log.md), so GPUs take 512 items (one to three values each); CPU devices
       run a group's items as loops and keep 64. */
    const clmla_kernel_fit norm_fit = {"rmsnorm", "rmsnorm", "", "WG", ctx->info.kind == CLMLA_DEVICE_KIND_CPU ? 64 : 512,
                                       1, rmsnorm_local_bytes, NULL};
    clmla_status st = clmla_kernel_create_fitted(ctx, &norm_fit, &L->rmsnorm, &L->rmsnorm_threads);
    if (st == CLMLA_SUCCESS && !L->rmsnorm)
        st = clmla_fail(ctx, CLMLA_ERROR_UNSUPPORTED, "rmsnorm: no work-group size fits this device");
    if (st != CLMLA_SUCCESS)
        return st;
    snprintf(options, sizeof(options), "-D DR=%d%s%s", L->dr, L->config.rope_pairing == CLMLA_ROPE_HALF_SPLIT ? " -D HALF_SPLIT" : "",
             L->config.query_scale_beta != 0 ? " -D QSCALE" : "");
    st = clmla_kernel_create(ctx, "rope", options, "rope", &L->rope);
    if (st != CLMLA_SUCCESS)
        return st;
    if (L->qkv_bias || L->o_bias) {
        st = clmla_kernel_create(ctx, "bias", "", "add_bias", &L->add_bias);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    st = build_prefill(L, "", &L->prefill[0], 1);
    if (st == CLMLA_SUCCESS && selects(L)) /* a selecting layer's decompressed entries in sparse steps */
        st = build_prefill(L, " -D SPARSE", &L->prefill[1], 0);
    return st;
}

/* Which path AUTO takes for a dense entry (docs/DESIGN.md, "Which path"). Per query token the
   absorbed path costs X = 2 rkv H (dn + dv) FLOPs (W^UK into the query, W^UV after the sum), per
   (query, key) pair A = 2 H (2 rkv + dr); the decompressed path costs X per key (up-projecting it)
   and D = 2 H (dq + dv) per pair. An entry of t tokens after a prefix of p has p + t keys and
   t (p + (t + 1) / 2) causal pairs, so decompressing pays once pairs (A - D) >= p X, that is
   t (p + (t + 1) / 2) >= p n with n = X / (A - D): about n tokens after a long prefix, fewer after
   a short one, any number after none. n is the layer's auto_threshold (171 for DeepSeek's head
   dims by the FLOPs alone). Each part is weighted by the speed its kernels reached:
   - CPU devices, PoCL (V2-Lite, the AVX-512 EPYC, 2026-11-26): absorbed pairs ran at 1.12 and
     decompressed pairs at 0.47 times the FLOP rate of the up-projection, which gives n = 452 for
     DeepSeek's dims (the measured crossovers: 150-250 tokens after 256, 300-450 after 1024,
     500-1000 after 4096). Where the latent tuning runs attn_latent_lanes (rows_lanes, 16 heads
     or more) absorbed pairs are faster: on the Intel Xeon (V2-Lite, 2026-11-28, two tokens an
     item) the paths were even at about 1000 tokens after 1024 and after 4096 (the absorbed path
     0.87-0.90 of the other's time at 512, 0.95-0.98 at 768 after 4096, 0.99-1.00 at 1024), which
     an absorbed rate of 1.38 gives (n = 1219).
   - Other devices, an NVIDIA H100 (V2-Lite, prefixes 0-4096, chunks 16-4096), rates as fractions of
     24.9 TFLOP/s (the up-projection's on the first run). The absorbed path: 1.49 and 1.53 ns per pair
     on two runs (0.94, 0.91). attn_prefill_tiled (2026-11-26, `2bf76cd`): 0.98 ns per pair (0.42),
     0.98 us per cached key (0.172, counting X a key) and 0.26 of that more than the absorbed path
     per chunk token, so the rule counts the chunk's tokens as 0.26 keys: pairs >= n (p + 0.26 t),
     n = 1757 for DeepSeek's dims, decompressed for prompts of about 913 tokens and more with no
     prefix, about 1757 after a long one. attn_prefill (one query per work-item; where no block of
     attn_prefill_tiled fits the device or the tuning turns it off) costs per key, cached or new,
     nothing per pair (0.0197 of the rate, counting X a key): pairs >= n (p + t), n = 5565.
   Shapes whose absorbed pairs cost no more than decompressed ones (small test shapes on CPUs) take
   the absorbed path always. Below AUTO_MIN_TOKENS tokens the absorbed path is kept whatever the
   prefix: with no prefix the two were even there on PoCL (and a multi-token decode entry stays in
   its batch's absorbed call). */
#define AUTO_MIN_TOKENS 16
#define CPU_ABSORBED_PAIR_RATE 1.12
#define CPU_LANES_ABSORBED_PAIR_RATE 1.38
#define CPU_DECOMPRESSED_PAIR_RATE 0.47
#define GPU_ABSORBED_PAIR_RATE 0.91
#define GPU_TILED_PAIR_RATE 0.42
#define GPU_TILED_KEY_RATE 0.172
#define GPU_TILED_CHUNK_KEYS 0.26
#define GPU_DECOMPRESSED_KEY_RATE 0.0197

/* n, and in *chunk_keys how many keys each of the entry's own tokens counts as in the decompressed
   path's cost (0 on CPUs); AUTO_NEVER: the decompressed path never pays. Needs the layer's kernels
   (whether attn_prefill_tiled runs). */
#define AUTO_NEVER 1000000
static int auto_threshold_of(const clmla_layer *L, double *chunk_keys)
{
    const double X = 2.0 * L->rkv * L->H * (L->dn + L->dv), A = 2.0 * L->H * (2 * L->rkv + L->dr),
                 D = 2.0 * L->H * (L->dq + L->dv);
    double n;
    if (L->ctx->info.kind == CLMLA_DEVICE_KIND_CPU) {
        clmla_latent_tuning tn;
        clmla_latent_tuning_for(L->ctx, L->H, &tn);
        const double rate =
            clmla_latent_lanes_vectors(&tn, L->H) ? CPU_LANES_ABSORBED_PAIR_RATE : CPU_ABSORBED_PAIR_RATE;
        const double saved = A / rate - D / CPU_DECOMPRESSED_PAIR_RATE;
        n = saved > 0 ? X / saved : AUTO_NEVER;
        *chunk_keys = 0;
    } else if (L->prefill[0].tiled) {
        const double saved = A / GPU_ABSORBED_PAIR_RATE - D / GPU_TILED_PAIR_RATE;
        n = saved > 0 ? (X / GPU_TILED_KEY_RATE) / saved : AUTO_NEVER;
        *chunk_keys = GPU_TILED_CHUNK_KEYS;
    } else {
        n = (X / GPU_DECOMPRESSED_KEY_RATE) / (A / GPU_ABSORBED_PAIR_RATE);
        *chunk_keys = 1;
    }
    return n < AUTO_MIN_TOKENS ? AUTO_MIN_TOKENS : n >= AUTO_NEVER ? AUTO_NEVER : (int)ceil(n);
}

/* The scratch each attention path holds beyond the step's own activations (docs/DESIGN.md, "Which
   path"), within one budget: SCRATCH_BUDGET_BYTES, or an eighth of the device's memory where that is
   less.
   - The absorbed path holds its queries in latent space and their attention's outputs for the rows
     it runs at once, 2 H rkv floats a row: a step with more rows than fit the budget runs its
     absorbed attention in pieces of that many rows (2048 at DeepSeek-V3's 128 heads, 16384 at
     V2-Lite's 16), so that this scratch does not grow with a long prompt.
   - The decompressed path gathers an entry's k keys (its prefix and new tokens) as float32 rows of
     rkv + dr values and up-projects them into k rows of H (dn + dv), each in one buffer the context
     keeps for later steps: 130 KiB a key at V3's shape, 4 GiB for a prompt of 32768 tokens. AUTO
     keeps an entry absorbed where that would pass the budget (then the absorbed path, within it,
     holds less) or a buffer the device's largest; a step that names the decompressed path is
     refused past the largest buffer. */
#define SCRATCH_BUDGET_BYTES ((uint64_t)1 << 30)

static uint64_t scratch_budget(const clmla_layer *L)
{
    const uint64_t eighth = L->ctx->info.global_mem_bytes / 8;
    return eighth > 0 && eighth < SCRATCH_BUDGET_BYTES ? eighth : SCRATCH_BUDGET_BYTES;
}

static int absorbed_piece_rows(const clmla_layer *L)
{
    if (L->ctx->absorbed_piece_rows > 0) /* a test hook */
        return L->ctx->absorbed_piece_rows;
    const uint64_t rows = scratch_budget(L) / (2 * (uint64_t)L->H * L->rkv * sizeof(float));
    return rows < 16 ? 16 : rows > INT_MAX ? INT_MAX : (int)rows;
}

/* The decompressed path's scratch bytes a key: the gathered row, the up-projected one. */
static void decompressed_key_bytes(const clmla_layer *L, uint64_t *gather, uint64_t *up)
{
    *gather = (uint64_t)L->row * sizeof(float);
    *up = (uint64_t)L->H * (uint64_t)(L->dn + L->dv) * sizeof(float);
}

/* The most keys a decompressed entry can have: each of its scratch buffers within the device's
   largest buffer. */
static long long decompressed_max_keys(const clmla_layer *L)
{
    uint64_t gather, up;
    decompressed_key_bytes(L, &gather, &up);
    const uint64_t largest = L->ctx->info.max_alloc_bytes;
    return largest > 0 ? (long long)(largest / (up > gather ? up : gather)) : LLONG_MAX;
}

/* Whether decompressing an entry would hold more scratch than the budget. */
static int decompressed_over_budget(const clmla_layer *L, long long prefix, long long tokens)
{
    uint64_t gather, up;
    decompressed_key_bytes(L, &gather, &up);
    return (double)(prefix + tokens) * (double)(gather + up) > (double)scratch_budget(L);
}

/* In a selecting step AUTO sends an entry decompressed only up to this many keys. CPU devices:
   none, as measured on PoCL (16 heads, top-k 512: absorbed 1.2-2.3x faster for prefills of 1024 to
   4096 tokens; docs/perf-log.md). Elsewhere, until measured, the FLOP count: the decompressed
   kernels score every key (2 dq FLOPs a key, per query and head) and weight the selected ones
   (2 dv each), the absorbed ones only the index_topk selected (2 (2 rkv + dr) each), so past
   index_topk (2 rkv + dr - dv) / dq keys (5 index_topk for DeepSeek-V3.2) the absorbed path does
   less (docs/DESIGN.md). */
static long long sparse_decompressed_keys(const clmla_layer *L)
{
    if (L->ctx->info.kind == CLMLA_DEVICE_KIND_CPU)
        return 0;
    return (long long)L->topk * (2LL * L->rkv + L->dr - L->dv) / L->dq;
}

/* Whether AUTO takes the decompressed path for an entry of `tokens` new tokens in a sequence that
   held `prefix` before the step: the rule above in dense steps, the one of sparse_decompressed_keys
   in steps that select keys. */
static int auto_decompressed(const clmla_layer *L, int prefix, int tokens, int sparse)
{
    if (tokens < AUTO_MIN_TOKENS)
        return 0;
    if ((long long)prefix + tokens > decompressed_max_keys(L) || decompressed_over_budget(L, prefix, tokens))
        return 0;
    if (sparse && (long long)prefix + tokens > sparse_decompressed_keys(L))
        return 0;
    if (L->auto_threshold >= AUTO_NEVER)
        return 0;
    const double pairs = (double)tokens * ((double)prefix + (tokens + 1) / 2.0);
    return pairs >= ((double)prefix + L->auto_chunk_keys * tokens) * L->auto_threshold;
}

clmla_status clmla_layer_create(clmla_context *ctx, const clmla_layer_config *config, const clmla_layer_weights *w,
                                clmla_layer **out)
{
    if (!out)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_create: NULL output pointer");
    *out = NULL;
    if (!ctx || !config || !w)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_create: NULL argument");
    clmla_status st = clmla_layer_config_validate(config);
    if (st != CLMLA_SUCCESS)
        return clmla_fail(ctx, st, "%s", clmla_last_error(NULL));
    const clmla_layer_config c = clmla_config_resolved(config);
    const int64_t D = c.hidden_size, H = c.num_heads, rq = c.q_lora_rank, rkv = c.kv_lora_rank;
    const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim, dq = dn + dr;
    /* A tensor-parallel shard runs heads [h0, h0 + Hs) as a layer of Hs heads (the softmax scale
       depends on the head dims only); its slices of the three head-sharded weights in *_block. */
    const int64_t tp = c.tp_size > 1 ? c.tp_size : 1, Hs = H / tp, h0 = (int64_t)c.tp_rank * Hs;
    const head_slice q_heads = {h0, Hs, H, dq, 0}, kvb_heads = {h0, Hs, H, dn + dv, 0}, o_heads = {h0, Hs, H, dv, 1};
    size_t q_block[4] = {0}, kvb_block[4] = {0}, o_block[4] = {0};

    /* The query path must be exactly one of the two forms. */
    if (rq == 0) {
        if (w->q_a_proj.data || w->q_a_layernorm.data || w->q_b_proj.data)
            return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                              "q_lora_rank is 0 (q_proj form) but q_a_proj / q_a_layernorm / q_b_proj were given");
        st = check_sharded(ctx, "q_proj", &w->q_proj, H * dq, D, &q_heads, q_block);
    } else {
        if (w->q_proj.data)
            return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                              "q_lora_rank is %lld (q_a_proj/q_b_proj form) but q_proj was given", (long long)rq);
        st = check_tensor(ctx, "q_a_proj", &w->q_a_proj, rq, D);
        if (st == CLMLA_SUCCESS)
            st = check_tensor(ctx, "q_a_layernorm", &w->q_a_layernorm, rq, 0);
        if (st == CLMLA_SUCCESS)
            st = check_sharded(ctx, "q_b_proj", &w->q_b_proj, H * dq, rq, &q_heads, q_block);
    }
    if (st == CLMLA_SUCCESS)
        st = check_tensor(ctx, "kv_a_proj_with_mqa", &w->kv_a_proj_with_mqa, rkv + dr, D);
    if (st == CLMLA_SUCCESS)
        st = check_tensor(ctx, "kv_a_layernorm", &w->kv_a_layernorm, rkv, 0);
    if (st == CLMLA_SUCCESS)
        st = check_sharded(ctx, "kv_b_proj", &w->kv_b_proj, H * (dn + dv), rkv, &kvb_heads, kvb_block);
    if (st == CLMLA_SUCCESS)
        st = check_sharded(ctx, "o_proj", &w->o_proj, D, H * dv, &o_heads, o_block);
    if (st == CLMLA_SUCCESS && rq == 0 && w->q_a_proj_bias.data)
        st = clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "q_lora_rank is 0 (q_proj form) but q_a_proj's bias was given");
    if (st == CLMLA_SUCCESS)
        st = check_shape(ctx, "q_a_proj", "bias", &w->q_a_proj_bias, rq, 0, 1);
    if (st == CLMLA_SUCCESS)
        st = check_shape(ctx, "kv_a_proj_with_mqa", "bias", &w->kv_a_proj_with_mqa_bias, rkv + dr, 0, 1);
    if (st == CLMLA_SUCCESS)
        st = check_shape(ctx, "o_proj", "bias", &w->o_proj_bias, D, 0, 1);
    const int64_t HI = c.index_n_heads, dI = c.index_head_dim;
    const clmla_tensor *idx_t[5] = {&w->indexer_wq_b, &w->indexer_wk, &w->indexer_k_norm, &w->indexer_k_norm_bias,
                                    &w->indexer_weights_proj};
    static const char *const idx_names[5] = {"indexer.wq_b", "indexer.wk", "indexer.k_norm", "indexer.k_norm (bias)",
                                             "indexer.weights_proj"};
    const int64_t idx_shape[5][2] = {{HI * dI, rq}, {dI, D}, {dI, 0}, {dI, 0}, {HI, D}};
    for (int i = 0; st == CLMLA_SUCCESS && i < 5; i++) {
        if (HI == 0 && idx_t[i]->data)
            st = clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                            "%s was given, but index_n_heads is 0 (a layer without an indexer)", idx_names[i]);
        else if (HI > 0)
            st = check_tensor(ctx, idx_names[i], idx_t[i], idx_shape[i][0], idx_shape[i][1]);
    }
    if (st != CLMLA_SUCCESS)
        return st;

    clmla_layer *L = calloc(1, sizeof(*L));
    if (!L)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    L->ctx = ctx;
    L->config = c;
    L->D = (int)D, L->H = (int)Hs, L->rq = (int)rq, L->rkv = (int)rkv;
    L->dn = (int)dn, L->dr = (int)dr, L->dv = (int)dv, L->dq = (int)dq, L->row = (int)(rkv + dr);
    L->scale = (float)clmla_softmax_scale(&c);

    const clmla_weights_dtype wd = c.weights_dtype;
    /* The shard's blocks of the head-sharded weights (the whole tensors without sharding). */
    clmla_tensor_block qb, kvb, ob;
    memset(&qb, 0, sizeof(qb));
    memset(&kvb, 0, sizeof(kvb));
    memset(&ob, 0, sizeof(ob));
    const clmla_tensor *q_given = rq ? &w->q_b_proj : &w->q_proj;
    st = clmla_tensor_block_make(ctx, rq ? "q_b_proj" : "q_proj", q_given, q_block[0], q_block[1], q_block[2], q_block[3],
                                 wd, &qb);
    if (st == CLMLA_SUCCESS)
        st = clmla_tensor_block_make(ctx, "kv_b_proj", &w->kv_b_proj, kvb_block[0], kvb_block[1], kvb_block[2],
                                     kvb_block[3], wd, &kvb);
    if (st == CLMLA_SUCCESS)
        st = clmla_tensor_block_make(ctx, "o_proj", &w->o_proj, o_block[0], o_block[1], o_block[2], o_block[3], wd, &ob);
    if (st == CLMLA_SUCCESS) {
        /* q_proj's block held in float32 (an fp8 shard across the scale grid) takes the stacked
           weight with it: a weight has one dtype. */
        const clmla_tensor qkv_parts[2] = {rq ? w->q_a_proj : qb.t, w->kv_a_proj_with_mqa};
        size_t qkv_offsets[2] = {0, 0};
        st = clmla_weight_upload(ctx, rq ? "q_a_proj+kv_a_proj_with_mqa" : "q_proj+kv_a_proj_with_mqa", qkv_parts, 2,
                                 rq ? wd : qb.want, 1, &L->qkv_a, qkv_offsets);
        L->qa_rows = (int)qkv_offsets[1];
        L->qkv_ld = L->qa_rows + L->row;
    }
    if (st == CLMLA_SUCCESS && rq) {
        st = upload_scaled(ctx, "q_a_layernorm", &w->q_a_layernorm, c.q_latent_scale, &L->q_a_layernorm);
        if (st == CLMLA_SUCCESS)
            st = clmla_weight_upload(ctx, "q_b_proj", &qb.t, 1, qb.want, 1, &L->q_b_proj, NULL);
    }
    if (st == CLMLA_SUCCESS)
        st = upload_scaled(ctx, "kv_a_layernorm", &w->kv_a_layernorm, c.kv_latent_scale, &L->kv_a_layernorm);
    if (st == CLMLA_SUCCESS)
        st = upload_biases(L, w);
    if (st == CLMLA_SUCCESS)
        st = clmla_weight_upload(ctx, "kv_b_proj", &kvb.t, 1, kvb.want, 0, &L->kv_b_proj, NULL);
    if (st == CLMLA_SUCCESS)
        st = clmla_weight_upload(ctx, "o_proj", &ob.t, 1, ob.want, 1, &L->o_proj, NULL);
    if (c.index_shared)
        L->shared = 1, L->topk = c.index_topk;
    if (st == CLMLA_SUCCESS && HI > 0) {
        L->HI = (int)HI, L->dI = (int)dI, L->topk = c.index_topk;
        st = clmla_weight_upload(ctx, "indexer.wq_b", &w->indexer_wq_b, 1, wd, 1, &L->idx_wq, NULL);
        if (st == CLMLA_SUCCESS)
            st = clmla_weight_upload(ctx, "indexer.wk", &w->indexer_wk, 1, wd, 1, &L->idx_wk, NULL);
        if (st == CLMLA_SUCCESS)
            st = clmla_weight_upload(ctx, "indexer.weights_proj", &w->indexer_weights_proj, 1, wd, 1, &L->idx_ww, NULL);
        if (st == CLMLA_SUCCESS)
            st = upload_weight(ctx, "indexer.k_norm", &w->indexer_k_norm, &L->idx_norm_w);
        if (st == CLMLA_SUCCESS)
            st = upload_weight(ctx, "indexer.k_norm (bias)", &w->indexer_k_norm_bias, &L->idx_norm_b);
    }
    clmla_tensor_block_free(&qb);
    clmla_tensor_block_free(&kvb);
    clmla_tensor_block_free(&ob);
    if (st == CLMLA_SUCCESS)
        st = build_kernels(L);
    if (st != CLMLA_SUCCESS) {
        clmla_layer_destroy(L);
        return st;
    }
    L->auto_threshold = auto_threshold_of(L, &L->auto_chunk_keys);
    *out = L;
    return CLMLA_SUCCESS;
}

void clmla_layer_destroy(clmla_layer *L)
{
    if (!L)
        return;
    clFinish(L->ctx->queue);
    clmla_weight_release(&L->qkv_a);
    clmla_weight_release(&L->q_b_proj);
    clmla_weight_release(&L->kv_b_proj);
    clmla_weight_release(&L->o_proj);
    clmla_weight_release(&L->idx_wq);
    clmla_weight_release(&L->idx_wk);
    clmla_weight_release(&L->idx_ww);
    cl_mem bufs[] = {L->q_a_layernorm, L->kv_a_layernorm, L->rope_table, L->qkv_bias, L->o_bias, L->idx_norm_w,
                     L->idx_norm_b};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i])
            clReleaseMemObject(bufs[i]);
    cl_kernel ks[] = {L->rmsnorm, L->rope, L->prefill[0].kernel, L->add_bias, L->prefill[1].kernel};
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++)
        if (ks[i])
            clReleaseKernel(ks[i]);
    clmla_cl_event_done(L->ctx, &L->written);
    clmla_staged_release(&L->tables);
    free(L->entry_info);
    free(L);
}

clmla_status clmla_layer_get_config(const clmla_layer *L, clmla_layer_config *config)
{
    if (!L || !config)
        return clmla_fail(L ? L->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_get_config: NULL argument");
    *config = L->config;
    return CLMLA_SUCCESS;
}

/* Bytes of a device buffer; 0 for none. */
static size_t buffer_bytes(cl_mem m)
{
    size_t bytes = 0;
    if (m && clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof(bytes), &bytes, NULL) != CL_SUCCESS)
        bytes = 0;
    return bytes;
}

/* Bytes of a weight's device buffers: its codes and, for fp8, its scales. */
static size_t weight_bytes(const clmla_weight *w)
{
    return buffer_bytes(w->data) + buffer_bytes(w->scale);
}

clmla_status clmla_layer_get_memory(const clmla_layer *L, clmla_layer_memory *m)
{
    if (!L || !m)
        return clmla_fail(L ? L->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_get_memory: NULL argument");
    memset(m, 0, sizeof(*m));
    /* The stacked [q_proj or q_a_proj ; kv_a_proj_with_mqa]: each its rows' share (fp8's padding
       rows before kv_a_proj_with_mqa, if any, counted with the first). */
    const size_t qkv = weight_bytes(&L->qkv_a);
    const size_t q_part = (size_t)((double)qkv * L->qa_rows / L->qkv_ld);
    if (L->rq)
        m->q_a_proj = q_part;
    else
        m->q_proj = q_part;
    m->kv_a_proj_with_mqa = qkv - q_part;
    m->q_b_proj = weight_bytes(&L->q_b_proj);
    m->kv_b_proj = weight_bytes(&L->kv_b_proj);
    m->o_proj = weight_bytes(&L->o_proj);
    m->norms = buffer_bytes(L->q_a_layernorm) + buffer_bytes(L->kv_a_layernorm);
    m->biases = buffer_bytes(L->qkv_bias) + buffer_bytes(L->o_bias);
    m->rope_table = buffer_bytes(L->rope_table);
    m->indexer = weight_bytes(&L->idx_wq) + weight_bytes(&L->idx_wk) + weight_bytes(&L->idx_ww) +
                 buffer_bytes(L->idx_norm_w) + buffer_bytes(L->idx_norm_b);
    m->total = qkv + m->q_b_proj + m->kv_b_proj + m->o_proj + m->norms + m->biases + m->rope_table + m->indexer;
    return CLMLA_SUCCESS;
}

clmla_status clmla_layer_auto_threshold(const clmla_layer *L, int *tokens)
{
    if (!L || !tokens)
        return clmla_fail(L ? L->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_auto_threshold: NULL argument");
    *tokens = L->auto_threshold;
    return CLMLA_SUCCESS;
}

clmla_status clmla_layer_auto_path(const clmla_layer *L, int prefix, int tokens, clmla_attention_path *path)
{
    if (!L || !path)
        return clmla_fail(L ? L->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_auto_path: NULL argument");
    if (prefix < 0 || tokens < 1)
        return clmla_fail(L->ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_layer_auto_path: prefix must be at least 0 and tokens at least 1, got %d and %d", prefix,
                          tokens);
    const int sparse = selects(L) && (long long)prefix + tokens > L->topk;
    *path = auto_decompressed(L, prefix, tokens, sparse) ? CLMLA_PATH_DECOMPRESSED : CLMLA_PATH_ABSORBED;
    return CLMLA_SUCCESS;
}

clmla_status clmla_layer_warmup(clmla_layer *L, clmla_cache *cache, int cache_layer)
{
    if (!L || !cache)
        return clmla_fail(L ? L->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_warmup: NULL argument");
    /* The product kernels differ by rows: 1, 2, 3-4, 5-8, 9-63 and 64 or more (host/mla/gemm.c).
       Absorbed: chunks of each size, the small ones at a context past 256 keys, where the latent
       kernel splits the keys and the combine runs. Decompressed: the same chunks, and contexts of
       each size too, since its up-projection has one row per key (1, 2, 4, 8, 16, 80, 280, 296). */
    static const int absorbed[] = {200, 64, 1, 2, 4, 8, 16, 0};
    static const int decompressed[] = {1, 1, 2, 4, 8, 64, 200, 16, 0};
    int tokens = 0, chunk = 0; /* the larger sequence (CLMLA_WARMUP_TOKENS), the largest step */
    for (int path = 0; path < 2; path++) {
        const int *steps = path == 0 ? absorbed : decompressed;
        int sum = 0;
        for (int i = 0; steps[i] > 0; i++) {
            sum += steps[i];
            chunk = steps[i] > chunk ? steps[i] : chunk;
        }
        tokens = sum > tokens ? sum : tokens;
    }
    clmla_cache_info ci;
    clmla_status st = clmla_cache_get_info(cache, &ci);
    if (st != CLMLA_SUCCESS)
        return st;
    const int need = (tokens + ci.block_tokens - 1) / ci.block_tokens;
    if (ci.blocks_free < need)
        return clmla_fail(L->ctx, CLMLA_ERROR_CACHE_FULL,
                          "clmla_layer_warmup needs %d free blocks of the cache (%d tokens), it has %d", need, tokens,
                          ci.blocks_free);
    float *x = calloc((size_t)chunk * (size_t)L->config.hidden_size, sizeof(float));
    float *out = malloc((size_t)chunk * (size_t)L->config.hidden_size * sizeof(float));
    if (!x || !out) {
        free(x);
        free(out);
        return clmla_fail(L->ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "clmla_layer_warmup: out of host memory");
    }
    /* the dense passes dense whatever the layer's top-k (a sparse-attention layer's short contexts
       attend densely), the sparse one below with a top-k of 1 */
    const int topk = L->topk;
    if (selects(L))
        L->topk = INT_MAX;
    L->warming = 1;
    for (int path = CLMLA_PATH_ABSORBED; st == CLMLA_SUCCESS && path <= CLMLA_PATH_DECOMPRESSED; path++) {
        const int *steps = path == CLMLA_PATH_ABSORBED ? absorbed : decompressed;
        int32_t seq = -1;
        st = clmla_cache_seq_add(cache, &seq);
        for (int i = 0; st == CLMLA_SUCCESS && steps[i] > 0; i++) {
            const clmla_batch_entry entry = {seq, steps[i]};
            const clmla_forward_args args = {&entry, 1, cache_layer, (clmla_attention_path)path};
            st = clmla_layer_forward(L, cache, &args, x, out);
        }
        if (seq >= 0)
            clmla_cache_seq_free(cache, seq);
    }
    /* A sparse-attention layer: its indexer's kernels and the sparse attention kernels too, by the
       absorbed steps once more with a top-k of 1 (every step past the first then selects). */
    if (st == CLMLA_SUCCESS && selects(L)) {
        L->topk = 1;
        int32_t seq = -1;
        st = clmla_cache_seq_add(cache, &seq);
        for (int i = 0; st == CLMLA_SUCCESS && absorbed[i] > 0; i++) {
            const clmla_batch_entry entry = {seq, absorbed[i]};
            const clmla_forward_args args = {&entry, 1, cache_layer, CLMLA_PATH_ABSORBED};
            st = clmla_layer_forward(L, cache, &args, x, out);
        }
        if (seq >= 0)
            clmla_cache_seq_free(cache, seq);
    }
    L->topk = topk;
    L->warming = 0;
    free(x);
    free(out);
    return st;
}

/* ---- the step ------------------------------------------------------------------------------- */

/* Makes the RoPE table cover positions [0, needed). */
static clmla_status ensure_rope_table(clmla_layer *L, int needed)
{
    if (needed <= L->rope_positions)
        return CLMLA_SUCCESS;
    int positions = L->rope_positions ? L->rope_positions : 4096;
    while (positions < needed)
        positions = positions > INT_MAX / 2 ? needed : positions * 2;
    const int blocks = L->config.rope_type == CLMLA_ROPE_TYPE_LONGROPE ? 2 : 1;
    const size_t per_block = (size_t)positions * (size_t)L->dr;
    const size_t bytes = per_block * blocks * sizeof(float);
    float *table = clmla_host_realloc(L->ctx, NULL, bytes);
    if (!table)
        return clmla_fail(L->ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory for a RoPE table of %d positions", positions);
    for (int b = 0; b < blocks; b++)
        clmla_rope_fill_table(&L->config, b, 0, positions, table + (size_t)b * per_block);
    cl_mem fresh = NULL;
    clmla_status st = clmla_upload(L->ctx, table, bytes, &fresh);
    free(table);
    if (st != CLMLA_SUCCESS)
        return st;
    if (L->rope_table)
        clReleaseMemObject(L->rope_table);
    L->rope_table = fresh;
    L->rope_positions = positions;
    return CLMLA_SUCCESS;
}

static clmla_status enqueue_rmsnorm(clmla_layer *L, cl_mem x, int offset, int rows, int stride, int cols, cl_mem weight)
{
    clmla_context *ctx = L->ctx;
    const float eps = (float)L->config.rms_norm_eps;
    CLMLA_SET_ARG(ctx, L->rmsnorm, 0, x);
    CLMLA_SET_ARG(ctx, L->rmsnorm, 1, offset);
    CLMLA_SET_ARG(ctx, L->rmsnorm, 2, stride);
    CLMLA_SET_ARG(ctx, L->rmsnorm, 3, cols);
    CLMLA_SET_ARG(ctx, L->rmsnorm, 4, weight);
    CLMLA_SET_ARG(ctx, L->rmsnorm, 5, eps);
    const size_t local = (size_t)L->rmsnorm_threads, global = local * (size_t)rows;
    cl_int err = clmla_cl_enqueue(ctx, L->rmsnorm, 1, &global, &local, NULL);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue rmsnorm");
}

/* q: T rows of H*dq values q_ld apart; kv: T rows of row values from kv_offset, kv_ld apart. */
static clmla_status enqueue_rope(clmla_layer *L, cl_mem q, int q_ld, cl_mem kv, int kv_offset, int kv_ld, cl_mem positions,
                                 cl_mem qscale, int T)
{
    clmla_context *ctx = L->ctx;
    const int zero = 0;
    CLMLA_SET_ARG(ctx, L->rope, 0, q);
    CLMLA_SET_ARG(ctx, L->rope, 1, zero);
    CLMLA_SET_ARG(ctx, L->rope, 2, q_ld);
    CLMLA_SET_ARG(ctx, L->rope, 3, L->dq);
    CLMLA_SET_ARG(ctx, L->rope, 4, L->dn);
    CLMLA_SET_ARG(ctx, L->rope, 5, L->H);
    CLMLA_SET_ARG(ctx, L->rope, 6, kv);
    CLMLA_SET_ARG(ctx, L->rope, 7, kv_offset);
    CLMLA_SET_ARG(ctx, L->rope, 8, kv_ld);
    CLMLA_SET_ARG(ctx, L->rope, 9, L->rkv);
    CLMLA_SET_ARG(ctx, L->rope, 10, positions);
    CLMLA_SET_ARG(ctx, L->rope, 11, L->rope_table);
    if (qscale)
        CLMLA_SET_ARG(ctx, L->rope, 12, qscale);
    const size_t global[3] = {(size_t)L->dr / 2, (size_t)L->H + 1, (size_t)T};
    cl_int err = clmla_cl_enqueue_rows(ctx, L->rope, 3, global, NULL);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue rope");
}

/* x[r, i] += bias[i] for T rows of `cols` values, `stride` apart, from `offset`. */
static clmla_status enqueue_bias(clmla_layer *L, cl_mem x, int offset, int rows, int stride, int cols, cl_mem bias,
                                 cl_event *event)
{
    clmla_context *ctx = L->ctx;
    CLMLA_SET_ARG(ctx, L->add_bias, 0, x);
    CLMLA_SET_ARG(ctx, L->add_bias, 1, offset);
    CLMLA_SET_ARG(ctx, L->add_bias, 2, stride);
    CLMLA_SET_ARG(ctx, L->add_bias, 3, cols);
    CLMLA_SET_ARG(ctx, L->add_bias, 4, bias);
    const size_t global[2] = {(size_t)cols, (size_t)rows};
    cl_int err = clmla_cl_enqueue(ctx, L->add_bias, 2, global, NULL, event);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue add_bias");
}

/* indices (sparse steps, else NULL): the step's selection [T, index_topk], this entry's rows from
   first_row on. */
static clmla_status enqueue_prefill(clmla_layer *L, cl_mem q, int q_ld, int first_row, cl_mem kv_up, cl_mem gathered,
                                    int n_queries, int prefix, cl_mem o, cl_mem indices)
{
    clmla_context *ctx = L->ctx;
    const int q_off = first_row * q_ld, q_stride = q_ld;
    const int zero = 0, kvu_stride = L->H * (L->dn + L->dv);
    const int o_off = first_row * L->H * L->dv, o_stride = L->H * L->dv;
    const prefill_kernels *pk = &L->prefill[indices != NULL];
    /* the context's kernels change after a layer is made only through the internal test hook */
    if ((clmla_attention_variant(ctx) == CLMLA_LATENT_ROWS) != pk->rows)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "the layer was built for other attention kernels than the context now runs");
    cl_kernel k = pk->kernel;
    CLMLA_SET_ARG(ctx, k, 0, q);
    CLMLA_SET_ARG(ctx, k, 1, q_off);
    CLMLA_SET_ARG(ctx, k, 2, q_stride);
    CLMLA_SET_ARG(ctx, k, 3, kv_up);
    CLMLA_SET_ARG(ctx, k, 4, zero);
    CLMLA_SET_ARG(ctx, k, 5, kvu_stride);
    CLMLA_SET_ARG(ctx, k, 6, gathered);
    CLMLA_SET_ARG(ctx, k, 7, L->rkv);
    CLMLA_SET_ARG(ctx, k, 8, L->row);
    CLMLA_SET_ARG(ctx, k, 9, n_queries);
    CLMLA_SET_ARG(ctx, k, 10, prefix);
    CLMLA_SET_ARG(ctx, k, 11, L->scale);
    CLMLA_SET_ARG(ctx, k, 12, o);
    CLMLA_SET_ARG(ctx, k, 13, o_off);
    CLMLA_SET_ARG(ctx, k, 14, o_stride);
    if (indices) {
        const int i_off = first_row * L->topk;
        CLMLA_SET_ARG(ctx, k, 15, indices);
        CLMLA_SET_ARG(ctx, k, 16, i_off);
        CLMLA_SET_ARG(ctx, k, 17, L->topk);
    }
    const size_t items = (size_t)pk->items, queries = (size_t)pk->queries;
    const size_t global[2] = {(n_queries + queries - 1) / queries * items, (size_t)L->H}, local[2] = {items, 1};
    cl_int err = clmla_cl_enqueue(ctx, k, 2, global, local, NULL);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue attn_prefill");
}

/* A float32 activation buffer as a matrix operand. */
static clmla_matrix mat(cl_mem buffer, size_t offset, size_t ld, int transposed)
{
    clmla_matrix m = {buffer, offset, ld, transposed, 0, CLMLA_DTYPE_F32, NULL, 0};
    return m;
}

/* Host-side description of a step. The arrays are the layer's, kept between steps. */
typedef struct step_plan {
    int T;
    int max_blocks, max_ctx;
    int any_absorbed;     /* some entry takes the absorbed path */
    int sparse;           /* the indexer selects keys: some query sees more than index_topk (both
                             paths then attend to each token's selection only) */
    int max_decompressed; /* the most keys of an entry on the decompressed path (0: none) */
    int *positions, *slots, *token_seq, *token_ctx; /* [T]; positions: rows of the RoPE table */
    int *visible;                                    /* [T] indexer layers: position + 1 */
    int *token_first;                                /* [T] first row of the token's entry */
    int max_run;                                     /* the most tokens of an absorbed entry */
    float *qscale;                                   /* [T] when the layer has a query scale */
    int32_t *tables;                                 /* [num_entries, max_blocks] */
    int *first_row, *prefix, *decompressed;          /* [num_entries] */
} step_plan;

/* Bytes of each step table for a step of T tokens and n entries of at most max_blocks blocks (0
   for a table the layer does not use). */
static void table_bytes(const clmla_layer *L, int T, int n, int max_blocks, size_t *bytes)
{
    for (int t = 0; t < STEP_TABLES; t++)
        bytes[t] = (size_t)T * sizeof(int32_t); /* sizeof(float) for the query scales */
    if (L->config.query_scale_beta == 0)
        bytes[TABLE_QSCALE] = 0;
    if (!L->HI)
        bytes[TABLE_VISIBLE] = 0;
    bytes[TABLE_BLOCKS] = (size_t)n * (size_t)max_blocks * sizeof(int32_t);
}

/* Room in the layer's kept arrays for the plan of a step of T tokens and n entries, and the plan's
   pointers into them. The host arrays are rewritten here, so the previous step's writes from them
   must have completed first: the host waits for them (`written`), which on the in-order queue is
   the completion of every command enqueued before them, the step before last included. */
static clmla_status plan_arrays(clmla_layer *L, int n, step_plan *p)
{
    clmla_context *ctx = L->ctx;
    clmla_cl_event_done(ctx, &L->written);
    size_t bytes[STEP_TABLES];
    table_bytes(L, p->T, n, p->max_blocks, bytes);
    clmla_status st = clmla_staged_reserve(ctx, &L->tables, STEP_TABLES, bytes);
    if (st != CLMLA_SUCCESS)
        return st;
    if (n > L->entry_info_capacity) {
        const int grown = n + n / 2;
        int *info = clmla_host_realloc(ctx, L->entry_info, (size_t)grown * 3 * sizeof(int));
        if (!info)
            return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory for a step of %d entries", n);
        L->entry_info = info;
        L->entry_info_capacity = grown;
    }
    p->positions = clmla_staged_host(&L->tables, TABLE_POSITIONS);
    p->qscale = bytes[TABLE_QSCALE] ? clmla_staged_host(&L->tables, TABLE_QSCALE) : NULL;
    p->slots = clmla_staged_host(&L->tables, TABLE_SLOTS);
    p->token_seq = clmla_staged_host(&L->tables, TABLE_TOKEN_SEQ);
    p->token_ctx = clmla_staged_host(&L->tables, TABLE_TOKEN_CTX);
    p->tables = clmla_staged_host(&L->tables, TABLE_BLOCKS);
    p->visible = bytes[TABLE_VISIBLE] ? clmla_staged_host(&L->tables, TABLE_VISIBLE) : NULL;
    p->token_first = clmla_staged_host(&L->tables, TABLE_TOKEN_FIRST);
    p->first_row = L->entry_info;
    p->prefix = L->entry_info + n;
    p->decompressed = L->entry_info + 2 * n;
    return CLMLA_SUCCESS;
}

/* The plan of a step whose cache transaction `txn` is open (the sequences' new lengths and blocks
   are in the cache, their lengths before the step in txn). */
static clmla_status plan_step(clmla_layer *L, clmla_cache *cache, const clmla_forward_args *a, const cache_txn *txn,
                              step_plan *p)
{
    const int n = a->num_entries;
    memset(p, 0, sizeof(*p));
    for (int e = 0; e < n; e++) {
        clmla_seq_view v;
        clmla_status st = clmla_cache_seq_view(cache, a->entries[e].seq_id, a->cache_layer, &v);
        if (st != CLMLA_SUCCESS)
            return st;
        p->T += a->entries[e].num_tokens;
        if (v.num_blocks > p->max_blocks)
            p->max_blocks = v.num_blocks;
        if (v.length > p->max_ctx)
            p->max_ctx = v.length;
    }
    clmla_status st = CLMLA_SUCCESS;
    p->sparse = selects(L) && p->max_ctx > L->topk;
    if (L->config.dense_max_keys > 0 && p->max_ctx > L->config.dense_max_keys)
        st = clmla_fail(L->ctx, CLMLA_ERROR_UNSUPPORTED,
                        "a sequence would reach %d tokens, but this model selects index_topk = %d keys per query with "
                        "its sparse-attention indexer beyond that, which clmla does not implement yet; attention is "
                        "exact only up to %d tokens",
                        p->max_ctx, L->config.dense_max_keys, L->config.dense_max_keys);
    if (st == CLMLA_SUCCESS)
        st = ensure_rope_table(L, p->max_ctx);
    if (st == CLMLA_SUCCESS)
        st = plan_arrays(L, n, p);
    if (st != CLMLA_SUCCESS)
        return st;
    int row = 0;
    for (int e = 0; e < n; e++) {
        clmla_seq_view view; /* known: the first loop found every sequence */
        clmla_cache_seq_view(cache, a->entries[e].seq_id, a->cache_layer, &view);
        const clmla_seq_view *v = &view;
        const int tokens = a->entries[e].num_tokens;
        p->first_row[e] = row;
        p->prefix[e] = txn->old_length[e];
        p->decompressed[e] = a->path == CLMLA_PATH_DECOMPRESSED ||
                             (a->path == CLMLA_PATH_AUTO && auto_decompressed(L, p->prefix[e], tokens, p->sparse));
        if (p->decompressed[e] && (long long)p->prefix[e] + tokens > decompressed_max_keys(L)) {
            uint64_t gather, up;
            decompressed_key_bytes(L, &gather, &up);
            return clmla_fail(L->ctx, CLMLA_ERROR_UNSUPPORTED,
                              "the decompressed path would up-project the %lld keys of sequence %d (%d cached, %d new) "
                              "into one buffer of %llu bytes, more than the device's largest (%llu bytes); run it on "
                              "the absorbed path, or AUTO",
                              (long long)p->prefix[e] + tokens, (int)a->entries[e].seq_id, p->prefix[e], tokens,
                              (unsigned long long)(((uint64_t)p->prefix[e] + tokens) * (up > gather ? up : gather)),
                              (unsigned long long)L->ctx->info.max_alloc_bytes);
        }
        if (!p->decompressed[e]) {
            p->any_absorbed = 1;
            if (tokens > p->max_run)
                p->max_run = tokens;
        } else if (p->prefix[e] + tokens > p->max_decompressed)
            p->max_decompressed = p->prefix[e] + tokens;
        int32_t *table = p->tables + (size_t)e * p->max_blocks;
        memcpy(table, v->blocks, (size_t)v->num_blocks * sizeof(int32_t));
        memset(table + v->num_blocks, 0, (size_t)(p->max_blocks - v->num_blocks) * sizeof(int32_t));
        /* LongRoPE: the step's last position decides between the short and the long factors. */
        const int long_rows = clmla_rope_uses_long(&L->config, (long)p->prefix[e] + tokens - 1) ? L->rope_positions : 0;
        for (int i = 0; i < tokens; i++, row++) {
            const int pos = p->prefix[e] + i;
            p->positions[row] = pos + long_rows;
            if (p->qscale)
                p->qscale[row] = (float)clmla_query_scale(&L->config, pos);
            p->slots[row] = clmla_seq_view_row(cache, v, pos);
            p->token_seq[row] = e;
            p->token_first[row] = p->first_row[e];
            p->token_ctx[row] = p->decompressed[e] ? 0 : pos + 1;
            if (p->visible)
                p->visible[row] = pos + 1;
        }
    }
    return CLMLA_SUCCESS;
}

static clmla_status check_step(clmla_layer *L, clmla_cache *cache, const clmla_forward_args *a)
{
    clmla_context *ctx = L->ctx;
    if (cache->ctx != ctx)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "the cache and the layer belong to different contexts");
    if (cache->config.kv_lora_rank != L->rkv || cache->config.rope_dim != L->dr)
        return clmla_fail(ctx, CLMLA_ERROR_SHAPE_MISMATCH,
                          "the cache holds rows of kv_lora_rank %d + rope_dim %d, the layer needs %d + %d",
                          cache->config.kv_lora_rank, cache->config.rope_dim, L->rkv, L->dr);
    if (L->HI > 0 && cache->config.index_head_dim != L->dI)
        return clmla_fail(ctx, CLMLA_ERROR_SHAPE_MISMATCH,
                          "the layer's indexer writes index keys of %d values (index_head_dim), the cache holds %d "
                          "(clmla_cache_config.index_head_dim; 0: no index-key cache)",
                          L->dI, cache->config.index_head_dim);
    if (L->HI > 0 && a->cache_layer >= 0 && a->cache_layer < cache->config.num_layers &&
        !clmla_cache_index_keys(cache, a->cache_layer))
        return clmla_fail(ctx, CLMLA_ERROR_SHAPE_MISMATCH,
                          "the layer's indexer writes index keys, and cache layer %d holds none (a cache made for a "
                          "layer without an indexer there)",
                          a->cache_layer);
    if (a->path != CLMLA_PATH_AUTO && a->path != CLMLA_PATH_ABSORBED && a->path != CLMLA_PATH_DECOMPRESSED)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "unknown attention path %d", (int)a->path);
    if (L->shared && !L->warming && a->entries && a->num_entries > 0 && a->cache_layer >= 0 &&
        a->cache_layer < cache->config.num_layers) {
        const clmla_status st = clmla_selection_check(cache, a->cache_layer, L->topk, a->entries, a->num_entries);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    long long T = 0;
    for (int e = 0; a->entries && e < a->num_entries; e++)
        T += a->entries[e].num_tokens > 0 ? a->entries[e].num_tokens : 0;
    /* Every activation must stay indexable by int in the kernels. */
    const long long widest = (long long)L->H * (L->rkv > L->dq ? L->rkv : L->dq) + L->D;
    if (T * widest >= INT_MAX)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "a step of %lld tokens is too large; split it", T);
    return CLMLA_SUCCESS;
}

/* The next run of consecutive absorbed entries from entry *e on that has rows in [lo, hi) (a piece
   of the step): those rows, [*first, *end), with *e moved past the run. 0 when none is left. */
static int next_absorbed_run(const step_plan *p, int num_entries, int lo, int hi, int *e, int *first, int *end)
{
    while (*e < num_entries) {
        while (*e < num_entries && p->decompressed[*e])
            ++*e;
        if (*e >= num_entries)
            return 0;
        int next = *e;
        while (next < num_entries && !p->decompressed[next])
            next++;
        const int r0 = p->first_row[*e], r1 = next < num_entries ? p->first_row[next] : p->T;
        *e = next;
        *first = r0 > lo ? r0 : lo;
        *end = r1 < hi ? r1 : hi;
        if (*first < *end)
            return 1;
    }
    return 0;
}

/* The device buffers of a step: activations in the context's scratch slots and the plan's tables in
   the layer's, both kept between steps. */
typedef struct step_buffers {
    cl_mem qkv;    /* [T, qkv_ld]: q (or c^Q) in columns [0, qa_rows), [c^KV ; k^R] after them */
    cl_mem q;      /* [T, H*dq]: q_b_proj's output, or qkv itself without a query LoRA */
    int q_ld;
    cl_mem q_abs;  /* [T, H, rkv] absorbed queries (absorbed entries only) */
    cl_mem latent; /* [T, H, rkv] latent attention output (absorbed entries only) */
    cl_mem o;      /* [T, H*dv] per-head outputs, the input of o_proj */
    cl_mem idx_k;  /* [T, d_I] x W_k^T (indexer layers) */
    cl_mem idx_q, idx_w, idx_topk; /* [T, H_I, d_I], [T, H_I], [T, K] (sparse steps) */
    cl_mem positions, qscale, slots, token_seq, token_ctx, tables, visible, token_first;
} step_buffers;

/* The plan's tables to the layer's device buffer: non-blocking writes, the last one's completion
   kept in L->written (the queue is in order: it covers them all). The device buffer needs no wait
   of its own: the writes run after every command enqueued before them, the last step's readers
   included. */
static clmla_status write_tables(clmla_layer *L, const clmla_forward_args *a, const step_plan *p)
{
    size_t bytes[STEP_TABLES];
    table_bytes(L, p->T, a->num_entries, p->max_blocks, bytes);
    return clmla_staged_write(L->ctx, &L->tables, bytes, &L->written);
}

static clmla_status stage_step(clmla_layer *L, clmla_cache *cache, const clmla_forward_args *a, const step_plan *p,
                               step_buffers *b)
{
    clmla_context *ctx = L->ctx;
    const size_t T = (size_t)p->T, H = (size_t)L->H, F = sizeof(float);
    memset(b, 0, sizeof(*b));
    b->q_ld = L->rq ? L->H * L->dq : L->qkv_ld;
    clmla_status st = clmla_scratch(ctx, SCRATCH_QKV, T * (size_t)L->qkv_ld * F, &b->qkv);
    b->q = b->qkv;
    if (st == CLMLA_SUCCESS && L->rq)
        st = clmla_scratch(ctx, SCRATCH_Q, T * H * (size_t)L->dq * F, &b->q);
    if (st == CLMLA_SUCCESS)
        st = clmla_scratch(ctx, SCRATCH_HEADS_OUT, T * H * (size_t)L->dv * F, &b->o);
    const size_t most = (size_t)absorbed_piece_rows(L), piece = T < most ? T : most;
    if (st == CLMLA_SUCCESS && p->any_absorbed)
        st = clmla_scratch(ctx, SCRATCH_Q_ABSORBED, piece * H * (size_t)L->rkv * F, &b->q_abs);
    if (st == CLMLA_SUCCESS && p->any_absorbed)
        st = clmla_scratch(ctx, SCRATCH_LATENT_OUT, piece * H * (size_t)L->rkv * F, &b->latent);
    if (st == CLMLA_SUCCESS && L->HI > 0)
        st = clmla_scratch(ctx, SCRATCH_INDEX_K, T * (size_t)L->dI * F, &b->idx_k);
    if (st == CLMLA_SUCCESS && p->sparse) {
        st = clmla_scratch(ctx, SCRATCH_INDEX_Q, T * (size_t)L->HI * L->dI * F, &b->idx_q);
        if (st == CLMLA_SUCCESS)
            st = clmla_scratch(ctx, SCRATCH_INDEX_W, T * (size_t)L->HI * F, &b->idx_w);
    }
    /* the selection: the indexer's into the cache's record, for the shared layers after it; a
       shared layer's from the record (clmla_layer_warmup's: the first key, at every row) */
    if (st == CLMLA_SUCCESS && p->sparse && (L->HI > 0 || L->warming))
        st = clmla_selection_buffer(cache, T * (size_t)L->topk * sizeof(cl_int), &b->idx_topk);
    if (st == CLMLA_SUCCESS && p->sparse && L->shared && L->warming) {
        const cl_int first = 0;
        const cl_int err = clEnqueueFillBuffer(ctx->queue, b->idx_topk, &first, sizeof(first), 0,
                                               T * (size_t)L->topk * sizeof(cl_int), 0, NULL, NULL);
        if (err != CL_SUCCESS)
            st = clmla_fail_cl(ctx, err, "clEnqueueFillBuffer(the warm-up's selection)");
    }
    if (st == CLMLA_SUCCESS && p->sparse && L->shared && !L->warming)
        b->idx_topk = cache->selection.indices;
    if (st == CLMLA_SUCCESS)
        st = write_tables(L, a, p);
    if (st != CLMLA_SUCCESS)
        return st;
    b->positions = L->tables.part[TABLE_POSITIONS];
    b->qscale = p->qscale ? L->tables.part[TABLE_QSCALE] : NULL;
    b->slots = L->tables.part[TABLE_SLOTS];
    b->token_seq = L->tables.part[TABLE_TOKEN_SEQ];
    b->token_ctx = L->tables.part[TABLE_TOKEN_CTX];
    b->tables = L->tables.part[TABLE_BLOCKS];
    b->visible = p->visible ? L->tables.part[TABLE_VISIBLE] : NULL;
    b->token_first = L->tables.part[TABLE_TOKEN_FIRST];
    return CLMLA_SUCCESS;
}

/* The index key of every new token, k = RoPE(LayerNorm(x W_k^T)), into the index-key cache at the
   token's slot (DSA.md section 3.3). */
static clmla_status write_index_keys(clmla_layer *L, clmla_cache *cache, int layer, const step_plan *p,
                                     const step_buffers *b, cl_mem x, size_t x_offset)
{
    clmla_index_kernels *ik = NULL;
    clmla_status st = clmla_index_kernels_for(cache, L->HI, L->dr, L->config.index_rope_pairing, &ik);
    if (st == CLMLA_SUCCESS)
        st = clmla_gemm(L->ctx, p->T, (size_t)L->dI, L->D, 1.0f, mat(x, x_offset, L->D, 0), clmla_weight_matrix(&L->idx_wk),
                        0.0f, mat(b->idx_k, 0, (size_t)L->dI, 0), NULL);
    if (st == CLMLA_SUCCESS)
        st = clmla_index_write_keys(ik, p->T, b->idx_k, 0, L->dI, L->idx_norm_w, L->idx_norm_b,
                                    (float)L->config.index_norm_eps, b->positions, L->rope_table, b->slots,
                                    clmla_cache_index_keys(cache, layer));
    return st;
}

/* Projections, latent norms and RoPE for every token of the step, and [c^KV ; k^R] into the cache
   (docs/MLA.md section 2). */
static clmla_status project_step(clmla_layer *L, clmla_cache *cache, int layer, const step_plan *p, const step_buffers *b,
                                 cl_mem x, size_t x_offset)
{
    clmla_context *ctx = L->ctx;
    const int T = p->T, ld = L->qkv_ld, kv_off = L->qa_rows, rkv = L->rkv;
    clmla_status st = clmla_gemm(ctx, T, (size_t)ld, L->D, 1.0f, mat(x, x_offset, L->D, 0),
                                 clmla_weight_matrix(&L->qkv_a), 0.0f, mat(b->qkv, 0, (size_t)ld, 0), NULL);
    if (st == CLMLA_SUCCESS && L->qkv_bias)
        st = enqueue_bias(L, b->qkv, 0, T, ld, ld, L->qkv_bias, NULL);
    if (st == CLMLA_SUCCESS && L->rq) {
        st = enqueue_rmsnorm(L, b->qkv, 0, T, ld, L->rq, L->q_a_layernorm);
        if (st == CLMLA_SUCCESS)
            st = clmla_gemm(ctx, T, (size_t)L->H * L->dq, L->rq, 1.0f, mat(b->qkv, 0, (size_t)ld, 0),
                            clmla_weight_matrix(&L->q_b_proj), 0.0f, mat(b->q, 0, (size_t)b->q_ld, 0), NULL);
    }
    if (st == CLMLA_SUCCESS)
        st = enqueue_rmsnorm(L, b->qkv, kv_off, T, ld, rkv, L->kv_a_layernorm);
    if (st == CLMLA_SUCCESS)
        st = enqueue_rope(L, b->q, b->q_ld, b->qkv, kv_off, ld, b->positions, b->qscale, T);
    if (st == CLMLA_SUCCESS)
        st = clmla_cache_enqueue_write(cache, layer, T, b->qkv, (size_t)kv_off, ld, b->qkv, (size_t)(kv_off + rkv), ld,
                                       b->slots, NULL);
    if (st == CLMLA_SUCCESS && L->HI > 0)
        st = write_index_keys(L, cache, layer, p, b, x, x_offset);
    return st;
}

/* A sparse step's selection (DSA.md sections 3 and 4): per token its queries RoPE(c^Q W_q^T) and
   head weights (H_I d_I)^-1/2 x W_w^T, then the scores of every visible index key and the
   index_topk best positions into idx_topk [T, K] (-1 padded), as clmla_index_select does. */
static clmla_status select_keys(clmla_layer *L, clmla_cache *cache, int layer, const step_plan *p,
                                const step_buffers *b, cl_mem x, size_t x_offset)
{
    clmla_context *ctx = L->ctx;
    const int T = p->T, HI = L->HI, dI = L->dI;
    const float wscale = (float)(1.0 / sqrt((double)HI * dI));
    clmla_index_kernels *ik = NULL;
    clmla_status st = clmla_index_kernels_for(cache, HI, L->dr, L->config.index_rope_pairing, &ik);
    if (st == CLMLA_SUCCESS)
        st = clmla_gemm(ctx, T, (size_t)HI * dI, L->rq, 1.0f, mat(b->qkv, 0, (size_t)L->qkv_ld, 0),
                        clmla_weight_matrix(&L->idx_wq), 0.0f, mat(b->idx_q, 0, (size_t)HI * dI, 0), NULL);
    if (st == CLMLA_SUCCESS)
        st = clmla_index_rope_queries(ik, T, b->idx_q, 0, b->positions, L->rope_table);
    if (st == CLMLA_SUCCESS)
        st = clmla_gemm(ctx, T, (size_t)HI, L->D, wscale, mat(x, x_offset, L->D, 0), clmla_weight_matrix(&L->idx_ww), 0.0f,
                        mat(b->idx_w, 0, (size_t)HI, 0), NULL);
    if (st == CLMLA_SUCCESS) {
        clmla_index_select_args sa;
        memset(&sa, 0, sizeof(sa));
        sa.num_tokens = T;
        sa.num_heads = HI;
        sa.top_k = L->topk;
        sa.q = b->idx_q;
        sa.weights = b->idx_w;
        sa.block_table = b->tables;
        sa.max_blocks_per_seq = p->max_blocks;
        sa.token_seq = b->token_seq;
        sa.token_ctx_len = b->visible; /* every token, whichever path attends for it */
        sa.max_ctx_len = p->max_ctx;
        sa.indices = b->idx_topk;
        st = clmla_index_select_enqueue(ik, clmla_cache_index_keys(cache, layer), &sa, NULL);
    }
    return st;
}

/* Absorbed entries (docs/MLA.md section 5): per run of consecutive absorbed rows q~ = q^C W^UK for
   every head, latent attention over the cache for all of the step's tokens (decompressed ones have
   no keys here), then o = o-bar W^UV^T per head. */
static clmla_status absorbed_attention(clmla_layer *L, clmla_cache *cache, const clmla_forward_args *a, const step_plan *p,
                                       const step_buffers *b)
{
    clmla_context *ctx = L->ctx;
    const int H = L->H, rkv = L->rkv, dn = L->dn, dv = L->dv, q_ld = b->q_ld;
    const size_t kvb_head = (size_t)(dn + dv) * rkv; /* floats between heads in kv_b_proj */
    const int piece = absorbed_piece_rows(L), pieces = (p->T + piece - 1) / piece;
    clmla_status st = CLMLA_SUCCESS;
    /* rows [R0, R1) of the step at a time; q_abs and latent hold the piece's rows */
    for (int R0 = 0; st == CLMLA_SUCCESS && R0 < p->T; R0 += piece) {
        const int R1 = R0 + piece < p->T ? R0 + piece : p->T;
        int e = 0, lo, hi;
        if (!next_absorbed_run(p, a->num_entries, R0, R1, &e, &lo, &hi))
            continue; /* a piece of decompressed rows only has nothing to do here */
        for (e = 0; st == CLMLA_SUCCESS && next_absorbed_run(p, a->num_entries, R0, R1, &e, &lo, &hi);)
            st = clmla_gemm_strided_batched(ctx, hi - lo, rkv, dn, 1.0f, mat(b->q, (size_t)lo * q_ld, (size_t)q_ld, 0),
                                            L->dq, clmla_weight_slice(&L->kv_b_proj, 0, 0), kvb_head, 0.0f,
                                            mat(b->q_abs, (size_t)(lo - R0) * H * rkv, (size_t)H * rkv, 0), rkv, H, NULL);
        latent_launch lp;
        memset(&lp, 0, sizeof(lp));
        lp.num_tokens = R1 - R0;
        lp.num_heads = H;
        lp.scale = L->scale;
        lp.q_latent = b->q_abs;
        lp.q_latent_token_stride = H * rkv;
        lp.q_latent_head_stride = rkv;
        lp.q_rope = b->q;
        lp.q_rope_offset = (size_t)R0 * q_ld + (size_t)dn;
        lp.q_rope_token_stride = q_ld;
        lp.q_rope_head_stride = L->dq;
        lp.block_table = b->tables;
        lp.max_blocks_per_seq = p->max_blocks;
        lp.token_seq = b->token_seq;
        lp.token_ctx_len = b->token_ctx;
        lp.max_ctx_len = p->max_ctx;
        lp.out = b->latent;
        if (pieces > 1 && st == CLMLA_SUCCESS) {
            /* the kernels read the token tables from token 0: the piece's rows, copied on the device */
            const size_t bytes = (size_t)(R1 - R0) * sizeof(cl_int), at = (size_t)R0 * sizeof(cl_int);
            st = clmla_scratch(ctx, SCRATCH_PIECE_SEQ, (size_t)piece * sizeof(cl_int), &lp.token_seq);
            if (st == CLMLA_SUCCESS)
                st = clmla_scratch(ctx, SCRATCH_PIECE_CTX, (size_t)piece * sizeof(cl_int), &lp.token_ctx_len);
            cl_int err = CL_SUCCESS;
            if (st == CLMLA_SUCCESS)
                err = clmla_cl_copy(ctx, b->token_seq, at, lp.token_seq, 0, bytes);
            if (st == CLMLA_SUCCESS && err == CL_SUCCESS)
                err = clmla_cl_copy(ctx, b->token_ctx, at, lp.token_ctx_len, 0, bytes);
            if (st == CLMLA_SUCCESS && err != CL_SUCCESS)
                st = clmla_fail_cl(ctx, err, "copying a piece of the step's token tables");
        }
        if (p->sparse) {
            lp.indices = b->idx_topk;
            lp.indices_offset = (size_t)R0 * L->topk;
            lp.topk = L->topk;
        } else if (pieces == 1) { /* an entry's tokens may share a work-group (multi-token decode) */
            lp.token_first = b->token_first;
            lp.max_run = p->max_run;
        }
        if (st == CLMLA_SUCCESS)
            st = clmla_latent_attention_enqueue(cache, a->cache_layer, &lp, NULL);
        for (e = 0; st == CLMLA_SUCCESS && next_absorbed_run(p, a->num_entries, R0, R1, &e, &lo, &hi);)
            st = clmla_gemm_strided_batched(ctx, hi - lo, dv, rkv, 1.0f,
                                            mat(b->latent, (size_t)(lo - R0) * H * rkv, (size_t)H * rkv, 0), rkv,
                                            clmla_weight_slice(&L->kv_b_proj, (size_t)dn, 1), kvb_head, 0.0f,
                                            mat(b->o, (size_t)lo * H * dv, (size_t)H * dv, 0), dv, H, NULL);
    }
    return st;
}

/* Decompressed entries (docs/MLA.md section 5): each sequence's keys and values up-projected from
   the cache, then causal attention with head dims dq and dv. */
static clmla_status decompressed_attention(clmla_layer *L, clmla_cache *cache, const clmla_forward_args *a,
                                           const step_plan *p, const step_buffers *b)
{
    clmla_context *ctx = L->ctx;
    const size_t F = sizeof(float), up_cols = (size_t)L->H * (L->dn + L->dv);
    /* grown by half again at most up to AUTO's budget (an entry past it takes its own size only) */
    uint64_t gather_key, up_key;
    decompressed_key_bytes(L, &gather_key, &up_key);
    const size_t budget_keys = (size_t)(scratch_budget(L) / (gather_key + up_key));
    cl_mem gathered = NULL, kv_up = NULL;
    clmla_status st = clmla_scratch_capped(ctx, SCRATCH_GATHER, (size_t)p->max_decompressed * L->row * F,
                                           budget_keys * L->row * F, &gathered);
    if (st == CLMLA_SUCCESS)
        st = clmla_scratch_capped(ctx, SCRATCH_KV_UP, (size_t)p->max_decompressed * up_cols * F,
                                  budget_keys * up_cols * F, &kv_up);
    for (int e = 0; st == CLMLA_SUCCESS && e < a->num_entries; e++) {
        if (!p->decompressed[e])
            continue;
        const int keys = p->prefix[e] + a->entries[e].num_tokens;
        st = clmla_cache_enqueue_gather(cache, a->cache_layer, b->tables, e * p->max_blocks, 0, keys, gathered, 0);
        if (st == CLMLA_SUCCESS)
            st = clmla_gemm(ctx, keys, up_cols, L->rkv, 1.0f, mat(gathered, 0, L->row, 0), clmla_weight_slice(&L->kv_b_proj, 0, 1),
                            0.0f, mat(kv_up, 0, up_cols, 0), NULL);
        if (st == CLMLA_SUCCESS)
            st = enqueue_prefill(L, b->q, b->q_ld, p->first_row[e], kv_up, gathered, a->entries[e].num_tokens,
                                 p->prefix[e], b->o, p->sparse ? b->idx_topk : NULL);
    }
    return st;
}

/* out = o_proj [o_1 ; ... ; o_H] (+ its bias); `event` marks the last command. */
static clmla_status output_projection(clmla_layer *L, const step_plan *p, const step_buffers *b, cl_mem out,
                                      size_t out_offset, cl_event *event)
{
    const size_t hv = (size_t)L->H * L->dv;
    clmla_status st = clmla_gemm(L->ctx, p->T, L->D, hv, 1.0f, mat(b->o, 0, hv, 0), clmla_weight_matrix(&L->o_proj), 0.0f,
                                 mat(out, out_offset, L->D, 0), L->o_bias ? NULL : event);
    if (st == CLMLA_SUCCESS && L->o_bias)
        st = enqueue_bias(L, out, (int)out_offset, p->T, L->D, L->D, L->o_bias, event);
    return st;
}

static clmla_status run_step(clmla_layer *L, clmla_cache *cache, const clmla_forward_args *a, const step_plan *p, cl_mem x,
                             size_t x_offset, cl_mem out, size_t out_offset, cl_event *event)
{
    step_buffers b;
    clmla_status st = stage_step(L, cache, a, p, &b);
    if (st == CLMLA_SUCCESS)
        st = project_step(L, cache, a->cache_layer, p, &b, x, x_offset);
    if (st == CLMLA_SUCCESS && p->sparse && L->HI > 0)
        st = select_keys(L, cache, a->cache_layer, p, &b, x, x_offset);
    if (st == CLMLA_SUCCESS && p->any_absorbed)
        st = absorbed_attention(L, cache, a, p, &b);
    if (st == CLMLA_SUCCESS && p->max_decompressed > 0)
        st = decompressed_attention(L, cache, a, p, &b);
    if (st == CLMLA_SUCCESS)
        st = output_projection(L, p, &b, out, out_offset, event);
    return st;
}

/* Enqueues a step and leaves its cache transaction open in *txn (commit or roll back after). */
static clmla_status forward_enqueue(clmla_layer *L, clmla_cache *cache, const clmla_forward_args *a, cl_mem x,
                                    size_t x_offset, cl_mem out, size_t out_offset, cl_event *event, cache_txn *txn)
{
    clmla_status st = check_step(L, cache, a);
    if (st != CLMLA_SUCCESS)
        return st;
    st = clmla_cache_begin_append(cache, a->cache_layer, a->entries, a->num_entries, txn);
    if (st != CLMLA_SUCCESS)
        return st;
    /* a full layer's step replaces the selection record, which is stale until the step is enqueued */
    if (L->HI > 0)
        clmla_selection_clear(cache);
    step_plan plan;
    st = plan_step(L, cache, a, txn, &plan);
    if (st == CLMLA_SUCCESS && L->shared && !L->warming &&
        (plan.sparse != cache->selection.sparse || plan.T != cache->selection.T))
        st = clmla_fail(L->ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                        "the shared layer's step (%d tokens, %s) does not match its full layer's (%d tokens, %s)", plan.T,
                        plan.sparse ? "selecting" : "dense", cache->selection.T,
                        cache->selection.sparse ? "selecting" : "dense");
    if (st == CLMLA_SUCCESS)
        st = run_step(L, cache, a, &plan, x, x_offset, out, out_offset, event);
    if (st == CLMLA_SUCCESS && L->HI > 0)
        st = clmla_selection_keep(cache, a->cache_layer, L->topk, plan.sparse, plan.T, a->entries, a->num_entries,
                                  txn->old_length);
    if (st != CLMLA_SUCCESS)
        clmla_cache_rollback(cache, txn);
    return st;
}

clmla_status clmla_layer_forward_cl(clmla_layer *L, clmla_cache *cache, const clmla_forward_args *a, cl_mem x,
                                    size_t x_offset, cl_mem out, size_t out_offset, cl_event *event)
{
    if (!L || !cache || !a || !x || !out)
        return clmla_fail(L ? L->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_forward: NULL argument");
    cache_txn txn;
    clmla_status st = forward_enqueue(L, cache, a, x, x_offset, out, out_offset, event, &txn);
    if (st == CLMLA_SUCCESS)
        clmla_cache_commit(&txn);
    return st;
}

clmla_status clmla_layer_forward(clmla_layer *L, clmla_cache *cache, const clmla_forward_args *a, const float *x,
                                 float *out)
{
    if (!L || !cache || !a || !x || !out)
        return clmla_fail(L ? L->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_forward: NULL argument");
    clmla_context *ctx = L->ctx;
    clmla_status st = check_step(L, cache, a);
    if (st != CLMLA_SUCCESS)
        return st;
    long long T = 0;
    st = clmla_cache_check_append(cache, a->cache_layer, a->entries, a->num_entries, &T);
    if (st != CLMLA_SUCCESS)
        return st;
    const size_t bytes = (size_t)T * L->D * sizeof(float);
    cl_mem xb = NULL, ob = NULL;
    st = clmla_scratch(ctx, SCRATCH_X, bytes, &xb);
    if (st == CLMLA_SUCCESS)
        st = clmla_scratch(ctx, SCRATCH_OUT, bytes, &ob);
    if (st != CLMLA_SUCCESS)
        return st;
    cl_int err = clmla_cl_write(ctx, xb, 0, bytes, x);
    if (err != CL_SUCCESS)
        return clmla_fail_cl(ctx, err, "clEnqueueWriteBuffer(x)");
    cache_txn txn;
    st = forward_enqueue(L, cache, a, xb, 0, ob, 0, NULL, &txn);
    if (st != CLMLA_SUCCESS) {
        clFinish(ctx->queue);
        return st;
    }
    /* The step counts only once its output is read: a failed read puts the cache back too. */
    err = clmla_cl_read(ctx, ob, 0, bytes, out);
    if (err != CL_SUCCESS) {
        clmla_cache_rollback(cache, &txn);
        if (L->HI > 0)
            clmla_selection_clear(cache);
        return clmla_fail_cl(ctx, err, "clEnqueueReadBuffer(out)");
    }
    clmla_cache_commit(&txn);
    return CLMLA_SUCCESS;
}
