/* The lightning indexer's kernels (cl/indexer.cl): built once per clmla_index_kernels, enqueued on
   the context's queue on the caller's buffers after checking every argument. */
#include "indexer.h"
#include "cache.h"
#include "clcall.h"
#include "program.h"
#include "scratch.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Scores kernel: the fewest keys a work-item takes when a context is split, and the work-items
   wanted per compute unit (CPUs: a few per core, so that uneven rows and a busy core even out;
   other devices: enough to fill them, a work-item per 64 keys at least). */
#define SCORE_MIN_CHUNK_CPU 256
#define SCORE_ITEMS_PER_CU_CPU 4
#define SCORE_MIN_CHUNK_GPU 64
#define SCORE_ITEMS_PER_CU_GPU 256
/* keys per tile of a work-item (KT in cl/indexer.cl): chunks are whole tiles */
#define SCORE_TILE 16
/* Top-k kernel: work-items per group. On a CPU a group runs on one core whatever its size (PoCL
   runs its items in a loop), so one item walks the row; elsewhere up to 256. */
#define TOPK_ITEMS_GPU 256

struct clmla_index_kernels {
    clmla_context *ctx;
    clmla_index_config cfg;
    cl_kernel scores;
    cl_kernel topk;
    cl_kernel key_write, q_rope; /* when cfg.rope_dim > 0 */
    int key_threads;             /* key_write's work-group size */
    int topk_items;  /* work-group size of indexer_topk */
    int forced_topk; /* test hooks (0: the library's choice) */
    int forced_chunk;
};

