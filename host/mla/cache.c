/* Paged latent KV cache: a pool of blocks of block_tokens tokens, one device buffer per layer,
   a block table per sequence shared by all layers, lengths per (sequence, layer). Blocks may be
   shared by sequences after a fork, with a count of owners per block and copy on write (cache.h). */
#include "cache.h"
#include "clcall.h"
#include "dtype.h"
#include "program.h"
#include "scratch.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static clmla_status oom(clmla_context *ctx)
{
    return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
}

/* clmla_cache_create, or with allocate 0 a shell: its kernels and no memory (clmla_cache_create_shell). */
/* allocate 0: a shell (clmla_cache_create_shell); index_mask: which layers get index keys (NULL: all) */
static clmla_status cache_make(clmla_context *ctx, const clmla_cache_config *config, int allocate,
                               const unsigned char *index_mask, clmla_cache **out)
{
    if (!out)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_cache_create: NULL output pointer");
    *out = NULL;
    if (!ctx || !config)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_cache_create: NULL argument");
    clmla_cache_config c = *config;
    if (c.num_layers == 0)
        c.num_layers = 1;
    if (c.block_tokens == 0)
        c.block_tokens = 64;
    if (c.num_layers < 0 || c.block_tokens < 0 || c.num_blocks < 1 || c.kv_lora_rank < 1 || c.rope_dim < 2 ||
        c.rope_dim % 2 || (c.dtype != CLMLA_CACHE_F32 && c.dtype != CLMLA_CACHE_F16 && c.dtype != CLMLA_CACHE_BF16 &&
                           c.dtype != CLMLA_CACHE_FP8))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "invalid cache configuration: num_layers %d, block_tokens %d, num_blocks %d, kv_lora_rank %d, "
                          "rope_dim %d (even, >= 2), dtype %d",
                          c.num_layers, c.block_tokens, c.num_blocks, c.kv_lora_rank, c.rope_dim, (int)c.dtype);
    if (c.dtype == CLMLA_CACHE_FP8 && c.kv_lora_rank % 128 != 0)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "an fp8 cache needs kv_lora_rank to be a multiple of 128 (one float32 scale per 128 values, "
                          "FlashMLA's layout); kv_lora_rank is %d",
                          c.kv_lora_rank);
    if (c.index_head_dim < 0 || c.index_head_dim > 1024 ||
        (c.index_head_dim > 0 && clmla_index_row_bytes(c.index_dtype, c.index_head_dim) == 0))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "invalid cache configuration: index_head_dim %d (0 to 1024) with index_dtype %d (the index-key "
                          "cache holds f32 (%d), f16 (%d), bf16 (%d) or fp8 (%d))",
                          c.index_head_dim, (int)c.index_dtype, (int)CLMLA_CACHE_F32, (int)CLMLA_CACHE_F16,
                          (int)CLMLA_CACHE_BF16, (int)CLMLA_CACHE_FP8);
    if (c.index_head_dim > 0 && c.index_dtype == CLMLA_CACHE_FP8 && (c.index_head_dim & (c.index_head_dim - 1)) != 0)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "an fp8 index-key cache needs index_head_dim to be a power of two (its keys are stored "
                          "after a Hadamard transform); index_head_dim is %d",
                          c.index_head_dim);
    const int row = c.kv_lora_rank + c.rope_dim;
    /* Bytes of one token's row (cl/prelude.cl): 4 or 2 per value, or fp8's codes, scales and bf16 k^R. */
    const size_t row_bytes = c.dtype == CLMLA_CACHE_F32 ? (size_t)row * 4
                             : c.dtype == CLMLA_CACHE_FP8
                                 ? (size_t)c.kv_lora_rank + 4 * (size_t)(c.kv_lora_rank / 128) + 2 * (size_t)c.rope_dim
                                 : (size_t)row * 2;
    /* Kernels address a token's row by an int slot (block * block_tokens + offset) and its bytes
       with size_t, so a layer may pass 2 GiB; only the slot count is bounded. */
    const double rows = (double)c.num_blocks * c.block_tokens;
    if (rows > (double)INT_MAX)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "cache of %d blocks x %d tokens has more than 2^31 - 1 token slots per layer",
                          c.num_blocks, c.block_tokens);
    const size_t layer_bytes = (size_t)rows * row_bytes;
    const size_t index_row_bytes = clmla_index_row_bytes(c.index_dtype, c.index_head_dim);
    if ((size_t)rows * index_row_bytes > ctx->info.max_alloc_bytes)
        return clmla_fail(ctx, CL_INVALID_BUFFER_SIZE,
                          "one layer of the index-key cache needs %zu bytes, more than the device's largest allocation "
                          "(%llu bytes)",
                          (size_t)rows * index_row_bytes, (unsigned long long)ctx->info.max_alloc_bytes);
    if (layer_bytes > ctx->info.max_alloc_bytes)
        return clmla_fail(ctx, CL_INVALID_BUFFER_SIZE,
                          "one cache layer needs %zu bytes, more than the device's largest allocation (%llu bytes)",
                          layer_bytes, (unsigned long long)ctx->info.max_alloc_bytes);

    clmla_cache *cache = calloc(1, sizeof(*cache));
    if (!cache)
        return oom(ctx);
    cache->ctx = ctx;
    cache->config = c;
    cache->row = row;
    cache->row_bytes = row_bytes;
    cache->layers = calloc((size_t)c.num_layers, sizeof(cl_mem));
    cache->index_row_bytes = index_row_bytes;
    cache->index_layers = index_row_bytes ? calloc((size_t)c.num_layers, sizeof(cl_mem)) : NULL;
    cache->free_blocks = malloc((size_t)c.num_blocks * sizeof(int32_t));
    cache->refs = calloc((size_t)c.num_blocks, sizeof(int));
    clmla_status st = CLMLA_SUCCESS;
    if (!cache->layers || !cache->free_blocks || !cache->refs || (index_row_bytes && !cache->index_layers))
        st = oom(ctx);
    /* Lowest ids on top of the stack, so a fresh pool hands out 0, 1, 2, ... */
    for (int i = 0; st == CLMLA_SUCCESS && i < c.num_blocks; i++)
        cache->free_blocks[i] = c.num_blocks - 1 - i;
    cache->num_free = allocate ? c.num_blocks : 0;
    for (int l = 0; allocate && st == CLMLA_SUCCESS && l < c.num_layers; l++) {
        cl_int err = CL_SUCCESS;
        cache->layers[l] = clmla_cl_buffer(ctx, CL_MEM_READ_WRITE, layer_bytes, NULL, &err);
        if (!cache->layers[l])
            st = clmla_fail(ctx, err, "allocating cache layer %d (%zu bytes) failed: %s", l, layer_bytes, clmla_status_string(err));
        if (st == CLMLA_SUCCESS && index_row_bytes && (!index_mask || index_mask[l])) {
            const size_t bytes = (size_t)rows * index_row_bytes;
            cache->index_layers[l] = clmla_cl_buffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
            if (!cache->index_layers[l])
                st = clmla_fail(ctx, err, "allocating index-key cache layer %d (%zu bytes) failed: %s", l, bytes,
                                clmla_status_string(err));
        }
    }
    snprintf(cache->options, sizeof(cache->options), "-D RKV=%d -D DR=%d%s%s", c.kv_lora_rank, c.rope_dim,
             c.dtype == CLMLA_CACHE_FP8 ? clmla_fp8_option(ctx) : "",
             c.dtype == CLMLA_CACHE_F16    ? " -D CACHE_F16"
             : c.dtype == CLMLA_CACHE_BF16 ? " -D CACHE_BF16"
             : c.dtype == CLMLA_CACHE_FP8  ? " -D CACHE_FP8"
                                           : "");
    if (st == CLMLA_SUCCESS)
        st = clmla_kernel_create(ctx, "cache_write", cache->options, "cache_write", &cache->write_kernel);
    if (st == CLMLA_SUCCESS)
        st = clmla_kernel_create(ctx, "cache_gather", cache->options, "cache_gather", &cache->gather_kernel);
    if (st == CLMLA_SUCCESS)
        st = clmla_kernel_create(ctx, "attn_combine", cache->options, "attn_combine", &cache->combine_kernel);
    if (st == CLMLA_SUCCESS)
        st = clmla_kernel_create(ctx, "attn_combine", cache->options, "attn_combine_rows", &cache->combine_rows_kernel);
    if (st != CLMLA_SUCCESS) {
        clmla_cache_destroy(cache);
        return st;
    }
    *out = cache;
    return CLMLA_SUCCESS;
}

