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
#include "mla_layer.h"
#include "weight.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    CLMLA_SET_ARGS(ctx, L->rmsnorm, 0, CLMLA_ARG(x), CLMLA_ARG(offset), CLMLA_ARG(stride), CLMLA_ARG(cols),
                   CLMLA_ARG(weight), CLMLA_ARG(eps));
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
    CLMLA_SET_ARGS(ctx, L->rope, 0, CLMLA_ARG(q), CLMLA_ARG(zero), CLMLA_ARG(q_ld), CLMLA_ARG(L->dq), CLMLA_ARG(L->dn),
                   CLMLA_ARG(L->H), CLMLA_ARG(kv), CLMLA_ARG(kv_offset), CLMLA_ARG(kv_ld), CLMLA_ARG(L->rkv),
                   CLMLA_ARG(positions), CLMLA_ARG(L->rope_table));
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
    CLMLA_SET_ARGS(ctx, L->add_bias, 0, CLMLA_ARG(x), CLMLA_ARG(offset), CLMLA_ARG(stride), CLMLA_ARG(cols),
                   CLMLA_ARG(bias));
    const size_t global[2] = {(size_t)cols, (size_t)rows};
    cl_int err = clmla_cl_enqueue_rows(ctx, L->add_bias, 2, global, event);
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
    CLMLA_SET_ARGS(ctx, k, 0, CLMLA_ARG(q), CLMLA_ARG(q_off), CLMLA_ARG(q_stride), CLMLA_ARG(kv_up), CLMLA_ARG(zero),
                   CLMLA_ARG(kvu_stride), CLMLA_ARG(gathered), CLMLA_ARG(L->rkv), CLMLA_ARG(L->row),
                   CLMLA_ARG(n_queries), CLMLA_ARG(prefix), CLMLA_ARG(L->scale), CLMLA_ARG(o), CLMLA_ARG(o_off),
                   CLMLA_ARG(o_stride));
    if (indices) {
        const int i_off = first_row * L->topk;
        CLMLA_SET_ARGS(ctx, k, 15, CLMLA_ARG(indices), CLMLA_ARG(i_off), CLMLA_ARG(L->topk));
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
                             (a->path == CLMLA_PATH_AUTO && clmla_layer_auto_decompressed(L, p->prefix[e], tokens, p->sparse));
        if (p->decompressed[e] && (long long)p->prefix[e] + tokens > clmla_layer_decompressed_max_keys(L)) {
            uint64_t gather, up;
            clmla_layer_decompressed_key_bytes(L, &gather, &up);
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
        clmla_status st = clmla_selection_check(&cache->selection, ctx, a->cache_layer, L->topk, a->num_entries);
        for (int e = 0; st == CLMLA_SUCCESS && e < a->num_entries; e++) {
            int length = 0;
            st = clmla_cache_seq_length(cache, a->entries[e].seq_id, a->cache_layer, &length);
            if (st == CLMLA_SUCCESS)
                st = clmla_selection_check_entry(&cache->selection, ctx, a->cache_layer, e, &a->entries[e], length);
        }
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
    const size_t most = (size_t)clmla_layer_absorbed_piece_rows(L), piece = T < most ? T : most;
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
        st = clmla_selection_buffer(&cache->selection, ctx, T * (size_t)L->topk * sizeof(cl_int), &b->idx_topk);
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
        clmla_index_select_args sa = {.num_tokens = T, .num_heads = HI, .top_k = L->topk, .q = b->idx_q,
                                      .weights = b->idx_w, .block_table = b->tables,
                                      .max_blocks_per_seq = p->max_blocks, .token_seq = b->token_seq};
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
    const int piece = clmla_layer_absorbed_piece_rows(L), pieces = (p->T + piece - 1) / piece;
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
        latent_launch lp = {.num_tokens = R1 - R0, .num_heads = H, .scale = L->scale, .q_latent = b->q_abs,
                            .q_latent_token_stride = H * rkv, .q_latent_head_stride = rkv, .q_rope = b->q,
                            .q_rope_offset = (size_t)R0 * q_ld + (size_t)dn, .q_rope_token_stride = q_ld,
                            .q_rope_head_stride = L->dq, .block_table = b->tables, .max_blocks_per_seq = p->max_blocks,
                            .token_seq = b->token_seq, .token_ctx_len = b->token_ctx, .max_ctx_len = p->max_ctx,
                            .out = b->latent};
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
    clmla_layer_decompressed_key_bytes(L, &gather_key, &up_key);
    const size_t budget_keys = (size_t)(clmla_layer_scratch_budget(L) / (gather_key + up_key));
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
        clmla_selection_clear(&cache->selection);
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
        st = clmla_selection_keep(&cache->selection, L->ctx, a->cache_layer, L->topk, plan.sparse, plan.T, a->entries,
                                  a->num_entries, txn->old_length);
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
    st = clmla_scratch_in_out(ctx, x, bytes, bytes, "clEnqueueWriteBuffer(x)", &xb, &ob);
    if (st != CLMLA_SUCCESS)
        return st;
    cache_txn txn;
    st = forward_enqueue(L, cache, a, xb, 0, ob, 0, NULL, &txn);
    if (st != CLMLA_SUCCESS) {
        clFinish(ctx->queue);
        return st;
    }
    /* The step counts only once its output is read: a failed read puts the cache back too. */
    const cl_int err = clmla_cl_read(ctx, ob, 0, bytes, out);
    if (err != CL_SUCCESS) {
        clmla_cache_rollback(cache, &txn);
        if (L->HI > 0)
            clmla_selection_clear(&cache->selection);
        return clmla_fail_cl(ctx, err, "clEnqueueReadBuffer(out)");
    }
    clmla_cache_commit(&txn);
    return CLMLA_SUCCESS;
}