clmla_status clmla_index_kernels_create(clmla_context *ctx, const clmla_index_config *cfg, clmla_index_kernels **out)
{
    if (out)
        *out = NULL;
    if (!ctx || !cfg || !out)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_index_kernels_create: NULL %s",
                          !ctx ? "context" : !cfg ? "configuration" : "output handle");
    if (cfg->heads < 1 || cfg->head_dim < 1 || cfg->block_tokens < 1 ||
        clmla_index_row_bytes(cfg->key_dtype, cfg->head_dim) == 0 ||
        (cfg->key_dtype == CLMLA_CACHE_FP8 && (cfg->head_dim & (cfg->head_dim - 1)) != 0))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_index_kernels_create: heads %d, head_dim %d and block_tokens %d must be >= 1 and "
                          "key_dtype (%d) f32 (0), f16 (1), bf16 (2) or fp8 (3, head_dim a power of two)",
                          cfg->heads, cfg->head_dim, cfg->block_tokens, (int)cfg->key_dtype);
    /* A work-group keeps a token's queries in local memory (heads padded to 8: 32 KiB for 64 heads of
       128) and a work-item its weights and a tile of 16 keys of head_dim floats in private memory
       (cl/indexer.cl). */
    const unsigned long long padded = ((unsigned long long)cfg->heads + 7) / 8 * 8;
    const unsigned long long local_bytes = padded * (unsigned long long)cfg->head_dim * sizeof(float);
    if (cfg->head_dim > 1024 || cfg->heads > 4096 || (long long)cfg->block_tokens * cfg->head_dim > INT_MAX)
        return clmla_fail(ctx, CLMLA_ERROR_UNSUPPORTED,
                          "clmla_index_kernels_create: head_dim %d must be at most 1024, heads %d at most 4096, and a "
                          "block (%d tokens) below 2^31 values",
                          cfg->head_dim, cfg->heads, cfg->block_tokens);
    if (ctx->info.local_mem_bytes > 0 && local_bytes > ctx->info.local_mem_bytes)
        return clmla_fail(ctx, CLMLA_ERROR_UNSUPPORTED,
                          "clmla_index_kernels_create: %d heads of %d values take %llu bytes of local memory; the "
                          "device has %llu",
                          cfg->heads, cfg->head_dim, local_bytes, (unsigned long long)ctx->info.local_mem_bytes);
    if (cfg->rope_dim < 0 || cfg->rope_dim % 2 || cfg->rope_dim > cfg->head_dim ||
        (cfg->rope_pairing != CLMLA_ROPE_INTERLEAVED && cfg->rope_pairing != CLMLA_ROPE_HALF_SPLIT))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_index_kernels_create: rope_dim %d must be even and at most head_dim %d, rope_pairing %d "
                          "interleaved (0) or half-split (1)",
                          cfg->rope_dim, cfg->head_dim, (int)cfg->rope_pairing);
    clmla_index_kernels *ik = calloc(1, sizeof(*ik));
    if (!ik)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "clmla_index_kernels_create: out of host memory");
    ik->ctx = ctx;
    ik->cfg = *cfg;
    /* software prefetch where it was measured (PoCL on CPUs; clang's __builtin_prefetch) */
    const int prefetch = clmla_device_prefetches(&ctx->info);
    /* one program for all four kernels; the writer's options only where it is wanted, so that the
       scoring programs of a key cache alone stay those they were */
    int wg = 64;
    while (wg > 1 && ctx->info.max_work_group_size > 0 && (size_t)wg > ctx->info.max_work_group_size)
        wg /= 2;
    ik->key_threads = wg;
    char rope[96] = "";
    if (cfg->rope_dim > 0)
        snprintf(rope, sizeof(rope), " -D DR=%d -D WGK=%d%s", cfg->rope_dim, wg,
                 cfg->rope_pairing == CLMLA_ROPE_HALF_SPLIT ? " -D IDX_HALF_SPLIT" : "");
    char options[320];
    snprintf(options, sizeof(options), "-D HI=%d -D DI=%d -D BT=%d%s%s%s%s", cfg->heads, cfg->head_dim, cfg->block_tokens,
             cfg->key_dtype == CLMLA_CACHE_BF16  ? " -D KEY_BF16"
             : cfg->key_dtype == CLMLA_CACHE_F16 ? " -D KEY_F16"
             : cfg->key_dtype == CLMLA_CACHE_FP8 ? " -D KEY_FP8"
                                                      : "",
             prefetch ? " -D CLMLA_PREFETCH" : "", cfg->key_dtype == CLMLA_CACHE_FP8 ? clmla_fp8_option(ctx) : "",
             rope);
    clmla_status st = clmla_kernel_create(ctx, "indexer", options, "indexer_scores", &ik->scores);
    if (st == CLMLA_SUCCESS)
        st = clmla_kernel_create(ctx, "indexer", options, "indexer_topk", &ik->topk);
    if (st == CLMLA_SUCCESS && cfg->rope_dim > 0)
        st = clmla_kernel_create(ctx, "indexer", options, "indexer_key_write", &ik->key_write);
    if (st == CLMLA_SUCCESS && cfg->rope_dim > 0)
        st = clmla_kernel_create(ctx, "indexer", options, "indexer_q_rope", &ik->q_rope);
    if (st != CLMLA_SUCCESS) {
        clmla_index_kernels_destroy(ik);
        return st;
    }
    size_t limit = 0;
    if (clGetKernelWorkGroupInfo(ik->topk, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(limit), &limit, NULL) !=
        CL_SUCCESS)
        limit = 1;
    if (ctx->info.max_work_group_size > 0 && ctx->info.max_work_group_size < limit)
        limit = ctx->info.max_work_group_size;
    if (ctx->max_items0 > 0 && ctx->max_items0 < limit)
        limit = ctx->max_items0;
    size_t items = ctx->info.kind == CLMLA_DEVICE_KIND_CPU ? 1 : TOPK_ITEMS_GPU;
    while (items > 1 && items > limit)
        items /= 2;
    ik->topk_items = (int)items;
    *out = ik;
    return CLMLA_SUCCESS;
}

void clmla_index_kernels_destroy(clmla_index_kernels *ik)
{
    if (!ik)
        return;
    clmla_release_kernel(ik->scores);
    clmla_release_kernel(ik->topk);
    clmla_release_kernel(ik->key_write);
    clmla_release_kernel(ik->q_rope);
    free(ik);
}

size_t clmla_index_block_bytes(const clmla_index_kernels *ik)
{
    return (size_t)ik->cfg.block_tokens * clmla_index_row_bytes(ik->cfg.key_dtype, ik->cfg.head_dim);
}