clmla_cache_dtype clmla_cache_index_dtype(clmla_cache_dtype dtype, int index_head_dim)
{
    const int pow2 = index_head_dim > 0 && (index_head_dim & (index_head_dim - 1)) == 0;
    return dtype == CLMLA_CACHE_F32 ? CLMLA_CACHE_F32 : dtype == CLMLA_CACHE_FP8 && pow2 ? CLMLA_CACHE_FP8 : CLMLA_CACHE_BF16;
}

clmla_status clmla_cache_create(clmla_context *ctx, const clmla_cache_config *config, clmla_cache **out)
{
    return cache_make(ctx, config, 1, NULL, out);
}

clmla_status clmla_cache_create_indexed(clmla_context *ctx, const clmla_cache_config *config,
                                        const unsigned char *index_layers, clmla_cache **out)
{
    return cache_make(ctx, config, 1, index_layers, out);
}

clmla_status clmla_cache_create_shell(clmla_context *ctx, const clmla_cache_config *config, clmla_cache **out)
{
    return cache_make(ctx, config, 0, NULL, out);
}

void clmla_cache_destroy(clmla_cache *cache)
{
    if (!cache)
        return;
    if (cache->layers) {
        clFinish(cache->ctx->queue);
        for (int l = 0; l < cache->config.num_layers; l++)
            clmla_release_mem(cache->layers[l]);
        for (int l = 0; cache->index_layers && l < cache->config.num_layers; l++)
            clmla_release_mem(cache->index_layers[l]);
    }
    free(cache->index_layers);
    clmla_selection_release(&cache->selection);
    for (int i = 0; i < CLMLA_CACHE_INDEX_KERNELS; i++)
        if (cache->index_kernels[i] && cache->index_kernels_release)
            cache->index_kernels_release(cache->index_kernels[i]);
    cl_kernel kernels[] = {cache->write_kernel, cache->gather_kernel, cache->combine_kernel, cache->combine_rows_kernel};
    for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++)
        clmla_release_kernel(kernels[i]);
    clmla_kernel_store_release(&cache->latent_kernels);
    for (int i = 0; i < cache->num_seqs; i++) {
        free(cache->seqs[i].blocks);
        free(cache->seqs[i].length);
    }
    free(cache->txn_seq);
    free(cache->txn_old_blocks);
    free(cache->txn_old_length);
    free(cache->txn_copies);
    clmla_cl_event_done(cache->ctx, &cache->append_written);
    clmla_staged_release(&cache->append_slots);
    free(cache->seqs);
    free(cache->layers);
    free(cache->free_blocks);
    free(cache->refs);
    free(cache);
}

cache_seq *clmla_cache_find(const clmla_cache *cache, int32_t seq_id)
{
    if (seq_id >= 0 && seq_id < cache->num_seqs && cache->seqs[seq_id].in_use)
        return &cache->seqs[seq_id];
    clmla_fail(cache->ctx, CLMLA_ERROR_UNKNOWN_SEQUENCE, "sequence %d is not in the cache", (int)seq_id);
    return NULL;
}

clmla_status clmla_cache_seq_view(const clmla_cache *cache, int32_t seq_id, int layer, clmla_seq_view *view)
{
    const cache_seq *s = clmla_cache_find(cache, seq_id);
    if (!s)
        return CLMLA_ERROR_UNKNOWN_SEQUENCE;
    view->blocks = s->blocks;
    view->num_blocks = s->num_blocks;
    view->length = s->length[layer];
    return CLMLA_SUCCESS;
}

