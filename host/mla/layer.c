/* One MLA attention layer: its weights on the device (checked against the configuration, kept in
   their dtype, stacked where one product reads two), its kernels, creation and warm-up. The step is
   layer_step.c; which path AUTO takes, layer_plan.c. */
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
   The tuning's tile of keys, chunk of dimensions and keys an item; its block of queries, or the
   largest smaller one whose local memory and work-group (queries / 2 x keys / keys an item) fit the
   device. */
static clmla_status build_prefill_tiled(clmla_layer *L, const clmla_latent_tuning *tn, prefill_kernels *pk)
{
    clmla_context *ctx = L->ctx;
    if (!tn->prefill_tiled || L->dv % 4)
        return CLMLA_SUCCESS;
    const int bk = tn->prefill_keys, kc = tn->prefill_chunk, kpi = tn->prefill_item_keys;
    for (int bq = tn->prefill_queries; bq >= 4; bq /= 2) {
        const int items = bq / 2 * (bk / kpi);
        if ((size_t)items > ctx->info.max_work_group_size || tiled_local_bytes(L, bq, bk, kc) > ctx->info.local_mem_bytes)
            continue;
        char options[256], kpi_option[16] = ""; /* the kernel's own default, 4, is not spelled */
        if (kpi != 4)
            snprintf(kpi_option, sizeof(kpi_option), " -D KPI=%d", kpi);
        snprintf(options, sizeof(options), "-D DN=%d -D DR=%d -D DV=%d -D TILED -D BQ=%d -D BK=%d -D KC=%d%s", L->dn,
                 L->dr, L->dv, bq, bk, kc, kpi_option);
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
    /* A row per work-group. Each item's loads run in turn, and a GPU waits out each one's latency,
       so GPUs take 512 items (one to three values each: docs/perf-log.md); CPU devices run a
       group's items as loops and keep 64. */
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
    L->auto_threshold = clmla_layer_auto_threshold_of(L, &L->auto_chunk_keys, &L->auto_min_tokens);
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
        clmla_release_mem(bufs[i]);
    cl_kernel ks[] = {L->rmsnorm, L->rope, L->prefill[0].kernel, L->add_bias, L->prefill[1].kernel};
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++)
        clmla_release_kernel(ks[i]);
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