void clmla_index_set_topk_items(clmla_index_kernels *ik, int items)
{
    ik->forced_topk = items > 0 ? items : 0;
}

void clmla_index_set_score_chunk(clmla_index_kernels *ik, int keys)
{
    ik->forced_chunk = keys > 0 ? keys : 0;
}

/* The bytes of buffer m, after checking that it is a buffer of the context's cl_context holding at
   least `need` bytes (what: the argument's name in messages). */
static clmla_status buffer_bytes(clmla_context *ctx, const char *fn, const char *what, cl_mem m, size_t need,
                                 size_t *size)
{
    if (!m)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
    cl_context owner = NULL;
    *size = 0;
    cl_int err = clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof(owner), &owner, NULL);
    if (err == CL_SUCCESS)
        err = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof(*size), size, NULL);
    if (err != CL_SUCCESS)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s is not a valid buffer: %s", fn, what,
                          clmla_status_string(err));
    if (owner != ctx->cl_ctx)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s belongs to another cl_context than the context's",
                          fn, what);
    if (*size < need)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s needs %zu bytes, the buffer has %zu", fn, what,
                          need, *size);
    return CLMLA_SUCCESS;
}

/* offset + count elements of `unit` bytes, in bytes, when the element index stays below 2^31 (the
   kernels index in int); else a failure naming what. */
static clmla_status extent(clmla_context *ctx, const char *fn, const char *what, size_t offset, long long count,
                           size_t unit, size_t *bytes)
{
    if (offset > (size_t)INT_MAX || count > (long long)INT_MAX - (long long)offset)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: %s from offset %zu with %lld elements reaches past 2^31 elements", fn, what, offset,
                          count);
    *bytes = ((size_t)offset + (size_t)count) * unit;
    return CLMLA_SUCCESS;
}

/* Buffer m holds `count` elements of `unit` bytes from `offset` on (extent, then buffer_bytes for at
   least one byte). */
static clmla_status check_span(clmla_context *ctx, const char *fn, const char *what, cl_mem m, size_t offset,
                               long long count, size_t unit)
{
    size_t need = 0, size = 0;
    const clmla_status st = extent(ctx, fn, what, offset, count, unit, &need);
    return st == CLMLA_SUCCESS ? buffer_bytes(ctx, fn, what, m, need ? need : 1, &size) : st;
}

/* The inputs of a scores launch for T tokens (all but the scores buffer), checked before anything is
   enqueued; *table_rows and *num_blocks: the rows and blocks that block_table and keys hold, for the
   kernel's clamps. fn names the caller in the messages. */
static clmla_status check_inputs(clmla_index_kernels *ik, const char *fn, int T, cl_mem q, size_t q_offset,
                                 cl_mem weights, size_t weights_offset, cl_mem block_table, int max_blocks,
                                 cl_mem token_seq, cl_mem token_ctx_len, int token_offset, int max_ctx, cl_mem keys,
                                 int *table_rows, int *num_blocks)
{
    clmla_context *ctx = ik->ctx;
    const int H = ik->cfg.heads, dI = ik->cfg.head_dim, P = ik->cfg.block_tokens;
    if (T < 1 || max_blocks < 1 || max_ctx < 1 || (long long)max_ctx > (long long)max_blocks * P)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: num_tokens %d, max_blocks_per_seq %d and max_ctx_len %d must be >= 1, max_ctx_len at "
                          "most max_blocks_per_seq * block_tokens (%d)",
                          fn, T, max_blocks, max_ctx, P);
    size_t size = 0;
    clmla_status st = check_span(ctx, fn, "q [T, H_I, d_I]", q, q_offset, (long long)T * H * dI, sizeof(float));
    if (st == CLMLA_SUCCESS)
        st = check_span(ctx, fn, "weights [T, H_I]", weights, weights_offset, (long long)T * H, sizeof(float));
    if (st == CLMLA_SUCCESS && (token_offset < 0 || token_offset > INT_MAX - T))
        st = clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: token_offset %d", fn, token_offset);
    const size_t tok_bytes = ((size_t)token_offset + (size_t)T) * sizeof(cl_int);
    if (st == CLMLA_SUCCESS)
        st = buffer_bytes(ctx, fn, "token_seq [T]", token_seq, tok_bytes, &size);
    if (st == CLMLA_SUCCESS)
        st = buffer_bytes(ctx, fn, "token_ctx_len [T]", token_ctx_len, tok_bytes, &size);
    size_t table_bytes = 0, key_bytes = 0;
    const size_t row_bytes = (size_t)max_blocks * sizeof(cl_int), block_bytes = clmla_index_block_bytes(ik);
    if (st == CLMLA_SUCCESS)
        st = buffer_bytes(ctx, fn, "block_table [rows, max_blocks_per_seq]", block_table, row_bytes, &table_bytes);
    if (st == CLMLA_SUCCESS)
        st = buffer_bytes(ctx, fn, "keys (one block at least)", keys, block_bytes, &key_bytes);
    if (st != CLMLA_SUCCESS)
        return st;
    const size_t rows = table_bytes / row_bytes, blocks = key_bytes / block_bytes;
    *table_rows = rows > (size_t)INT_MAX ? INT_MAX : (int)rows;
    *num_blocks = blocks > (size_t)INT_MAX ? INT_MAX : (int)blocks;
    return CLMLA_SUCCESS;
}