/* UNKNOWN_SEQUENCE for a sequence id the cache does not hold, with the id in the message. */
static clmla_status unknown(const clmla_cache *cache, const char *fn, int32_t seq_id)
{
    return clmla_fail(cache->ctx, CLMLA_ERROR_UNKNOWN_SEQUENCE, "%s: sequence %d is not in the cache", fn, (int)seq_id);
}

/* Sequence seq_id of the cache for entry point fn, or NULL with *st the refusal: a NULL cache or an
   unknown id. */
static cache_seq *seq_for(clmla_cache *cache, const char *fn, int32_t seq_id, clmla_status *st)
{
    if (!cache) {
        *st = clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "%s: NULL cache", fn);
        return NULL;
    }
    cache_seq *s = clmla_cache_find(cache, seq_id);
    if (!s)
        *st = unknown(cache, fn, seq_id);
    return s;
}

/* The lowest free sequence id, marked in use with zero lengths and no blocks. May move
   cache->seqs: pointers into it taken before are stale. */
static clmla_status new_slot(clmla_cache *cache, int32_t *seq_id)
{
    int id = 0;
    while (id < cache->num_seqs && cache->seqs[id].in_use)
        id++;
    if (id == cache->num_seqs) {
        int grown = cache->num_seqs ? cache->num_seqs * 2 : 8;
        cache_seq *seqs = realloc(cache->seqs, (size_t)grown * sizeof(*seqs));
        if (!seqs)
            return oom(cache->ctx);
        memset(seqs + cache->num_seqs, 0, (size_t)(grown - cache->num_seqs) * sizeof(*seqs));
        cache->seqs = seqs;
        cache->num_seqs = grown;
    }
    cache_seq *s = &cache->seqs[id];
    if (!s->length) {
        s->length = calloc((size_t)cache->config.num_layers, sizeof(int));
        if (!s->length)
            return oom(cache->ctx);
    }
    memset(s->length, 0, (size_t)cache->config.num_layers * sizeof(int));
    s->num_blocks = 0;
    s->in_use = 1;
    *seq_id = id;
    return CLMLA_SUCCESS;
}

clmla_status clmla_cache_seq_add(clmla_cache *cache, int32_t *seq_id)
{
    if (!cache || !seq_id)
        return clmla_fail(cache ? cache->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_cache_seq_add: NULL argument");
    return new_slot(cache, seq_id);
}

/* ---- blocks and their owners ------------------------------------------------------------------ */

/* The block on top of the free stack, for one owner; the caller checked there is one. */
static int32_t take_block(clmla_cache *cache)
{
    const int32_t b = cache->free_blocks[--cache->num_free];
    cache->refs[b] = 1;
    return b;
}

/* One owner lets go of block b; it goes back to the pool with its last owner. */
static void release_block(clmla_cache *cache, int32_t b)
{
    if (--cache->refs[b] == 0)
        cache->free_blocks[cache->num_free++] = b;
}

static int blocks_for(const clmla_cache *cache, long long tokens)
{
    return (int)((tokens + cache->config.block_tokens - 1) / cache->config.block_tokens);
}

/* Room for `want` entries in the sequence's block table. */
static clmla_status ensure_capacity(clmla_cache *cache, cache_seq *s, int want)
{
    if (want > s->capacity) {
        int cap = s->capacity ? s->capacity : 4;
        while (cap < want)
            cap *= 2;
        int32_t *blocks = clmla_host_realloc(cache->ctx, s->blocks, (size_t)cap * sizeof(int32_t));
        if (!blocks)
            return oom(cache->ctx);
        s->blocks = blocks;
        s->capacity = cap;
    }
    return CLMLA_SUCCESS;
}

/* Gives the sequence `want` blocks in all, new ones from the pool; the caller checked there are
   enough. */
static clmla_status grow_blocks(clmla_cache *cache, cache_seq *s, int want)
{
    clmla_status st = ensure_capacity(cache, s, want);
    if (st != CLMLA_SUCCESS)
        return st;
    while (s->num_blocks < want)
        s->blocks[s->num_blocks++] = take_block(cache);
    return CLMLA_SUCCESS;
}

/* Lets go of the sequence's blocks past the first `keep`, last first (so that, pushed in reverse,
   the first of them is handed out first next time). */
static void shrink_blocks(clmla_cache *cache, cache_seq *s, int keep)
{
    while (s->num_blocks > keep)
        release_block(cache, s->blocks[--s->num_blocks]);
}

/* How many of the blocks at table positions [first, end) of the sequence other sequences list too. */
static int shared_in(const clmla_cache *cache, const cache_seq *s, int first, int end)
{
    int n = 0;
    if (end > s->num_blocks)
        end = s->num_blocks;
    for (int j = first < 0 ? 0 : first; j < end; j++)
        n += cache->refs[s->blocks[j]] > 1;
    return n;
}

/* Enqueues the device copy of block `from` into block `to`, in every layer the rows of table
   position `index` that hold tokens of s (those below its length in that layer). */
static clmla_status copy_block(clmla_cache *cache, const cache_seq *s, int index, int32_t from, int32_t to)
{
    const int bt = cache->config.block_tokens;
    const size_t row_bytes = cache->row_bytes;
    for (int l = 0; l < cache->config.num_layers; l++) {
        long long rows = (long long)s->length[l] - (long long)index * bt;
        if (rows <= 0)
            continue;
        if (rows > bt)
            rows = bt;
        /* Counted like every other transfer (clcall.h), so that fault injection reaches it. */
        cl_int err = clmla_fault_hit(cache->ctx)
                         ? CL_OUT_OF_RESOURCES
                         : clEnqueueCopyBuffer(cache->ctx->queue, cache->layers[l], cache->layers[l],
                                               (size_t)from * bt * row_bytes, (size_t)to * bt * row_bytes,
                                               (size_t)rows * row_bytes, 0, NULL, NULL);
        /* index keys: the rows' share of the block, or all of an fp8 block (its scales follow its codes) */
        const size_t ib = cache->index_row_bytes, ibytes = cache->config.index_dtype == CLMLA_CACHE_FP8 ? (size_t)bt * ib
                                                                                                           : (size_t)rows * ib;
        if (err == CL_SUCCESS && ib && cache->index_layers[l])
            err = clmla_fault_hit(cache->ctx)
                      ? CL_OUT_OF_RESOURCES
                      : clEnqueueCopyBuffer(cache->ctx->queue, cache->index_layers[l], cache->index_layers[l],
                                            (size_t)from * bt * ib, (size_t)to * bt * ib, ibytes, 0, NULL, NULL);
        if (err != CL_SUCCESS)
            return clmla_fail(cache->ctx, err, "copying shared cache block %d into block %d (layer %d) failed: %s",
                              (int)from, (int)to, l, clmla_status_string(err));
    }
    return CLMLA_SUCCESS;
}

/* ---- transactions ------------------------------------------------------------------------------ */

/* Closes the record; its arrays stay the cache's for the next transaction. */
static void txn_free(cache_txn *txn)
{
    memset(txn, 0, sizeof(*txn));
}

/* Grows one of the cache's record arrays to `count` elements of `size` bytes. */
static int txn_grow(clmla_cache *cache, void **array, int count, size_t size)
{
    void *grown = clmla_host_realloc(cache->ctx, *array, (size_t)count * size);
    if (grown)
        *array = grown;
    return grown != NULL;
}

/* An empty record for `count` entries and at most `copies` copies of shared blocks. */
static clmla_status txn_open(clmla_cache *cache, cache_txn *txn, int layer, int count, int copies)
{
    memset(txn, 0, sizeof(*txn));
    if (count > cache->txn_entries) {
        const int grown = count + count / 2;
        if (!txn_grow(cache, (void **)&cache->txn_seq, grown, sizeof(int32_t)) ||
            !txn_grow(cache, (void **)&cache->txn_old_blocks, grown, sizeof(int)) ||
            !txn_grow(cache, (void **)&cache->txn_old_length, grown, sizeof(int)))
            return oom(cache->ctx);
        cache->txn_entries = grown;
    }
    if (copies > cache->txn_copies_capacity || !cache->txn_copies) {
        const int grown = copies > 0 ? copies + copies / 2 : 1;
        if (!txn_grow(cache, (void **)&cache->txn_copies, grown, sizeof(cache_copy)))
            return oom(cache->ctx);
        cache->txn_copies_capacity = grown;
    }
    txn->cache = cache;
    txn->layer = layer;
    txn->seq = cache->txn_seq;
    txn->old_blocks = cache->txn_old_blocks;
    txn->old_length = cache->txn_old_length;
    txn->copies = cache->txn_copies;
    return CLMLA_SUCCESS;
}

/* Makes entry i of the transaction, sequence s, ready for writes into its table positions
   [first, want): its own copy of each block there that was shared when the transaction began
   (the old block keeps its count until commit), then new blocks up to `want` in all. The caller
   checked that enough blocks are free, and rolls the transaction back on failure. */
static clmla_status prepare_writes(clmla_cache *cache, cache_txn *txn, int i, cache_seq *s, int first, int want)
{
    const int end = want < s->num_blocks ? want : s->num_blocks;
    for (int j = first < 0 ? 0 : first; j < end; j++) {
        const int32_t old = s->blocks[j];
        if (cache->refs[old] <= 1)
            continue;
        const int32_t copy = take_block(cache);
        clmla_status st = copy_block(cache, s, j, old, copy);
        if (st != CLMLA_SUCCESS) {
            release_block(cache, copy);
            return st;
        }
        s->blocks[j] = copy;
        txn->copies[txn->num_copies++] = (cache_copy){i, j, old, copy};
    }
    return grow_blocks(cache, s, want);
}

void clmla_cache_commit(cache_txn *txn)
{
    /* The shared blocks copied away from lose this owner now; a block that every owner copied
       away from in this step returns to the pool here, not before (see cache.h). */
    for (int c = 0; c < txn->num_copies; c++)
        release_block(txn->cache, txn->copies[c].old_block);
    txn_free(txn);
}

void clmla_cache_rollback(clmla_cache *cache, cache_txn *txn)
{
    /* In reverse order of the takes, so the free stack is exactly as before. */
    int c = txn->num_copies;
    for (int i = txn->count - 1; i >= 0; i--) {
        cache_seq *s = &cache->seqs[txn->seq[i]];
        s->length[txn->layer] = txn->old_length[i];
        shrink_blocks(cache, s, txn->old_blocks[i]);
        for (; c > 0 && txn->copies[c - 1].entry == i; c--) {
            const cache_copy *k = &txn->copies[c - 1];
            s->blocks[k->index] = k->old_block;
            release_block(cache, k->new_block);
        }
    }
    txn_free(txn);
}

/* ---- sequence operations ------------------------------------------------------------------------ */

clmla_status clmla_cache_seq_free(clmla_cache *cache, int32_t seq_id)
{
    clmla_status st = CLMLA_SUCCESS;
    cache_seq *s = seq_for(cache, "clmla_cache_seq_free", seq_id, &st);
    if (!s)
        return st;
    clmla_selection_forget(&cache->selection, seq_id);
    shrink_blocks(cache, s, 0);
    s->in_use = 0;
    return CLMLA_SUCCESS;
}

clmla_status clmla_cache_seq_truncate(clmla_cache *cache, int32_t seq_id, int tokens)
{
    clmla_status st = CLMLA_SUCCESS;
    cache_seq *s = seq_for(cache, "clmla_cache_seq_truncate", seq_id, &st);
    if (!s)
        return st;
    if (tokens < 0)
        return clmla_fail(cache->ctx, CLMLA_ERROR_INVALID_ARGUMENT, "cannot truncate sequence %d to %d tokens",
                          (int)seq_id, tokens);
    for (int l = 0; l < cache->config.num_layers; l++)
        if (tokens > s->length[l])
            return clmla_fail(cache->ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                              "cannot truncate sequence %d to %d tokens: layer %d holds only %d", (int)seq_id, tokens,
                              l, s->length[l]);
    clmla_selection_forget(&cache->selection, seq_id);
    for (int l = 0; l < cache->config.num_layers; l++)
        s->length[l] = tokens;
    shrink_blocks(cache, s, blocks_for(cache, tokens));
    return CLMLA_SUCCESS;
}

clmla_status clmla_cache_seq_fork(clmla_cache *cache, int32_t src_seq, int32_t *new_seq)
{
    if (new_seq)
        *new_seq = -1;
    if (!cache || !new_seq)
        return clmla_fail(cache ? cache->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_cache_seq_fork: NULL argument");
    if (!clmla_cache_find(cache, src_seq))
        return unknown(cache, "clmla_cache_seq_fork", src_seq);
    int32_t id = -1;
    clmla_status st = new_slot(cache, &id);
    if (st != CLMLA_SUCCESS)
        return st;
    const cache_seq *src = &cache->seqs[src_seq]; /* after new_slot, which may move cache->seqs */
    cache_seq *dst = &cache->seqs[id];
    int longest = 0;
    for (int l = 0; l < cache->config.num_layers; l++)
        if (src->length[l] > longest)
            longest = src->length[l];
    /* The blocks holding src's tokens; blocks it only reserved stay its own. */
    const int keep = blocks_for(cache, longest);
    st = ensure_capacity(cache, dst, keep);
    if (st != CLMLA_SUCCESS) {
        dst->in_use = 0;
        return st;
    }
    for (int j = 0; j < keep; j++) {
        dst->blocks[j] = src->blocks[j];
        cache->refs[src->blocks[j]]++;
    }
    dst->num_blocks = keep;
    memcpy(dst->length, src->length, (size_t)cache->config.num_layers * sizeof(int));
    *new_seq = id;
    return CLMLA_SUCCESS;
}

clmla_status clmla_cache_seq_reserve(clmla_cache *cache, int32_t seq_id, int tokens)
{
    clmla_status st = CLMLA_SUCCESS;
    cache_seq *s = seq_for(cache, "clmla_cache_seq_reserve", seq_id, &st);
    if (!s)
        return st;
    if (tokens < 0)
        return clmla_fail(cache->ctx, CLMLA_ERROR_INVALID_ARGUMENT, "cannot reserve %d tokens", tokens);
    const int want = blocks_for(cache, tokens);
    /* Appends up to `tokens` write positions [shortest layer's length, tokens): the shared blocks
       there are copied now, so that those appends need no block either. */
    int shortest = s->length[0];
    for (int l = 1; l < cache->config.num_layers; l++)
        if (s->length[l] < shortest)
            shortest = s->length[l];
    const int first = tokens > shortest ? shortest / cache->config.block_tokens : want;
    const int grow = want > s->num_blocks ? want - s->num_blocks : 0, copies = shared_in(cache, s, first, want);
    if (grow + copies == 0)
        return CLMLA_SUCCESS;
    if (grow + copies > cache->num_free) {
        if (copies == 0)
            return clmla_fail(cache->ctx, CLMLA_ERROR_CACHE_FULL,
                              "cache full: sequence %d needs %d more blocks for %d tokens, %d are free", (int)seq_id,
                              grow, tokens, cache->num_free);
        return clmla_fail(cache->ctx, CLMLA_ERROR_CACHE_FULL,
                          "cache full: sequence %d needs %d more blocks for %d tokens (%d of them copies of blocks it "
                          "shares), %d are free",
                          (int)seq_id, grow + copies, tokens, copies, cache->num_free);
    }
    cache_txn txn;
    st = txn_open(cache, &txn, 0, 1, copies);
    if (st != CLMLA_SUCCESS)
        return st;
    txn.seq[0] = seq_id;
    txn.old_blocks[0] = s->num_blocks;
    txn.old_length[0] = s->length[0];
    txn.count = 1;
    st = prepare_writes(cache, &txn, 0, s, first, want);
    if (st != CLMLA_SUCCESS)
        clmla_cache_rollback(cache, &txn);
    else
        clmla_cache_commit(&txn);
    return st;
}

clmla_status clmla_cache_seq_length(const clmla_cache *cache, int32_t seq_id, int layer, int *length)
{
    if (!cache || !length)
        return clmla_fail(cache ? cache->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_cache_seq_length: NULL argument");
    if (layer < 0 || layer >= cache->config.num_layers)
        return clmla_fail(cache->ctx, CLMLA_ERROR_INVALID_ARGUMENT, "layer %d is not in 0..%d", layer, cache->config.num_layers - 1);
    const cache_seq *s = clmla_cache_find(cache, seq_id);
    if (!s)
        return unknown(cache, "clmla_cache_seq_length", seq_id);
    *length = s->length[layer];
    return CLMLA_SUCCESS;
}

clmla_status clmla_cache_seq_blocks(const clmla_cache *cache, int32_t seq_id, int32_t *blocks, int max_blocks,
                                    int *num_blocks)
{
    if (!cache || (!blocks && max_blocks > 0))
        return clmla_fail(cache ? cache->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_cache_seq_blocks: NULL argument");
    const cache_seq *s = clmla_cache_find(cache, seq_id);
    if (!s)
        return unknown(cache, "clmla_cache_seq_blocks", seq_id);
    for (int i = 0; i < s->num_blocks && i < max_blocks; i++)
        blocks[i] = s->blocks[i];
    if (num_blocks)
        *num_blocks = s->num_blocks;
    return CLMLA_SUCCESS;
}

clmla_status clmla_cache_get_info(const clmla_cache *cache, clmla_cache_info *info)
{
    if (!cache || !info)
        return clmla_fail(cache ? cache->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_cache_get_info: NULL argument");
    memset(info, 0, sizeof(*info));
    info->bytes_per_token_per_layer = cache->row_bytes;
    info->index_bytes_per_token_per_layer = cache->index_row_bytes;
    info->bytes_per_block = (cache->row_bytes + cache->index_row_bytes) * (size_t)cache->config.block_tokens;
    int index_layers = 0;
    for (int l = 0; cache->index_layers && l < cache->config.num_layers; l++)
        index_layers += cache->index_layers[l] != NULL || !cache->layers[l]; /* a shell counts what it would hold */
    info->bytes_total = (cache->row_bytes * (size_t)cache->config.num_layers + cache->index_row_bytes * (size_t)index_layers) *
                        (size_t)cache->config.block_tokens * (size_t)cache->config.num_blocks;
    info->block_tokens = cache->config.block_tokens;
    info->blocks_total = cache->config.num_blocks;
    info->blocks_free = cache->num_free;
    info->blocks_used = cache->config.num_blocks - cache->num_free;
    for (int i = 0; i < cache->num_seqs; i++)
        info->sequences += cache->seqs[i].in_use;
    return CLMLA_SUCCESS;
}

clmla_status clmla_cache_layer_buffer(const clmla_cache *cache, int layer, cl_mem *buffer)
{
    if (!cache || !buffer)
        return clmla_fail(cache ? cache->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_cache_layer_buffer: NULL argument");
    *buffer = NULL;
    if (layer < 0 || layer >= cache->config.num_layers)
        return clmla_fail(cache->ctx, CLMLA_ERROR_INVALID_ARGUMENT, "layer %d is not in the cache (layers 0..%d)", layer,
                          cache->config.num_layers - 1);
    *buffer = cache->layers[layer];
    return CLMLA_SUCCESS;
}

/* ---- appends as transactions ---------------------------------------------------------------- */

/* clmla_cache_check_append, and in *copies how many shared blocks the append would copy. */
static clmla_status check_entries(clmla_cache *cache, int layer, const clmla_batch_entry *entries, int count,
                                  long long *total_tokens, int *copies)
{
    clmla_context *ctx = cache->ctx;
    if (layer < 0 || layer >= cache->config.num_layers)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "cache layer %d is not in 0..%d", layer, cache->config.num_layers - 1);
    if (!entries || count < 1)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "a step needs at least one entry (got %d)", count);
    long long need = 0, tokens = 0;
    int shared = 0;
    for (int i = 0; i < count; i++) {
        const cache_seq *s = clmla_cache_find(cache, entries[i].seq_id);
        if (!s)
            return unknown(cache, "a step's entry", entries[i].seq_id);
        if (entries[i].num_tokens < 1)
            return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "entry %d (sequence %d) has %d tokens; at least 1 is needed", i,
                              (int)entries[i].seq_id, (int)entries[i].num_tokens);
        for (int j = 0; j < i; j++)
            if (entries[j].seq_id == entries[i].seq_id)
                return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "sequence %d appears twice in one step (entries %d and %d)",
                                  (int)entries[i].seq_id, j, i);
        const long long new_length = (long long)s->length[layer] + entries[i].num_tokens;
        if (new_length > (long long)cache->config.num_blocks * cache->config.block_tokens)
            return clmla_fail(ctx, CLMLA_ERROR_CACHE_FULL, "cache full: sequence %d would hold %lld tokens, the pool holds %lld",
                              (int)entries[i].seq_id, new_length, (long long)cache->config.num_blocks * cache->config.block_tokens);
        const int want = blocks_for(cache, new_length);
        if (want > s->num_blocks)
            need += want - s->num_blocks;
        /* The blocks it writes into that other sequences list too are copied first (cache.h). */
        const int c = shared_in(cache, s, s->length[layer] / cache->config.block_tokens, want);
        need += c;
        shared += c;
        tokens += entries[i].num_tokens;
    }
    if (need > cache->num_free) {
        if (shared == 0)
            return clmla_fail(ctx, CLMLA_ERROR_CACHE_FULL, "cache full: the step needs %lld more blocks, %d of %d are free",
                              need, cache->num_free, cache->config.num_blocks);
        return clmla_fail(ctx, CLMLA_ERROR_CACHE_FULL,
                          "cache full: the step needs %lld more blocks (%d of them copies of shared blocks it writes "
                          "into), %d of %d are free",
                          need, shared, cache->num_free, cache->config.num_blocks);
    }
    if (total_tokens)
        *total_tokens = tokens;
    if (copies)
        *copies = shared;
    return CLMLA_SUCCESS;
}

clmla_status clmla_cache_check_append(clmla_cache *cache, int layer, const clmla_batch_entry *entries, int count,
                                      long long *total_tokens)
{
    return check_entries(cache, layer, entries, count, total_tokens, NULL);
}

clmla_status clmla_cache_begin_append(clmla_cache *cache, int layer, const clmla_batch_entry *entries, int count,
                                      cache_txn *txn)
{
    memset(txn, 0, sizeof(*txn));
    int copies = 0;
    clmla_status st = check_entries(cache, layer, entries, count, NULL, &copies);
    if (st != CLMLA_SUCCESS)
        return st;
    st = txn_open(cache, txn, layer, count, copies);
    if (st != CLMLA_SUCCESS)
        return st;
    for (int i = 0; i < count; i++) {
        cache_seq *s = &cache->seqs[entries[i].seq_id];
        txn->seq[i] = entries[i].seq_id;
        txn->old_blocks[i] = s->num_blocks;
        txn->old_length[i] = s->length[layer];
        txn->count = i + 1;
        st = prepare_writes(cache, txn, i, s, s->length[layer] / cache->config.block_tokens,
                            blocks_for(cache, (long long)s->length[layer] + entries[i].num_tokens));
        if (st != CLMLA_SUCCESS) {
            clmla_cache_rollback(cache, txn);
            return st;
        }
        s->length[layer] += entries[i].num_tokens;
    }
    return CLMLA_SUCCESS;
}

/* ---- device-side writes and reads ----------------------------------------------------------- */

clmla_status clmla_cache_enqueue_write(clmla_cache *cache, int layer, int count, cl_mem c_kv, size_t c_kv_offset,
                                       int c_kv_stride, cl_mem k_rope, size_t k_rope_offset, int k_rope_stride,
                                       cl_mem slots, cl_event *event)
{
    cl_kernel k = cache->write_kernel;
    const int ckv_off = (int)c_kv_offset, kr_off = (int)k_rope_offset;
    CLMLA_SET_ARG(cache->ctx, k, 0, c_kv);
    CLMLA_SET_ARG(cache->ctx, k, 1, ckv_off);
    CLMLA_SET_ARG(cache->ctx, k, 2, c_kv_stride);
    CLMLA_SET_ARG(cache->ctx, k, 3, k_rope);
    CLMLA_SET_ARG(cache->ctx, k, 4, kr_off);
    CLMLA_SET_ARG(cache->ctx, k, 5, k_rope_stride);
    CLMLA_SET_ARG(cache->ctx, k, 6, slots);
    CLMLA_SET_ARG(cache->ctx, k, 7, cache->layers[layer]);
    /* an item per value, or for fp8 one per 128-value tile of c^KV and one per value of k^R */
    const size_t items = cache->config.dtype == CLMLA_CACHE_FP8
                             ? (size_t)(cache->config.kv_lora_rank / 128 + cache->config.rope_dim)
                             : (size_t)cache->row;
    const size_t global[2] = {items, (size_t)count};
    cl_int err = clmla_cl_enqueue_rows(cache->ctx, k, 2, global, event);
    if (err != CL_SUCCESS)
        return clmla_fail_cl(cache->ctx, err, "enqueue cache_write");
    return CLMLA_SUCCESS;
}

clmla_status clmla_cache_enqueue_gather(clmla_cache *cache, int layer, cl_mem table, int table_offset, int start, int n,
                                        cl_mem out, size_t out_offset)
{
    cl_kernel k = cache->gather_kernel;
    const int out_off = (int)out_offset;
    CLMLA_SET_ARG(cache->ctx, k, 0, cache->layers[layer]);
    CLMLA_SET_ARG(cache->ctx, k, 1, table);
    CLMLA_SET_ARG(cache->ctx, k, 2, table_offset);
    CLMLA_SET_ARG(cache->ctx, k, 3, cache->config.block_tokens);
    CLMLA_SET_ARG(cache->ctx, k, 4, start);
    CLMLA_SET_ARG(cache->ctx, k, 5, out);
    CLMLA_SET_ARG(cache->ctx, k, 6, out_off);
    const size_t global[2] = {(size_t)cache->row, (size_t)n};
    cl_int err = clmla_cl_enqueue_rows(cache->ctx, k, 2, global, NULL);
    if (err != CL_SUCCESS)
        return clmla_fail_cl(cache->ctx, err, "enqueue cache_gather");
    return CLMLA_SUCCESS;
}

clmla_status clmla_cache_append_cl(clmla_cache *cache, int layer, int32_t seq_id, int n, cl_mem c_kv, size_t c_kv_offset,
                                   int c_kv_stride, cl_mem k_rope, size_t k_rope_offset, int k_rope_stride, cl_event *event)
{
    if (!cache)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_cache_append_cl: NULL cache");
    if (!c_kv || !k_rope || c_kv_stride < cache->config.kv_lora_rank || k_rope_stride < cache->config.rope_dim ||
        c_kv_offset > INT_MAX || k_rope_offset > INT_MAX)
        return clmla_fail(cache->ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_cache_append_cl: NULL buffer, or a stride below the row width (c_kv stride %d < %d or "
                          "k_rope stride %d < %d), or an offset past 2^31",
                          c_kv_stride, cache->config.kv_lora_rank, k_rope_stride, cache->config.rope_dim);
    clmla_batch_entry entry = {seq_id, n};
    cache_txn txn;
    clmla_status st = clmla_cache_begin_append(cache, layer, &entry, 1, &txn);
    if (st != CLMLA_SUCCESS)
        return st;
    const cache_seq *s = &cache->seqs[seq_id];
    /* The slots go through the cache's kept table: the host array is rewritten once the last call's
       write from it has completed (scratch.h). */
    clmla_cl_event_done(cache->ctx, &cache->append_written);
    const size_t bytes = (size_t)n * sizeof(int);
    st = clmla_staged_reserve(cache->ctx, &cache->append_slots, 1, &bytes);
    if (st == CLMLA_SUCCESS) {
        int *slots = clmla_staged_host(&cache->append_slots, 0);
        for (int i = 0; i < n; i++)
            slots[i] = clmla_cache_row(cache, s, txn.old_length[0] + i);
        st = clmla_staged_write(cache->ctx, &cache->append_slots, &bytes, &cache->append_written);
    }
    if (st == CLMLA_SUCCESS)
        st = clmla_cache_enqueue_write(cache, layer, n, c_kv, c_kv_offset, c_kv_stride, k_rope, k_rope_offset,
                                       k_rope_stride, cache->append_slots.part[0], event);
    if (st != CLMLA_SUCCESS)
        clmla_cache_rollback(cache, &txn);
    else
        clmla_cache_commit(&txn);
    return st;
}

clmla_status clmla_cache_read(const clmla_cache *ccache, int layer, int32_t seq_id, int start, int n, float *c_kv,
                              float *k_rope)
{
    clmla_cache *cache = (clmla_cache *)ccache; /* reading enqueues kernels; the cache's state is unchanged */
    if (!cache)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_cache_read: NULL cache");
    if (layer < 0 || layer >= cache->config.num_layers)
        return clmla_fail(cache->ctx, CLMLA_ERROR_INVALID_ARGUMENT, "layer %d is not in 0..%d", layer, cache->config.num_layers - 1);
    const cache_seq *s = clmla_cache_find(cache, seq_id);
    if (!s)
        return unknown(cache, "clmla_cache_read", seq_id);
    if (start < 0 || n < 0 || start + (long long)n > s->length[layer])
        return clmla_fail(cache->ctx, CLMLA_ERROR_INVALID_ARGUMENT, "tokens [%d, %d) are outside the %d stored in layer %d",
                          start, start + n, s->length[layer], layer);
    if (n == 0)
        return CLMLA_SUCCESS;
    clmla_context *ctx = cache->ctx;
    const size_t row_bytes = (size_t)cache->row * sizeof(float);
    float *host = malloc((size_t)n * row_bytes);
    if (!host)
        return oom(ctx);
    cl_mem table = NULL, dense = NULL;
    cl_int err = CL_SUCCESS;
    clmla_status st = clmla_upload(ctx, s->blocks, (size_t)s->num_blocks * sizeof(int32_t), &table);
    if (st == CLMLA_SUCCESS) {
        dense = clmla_cl_buffer(ctx, CL_MEM_WRITE_ONLY, (size_t)n * row_bytes, NULL, &err);
        if (!dense)
            st = clmla_fail_cl(ctx, err, "clCreateBuffer");
    }
    if (st == CLMLA_SUCCESS)
        st = clmla_cache_enqueue_gather(cache, layer, table, 0, start, n, dense, 0);
    if (st == CLMLA_SUCCESS) {
        err = clmla_cl_read(ctx, dense, 0, (size_t)n * row_bytes, host);
        if (err != CL_SUCCESS)
            st = clmla_fail_cl(ctx, err, "clEnqueueReadBuffer");
    }
    if (st == CLMLA_SUCCESS)
        for (int i = 0; i < n; i++) {
            if (c_kv)
                memcpy(c_kv + (size_t)i * cache->config.kv_lora_rank, host + (size_t)i * cache->row,
                       (size_t)cache->config.kv_lora_rank * sizeof(float));
            if (k_rope)
                memcpy(k_rope + (size_t)i * cache->config.rope_dim, host + (size_t)i * cache->row + cache->config.kv_lora_rank,
                       (size_t)cache->config.rope_dim * sizeof(float));
        }
    clmla_release_mem(table);
    clmla_release_mem(dense);
    free(host);
    return st;
}

cl_mem clmla_cache_index_keys(const clmla_cache *cache, int layer)
{
    return cache->index_layers && layer >= 0 && layer < cache->config.num_layers ? cache->index_layers[layer] : NULL;
}

clmla_status clmla_cache_index_buffer(const clmla_cache *cache, int layer, cl_mem *buffer)
{
    if (!cache || !buffer)
        return clmla_fail(cache ? cache->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_cache_index_buffer: NULL argument");
    *buffer = clmla_cache_index_keys(cache, layer);
    if (!*buffer)
        return clmla_fail(cache->ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_cache_index_buffer: %s", !cache->index_layers ? "the cache has no index-key cache"
                                                          : layer < 0 || layer >= cache->config.num_layers
                                                              ? "layer out of range"
                                                              : "the layer holds no index keys (a layer without an indexer)");
    return CLMLA_SUCCESS;
}

clmla_status clmla_cache_read_index(const clmla_cache *cache, int layer, int32_t seq_id, int start, int n, float *keys)
{
    static const char fn[] = "clmla_cache_read_index";
    if (!cache)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "%s: NULL cache", fn);
    clmla_context *ctx = cache->ctx;
    if (!cache->index_layers)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: the cache has no index-key cache (index_head_dim 0)", fn);
    if (layer < 0 || layer >= cache->config.num_layers)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: layer %d is not in 0..%d", fn, layer,
                          cache->config.num_layers - 1);
    if (!cache->index_layers[layer])
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: layer %d holds no index keys (a layer without an indexer)",
                          fn, layer);
    const cache_seq *s = clmla_cache_find(cache, seq_id);
    if (!s)
        return unknown(cache, fn, seq_id);
    if (start < 0 || n < 0 || start + (long long)n > s->length[layer])
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: tokens [%d, %d) are outside the %d stored in layer %d", fn,
                          start, start + n, s->length[layer], layer);
    if (n > 0 && !keys)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: NULL keys", fn);
    const int dI = cache->config.index_head_dim, bt = cache->config.block_tokens;
    const size_t rb = cache->index_row_bytes;
    const clmla_cache_dtype dt = cache->config.index_dtype;
    unsigned char *raw = malloc((size_t)bt * rb);
    if (!raw)
        return oom(ctx);
    clmla_status st = CLMLA_SUCCESS;
    /* one read per run of the sequence's tokens inside one block (fp8: the whole block) */
    for (int pos = start; st == CLMLA_SUCCESS && pos < start + n;) {
        const int off = pos % bt, run = bt - off < start + n - pos ? bt - off : start + n - pos;
        const size_t slot = (size_t)s->blocks[pos / bt] * bt + off;
        const int fp8 = dt == CLMLA_CACHE_FP8;
        cl_int err = clmla_cl_read(ctx, cache->index_layers[layer], fp8 ? (slot - off) * rb : slot * rb,
                                   fp8 ? (size_t)bt * rb : (size_t)run * rb, raw);
        if (err != CL_SUCCESS) {
            st = clmla_fail_cl(ctx, err, "clEnqueueReadBuffer(index keys)");
            break;
        }
        for (size_t i = 0; i < (size_t)run * dI; i++) {
            float v;
            uint16_t h;
            if (fp8) {
                const size_t row = (size_t)off + i / (size_t)dI;
                float scale;
                memcpy(&scale, raw + (size_t)bt * dI + 4 * row, 4);
                v = clmla_e4m3_to_float(raw[row * dI + i % (size_t)dI]) * scale;
            } else if (dt == CLMLA_CACHE_F32) {
                memcpy(&v, raw + 4 * i, 4);
            } else {
                memcpy(&h, raw + 2 * i, 2);
                v = dt == CLMLA_CACHE_BF16 ? clmla_bf16_to_float(h) : clmla_f16_to_float(h);
            }
            keys[(size_t)(pos - start) * dI + i] = v;
        }
        pos += run;
    }
    free(raw);
    return st;
}

size_t clmla_index_row_bytes(clmla_cache_dtype dtype, int head_dim)
{
    if (head_dim <= 0)
        return 0;
    const size_t n = (size_t)head_dim;
    return dtype == CLMLA_CACHE_F32 ? 4 * n
           : dtype == CLMLA_CACHE_F16 || dtype == CLMLA_CACHE_BF16 ? 2 * n
           : dtype == CLMLA_CACHE_FP8 ? n + 4
                                       : 0;
}