clmla_status clmla_index_scores(clmla_index_kernels *ik, const clmla_index_scores_args *a, cl_event *event)
{
    static const char fn[] = "clmla_index_scores";
    CLMLA_ENTRY(ik, a, fn, "kernels", "arguments", event);
    clmla_context *ctx = ik->ctx;
    const int T = a->num_tokens;
    int table_rows = 0, num_blocks = 0;
    clmla_status st = check_inputs(ik, fn, T, a->q, a->q_offset, a->weights, a->weights_offset, a->block_table,
                                   a->max_blocks_per_seq, a->token_seq, a->token_ctx_len, a->token_offset,
                                   a->max_ctx_len, a->keys, &table_rows, &num_blocks);
    if (st == CLMLA_SUCCESS && a->scores_stride < a->max_ctx_len)
        st = clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: scores_stride %d must be >= max_ctx_len %d", fn,
                        a->scores_stride, a->max_ctx_len);
    if (st == CLMLA_SUCCESS)
        st = check_span(ctx, fn, "scores [T, scores_stride]", a->scores, a->scores_offset,
                        (long long)(T - 1) * a->scores_stride + a->max_ctx_len, sizeof(float));
    if (st != CLMLA_SUCCESS)
        return st;
    /* keys per work-item: enough items for every compute unit, none under the minimum */
    const int cpu = ctx->info.kind == CLMLA_DEVICE_KIND_CPU;
    const long long cus = ctx->info.compute_units ? ctx->info.compute_units : 1;
    const long long target = cus * (cpu ? SCORE_ITEMS_PER_CU_CPU : SCORE_ITEMS_PER_CU_GPU);
    const int min_chunk = cpu ? SCORE_MIN_CHUNK_CPU : SCORE_MIN_CHUNK_GPU;
    long long per_token = (target + T - 1) / T; /* items wanted per token */
    long long chunk = ((long long)a->max_ctx_len + per_token - 1) / per_token;
    if (chunk < min_chunk)
        chunk = min_chunk;
    chunk = (chunk + SCORE_TILE - 1) / SCORE_TILE * SCORE_TILE;
    if (ik->forced_chunk)
        chunk = ik->forced_chunk;
    const long long chunks = ((long long)a->max_ctx_len + chunk - 1) / chunk;

    cl_kernel k = ik->scores;
    const int q_off = (int)a->q_offset, w_off = (int)a->weights_offset, s_off = (int)a->scores_offset;
    const int chunk_i = (int)chunk;
    CLMLA_SET_ARGS(ctx, k, 0, CLMLA_ARG(a->q), CLMLA_ARG(q_off), CLMLA_ARG(a->weights), CLMLA_ARG(w_off),
                   CLMLA_ARG(a->keys), CLMLA_ARG(num_blocks), CLMLA_ARG(a->block_table), CLMLA_ARG(table_rows),
                   CLMLA_ARG(a->max_blocks_per_seq), CLMLA_ARG(a->token_seq), CLMLA_ARG(a->token_ctx_len), CLMLA_ARG(T),
                   CLMLA_ARG(a->max_ctx_len), CLMLA_ARG(chunk_i), CLMLA_ARG(a->scores), CLMLA_ARG(s_off),
                   CLMLA_ARG(a->scores_stride), CLMLA_ARG(a->token_offset));
    /* a fixed work-group shape (PoCL compiles one per shape), one token per group: one item on CPUs,
       64 elsewhere */
    const size_t l0 = cpu ? 1 : 64;
    const size_t global[2] = {((size_t)chunks + l0 - 1) / l0 * l0, (size_t)T}, local[2] = {l0, 1};
    cl_int err = clmla_cl_enqueue(ctx, k, 2, global, local, event);
    if (err != CL_SUCCESS)
        return clmla_fail_cl(ctx, err, "enqueue indexer_scores");
    return CLMLA_SUCCESS;
}

clmla_status clmla_index_topk(clmla_index_kernels *ik, const clmla_index_topk_args *a, cl_event *event)
{
    static const char fn[] = "clmla_index_topk";
    CLMLA_ENTRY(ik, a, fn, "kernels", "arguments", event);
    clmla_context *ctx = ik->ctx;
    const int T = a->num_tokens;
    if (T < 1 || a->top_k < 1 || a->max_ctx_len < 0 || a->scores_stride < a->max_ctx_len || a->scores_stride < 1)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: num_tokens %d and top_k %d must be >= 1, max_ctx_len %d >= 0 and scores_stride %d >= "
                          "max(max_ctx_len, 1)",
                          fn, T, a->top_k, a->max_ctx_len, a->scores_stride);
    size_t size = 0;
    clmla_status st = check_span(ctx, fn, "scores [T, scores_stride]", a->scores, a->scores_offset,
                                 (long long)(T - 1) * a->scores_stride + a->max_ctx_len, sizeof(float));
    if (st == CLMLA_SUCCESS)
        st = check_span(ctx, fn, "indices [T, top_k]", a->indices, a->indices_offset, (long long)T * a->top_k,
                        sizeof(cl_int));
    if (st == CLMLA_SUCCESS && (a->token_offset < 0 || a->token_offset > INT_MAX - T))
        st = clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: token_offset %d", fn, a->token_offset);
    if (st == CLMLA_SUCCESS)
        st = buffer_bytes(ctx, fn, "token_ctx_len [T]", a->token_ctx_len,
                          ((size_t)a->token_offset + (size_t)T) * sizeof(cl_int), &size);
    if (st != CLMLA_SUCCESS)
        return st;

    int items = ik->topk_items;
    if (ik->forced_topk) {
        items = ik->forced_topk;
        size_t limit = 0;
        if (clGetKernelWorkGroupInfo(ik->topk, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(limit), &limit, NULL) ==
                CL_SUCCESS &&
            (size_t)items > limit)
            items = (int)limit;
    }
    cl_kernel k = ik->topk;
    const int s_off = (int)a->scores_offset, o_off = (int)a->indices_offset;
    CLMLA_SET_ARGS(ctx, k, 0, CLMLA_ARG(a->scores), CLMLA_ARG(s_off), CLMLA_ARG(a->scores_stride),
                   CLMLA_ARG(a->token_ctx_len), CLMLA_ARG(T), CLMLA_ARG(a->max_ctx_len), CLMLA_ARG(a->top_k),
                   CLMLA_ARG(a->indices), CLMLA_ARG(o_off));
    cl_int err = clSetKernelArg(k, 9, 2 * (size_t)items * sizeof(cl_uint), NULL);
    if (err != CL_SUCCESS)
        return clmla_fail_kernel_arg(ctx, err, k, 9);
    CLMLA_SET_ARG(ctx, k, 10, a->token_offset);
    const size_t global[1] = {(size_t)T * items}, local[1] = {(size_t)items};
    err = clmla_cl_enqueue(ctx, k, 1, global, local, event);
    if (err != CL_SUCCESS)
        return clmla_fail_cl(ctx, err, "enqueue indexer_topk");
    return CLMLA_SUCCESS;
}

clmla_status clmla_index_write_keys(clmla_index_kernels *ik, int T, cl_mem src, int src_offset, int src_stride,
                                    cl_mem norm_w, cl_mem norm_b, float eps, cl_mem positions, cl_mem table,
                                    cl_mem slots, cl_mem keys)
{
    clmla_context *ctx = ik->ctx;
    if (!ik->key_write)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_index_write_keys: built without rope_dim");
    if (T < 1)
        return CLMLA_SUCCESS;
    cl_kernel k = ik->key_write;
    CLMLA_SET_ARGS(ctx, k, 0, CLMLA_ARG(src), CLMLA_ARG(src_offset), CLMLA_ARG(src_stride), CLMLA_ARG(norm_w),
                   CLMLA_ARG(norm_b), CLMLA_ARG(eps), CLMLA_ARG(positions), CLMLA_ARG(table), CLMLA_ARG(slots),
                   CLMLA_ARG(keys));
    const size_t local = (size_t)ik->key_threads, global = local * (size_t)T;
    cl_int err = clmla_cl_enqueue(ctx, k, 1, &global, &local, NULL);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue indexer_key_write");
}

clmla_status clmla_index_rope_queries(clmla_index_kernels *ik, int T, cl_mem q, int q_offset, cl_mem positions,
                                      cl_mem table)
{
    clmla_context *ctx = ik->ctx;
    if (!ik->q_rope)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_index_rope_queries: built without rope_dim");
    if (T < 1)
        return CLMLA_SUCCESS;
    cl_kernel k = ik->q_rope;
    CLMLA_SET_ARGS(ctx, k, 0, CLMLA_ARG(q), CLMLA_ARG(q_offset), CLMLA_ARG(positions), CLMLA_ARG(table));
    const size_t global[3] = {(size_t)ik->cfg.rope_dim / 2, (size_t)ik->cfg.heads, (size_t)T};
    cl_int err = clmla_cl_enqueue_rows(ctx, k, 3, global, NULL);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue indexer_q_rope");
}

clmla_status clmla_index_kernels_for(clmla_cache *cache, int heads, int rope_dim, clmla_rope_pairing pairing,
                                     clmla_index_kernels **out)
{
    const clmla_index_config want = {heads, cache->config.index_head_dim, cache->config.block_tokens,
                                     cache->config.index_dtype, rope_dim, pairing};
    const int slots = CLMLA_CACHE_INDEX_KERNELS;
    for (int i = 0; i < slots && cache->index_kernels[i]; i++) {
        const clmla_index_config *c = &cache->index_kernels[i]->cfg;
        /* scoring alone (rope_dim 0) takes any set of those heads */
        if (c->heads == heads && (rope_dim == 0 || (c->rope_dim == rope_dim && c->rope_pairing == pairing))) {
            *out = cache->index_kernels[i];
            return CLMLA_SUCCESS;
        }
    }
    int free_slot = 0;
    while (free_slot < slots && cache->index_kernels[free_slot])
        free_slot++;
    if (free_slot == slots)
        return clmla_fail(cache->ctx, CLMLA_ERROR_UNSUPPORTED,
                          "a cache keeps the indexer kernels of %d shapes (heads, rope dims, pairing); a fifth was asked "
                          "for (%d heads)",
                          slots, heads);
    clmla_status st = clmla_index_kernels_create(cache->ctx, &want, &cache->index_kernels[free_slot]);
    cache->index_kernels_release = clmla_index_kernels_destroy; /* the cache frees them, not knowing them */
    *out = cache->index_kernels[free_slot];
    return st;
}

clmla_status clmla_index_select_enqueue(clmla_index_kernels *ik, cl_mem keys, const clmla_index_select_args *a,
                                        cl_event *event)
{
    clmla_context *ctx = ik->ctx;
    const int T = a->num_tokens, HI = ik->cfg.heads, dI = ik->cfg.head_dim;
    const size_t ctx_len = (size_t)a->max_ctx_len, cap = CLMLA_INDEX_SCORE_VALUES / (ctx_len ? ctx_len : 1);
    const int rows = (int)(cap < 1 ? 1 : cap < (size_t)T ? cap : (size_t)T);
    cl_mem scores = NULL;
    clmla_status st = clmla_scratch(ctx, SCRATCH_INDEX_SCORES, (size_t)rows * ctx_len * sizeof(float), &scores);
    for (int r0 = 0; st == CLMLA_SUCCESS && r0 < T; r0 += rows) {
        const int n = T - r0 < rows ? T - r0 : rows;
        clmla_index_scores_args sa = {.num_tokens = n, .q = a->q, .q_offset = a->q_offset + (size_t)r0 * HI * dI,
                                      .weights = a->weights, .weights_offset = a->weights_offset + (size_t)r0 * HI,
                                      .keys = keys, .block_table = a->block_table,
                                      .max_blocks_per_seq = a->max_blocks_per_seq, .token_seq = a->token_seq,
                                      .token_ctx_len = a->token_ctx_len, .max_ctx_len = a->max_ctx_len,
                                      .scores = scores, .scores_stride = a->max_ctx_len, .token_offset = r0};
        st = clmla_index_scores(ik, &sa, NULL);
        if (st == CLMLA_SUCCESS) {
            clmla_index_topk_args ta = {.num_tokens = n, .top_k = a->top_k, .scores = scores,
                                        .scores_stride = a->max_ctx_len, .token_ctx_len = a->token_ctx_len,
                                        .max_ctx_len = a->max_ctx_len, .indices = a->indices,
                                        .indices_offset = a->indices_offset + (size_t)r0 * a->top_k,
                                        .token_offset = r0};
            st = clmla_index_topk(ik, &ta, r0 + n >= T ? event : NULL);
        }
    }
    return st;
}

clmla_status clmla_index_select(clmla_cache *cache, int layer, const clmla_index_select_args *a, cl_event *event)
{
    static const char fn[] = "clmla_index_select";
    CLMLA_ENTRY(cache, a, fn, "argument", "argument", event);
    clmla_context *ctx = cache->ctx;
    cl_mem keys = clmla_cache_index_keys(cache, layer);
    if (!keys)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s", fn,
                          cache->config.index_head_dim ? "the layer is out of range or holds no index keys"
                                                        : "the cache has no index-key cache");
    if (a->num_heads < 1 || a->top_k < 1 || a->top_k > CLMLA_SPARSE_MAX_TOPK || a->num_tokens < 1)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: num_tokens %d and num_heads %d must be >= 1, top_k %d in 1..%d", fn, a->num_tokens,
                          a->num_heads, a->top_k, CLMLA_SPARSE_MAX_TOPK);
    if (!a->indices)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: indices is NULL", fn);
    clmla_status st = check_span(ctx, fn, "indices [T, top_k]", a->indices, a->indices_offset,
                                 (long long)a->num_tokens * a->top_k, sizeof(cl_int));
    clmla_index_kernels *ik = NULL;
    if (st == CLMLA_SUCCESS)
        st = clmla_index_kernels_for(cache, a->num_heads, 0, CLMLA_ROPE_INTERLEAVED, &ik);
    /* every input for all T tokens now, so that a bad one enqueues no chunk (each chunk's own
       checks then pass) */
    int table_rows = 0, num_blocks = 0;
    if (st == CLMLA_SUCCESS)
        st = check_inputs(ik, fn, a->num_tokens, a->q, a->q_offset, a->weights, a->weights_offset, a->block_table,
                          a->max_blocks_per_seq, a->token_seq, a->token_ctx_len, 0, a->max_ctx_len, keys, &table_rows,
                          &num_blocks);
    if (st != CLMLA_SUCCESS)
        return st;
    return clmla_index_select_enqueue(ik, keys, a, event);
}
