/* The paged latent KV cache: its state (read directly only by cache.c, attention.c's kernel slots
   and the invariant checks of tests/test_cache.c), the append transaction a step runs in, and the
   views and kernels the layer uses. */
#ifndef CLMLA_CACHE_H
#define CLMLA_CACHE_H
#include "internal.h"
#include "kernel_store.h"
#include "scratch.h"
#include "selection.h"

typedef struct cache_seq {
    int in_use;
    int32_t *blocks;  /* block ids, in token order */
    int num_blocks;
    int capacity;     /* allocated length of blocks */
    int *length;      /* [num_layers] tokens stored per layer */
} cache_seq;

typedef struct cache_copy cache_copy;

/* The indexer kernel sets a cache keeps (host/mla/indexer.c, clmla_index_kernels_for). */
#define CLMLA_CACHE_INDEX_KERNELS 4

struct clmla_cache {
    clmla_context *ctx;
    clmla_cache_config config; /* defaults resolved */
    int row;                   /* rkv + dr values per token */
    size_t row_bytes;          /* one token's row: (rkv + dr) x 4 (f32) or 2 (f16, bf16); fp8 as cl/prelude.cl */
    cl_mem *layers;            /* [num_layers] buffers [num_blocks * block_tokens, row] */
    /* the index-key cache (config.index_head_dim > 0; else NULL): [num_layers] buffers
       [num_blocks * block_tokens, index_head_dim] of float32 or bf16 bits, the same slots as the rows */
    cl_mem *index_layers;
    size_t index_row_bytes;
    /* the indexer's kernels for this cache's blocks and key dtype, one set per (heads, rope dims,
       pairing) asked for (host/mla/indexer.c, clmla_index_kernels_for), built on first use */
    struct clmla_index_kernels *index_kernels[CLMLA_CACHE_INDEX_KERNELS];
    void (*index_kernels_release)(struct clmla_index_kernels *); /* set by the indexer with the first */
    int32_t *free_blocks;      /* stack of free block ids */
    int num_free;
    int *refs;                 /* [num_blocks] how many sequences list each block (see below) */
    cache_seq *seqs;
    int num_seqs;              /* allocated entries of seqs (in use or not) */
    char options[128];         /* kernel build options: -D RKV= -D DR= [-D CACHE_F16 | -D CACHE_BF16 | -D CACHE_FP8] */
    cl_kernel write_kernel;    /* cache_write.cl */
    cl_kernel gather_kernel;   /* cache_gather.cl */
    cl_kernel combine_kernel;  /* attn_combine.cl */
    cl_kernel combine_rows_kernel; /* attn_combine_rows, after attn_latent_rows */
    /* the latent attention kernels, built on first use (host/mla/attention.c): attn_latent per heads
       per group, with -D SPARSE, -D MASK or folded tokens; attn_latent_rows and attn_latent_lanes
       per heads per item, likewise; each with its work-group size */
    clmla_kernel_store latent_kernels;
    /* The arrays of the open transaction's record (cache_txn points into them), kept between steps
       and grown when a step has more entries or copies: a cache has at most one transaction open,
       since the calls on a context do not overlap. */
    int32_t *txn_seq;
    int *txn_old_blocks, *txn_old_length;
    cache_copy *txn_copies;
    int txn_entries, txn_copies_capacity;
    /* clmla_cache_append_cl's cache slots, kept like a layer's step tables (scratch.h), and the
       completion of their last write */
    clmla_staged append_slots;
    cl_event append_written;
    cache_selection selection; /* the last full sparse-attention layer's (selection.h) */
};

/* Shared blocks (clmla_cache_seq_fork) and copy on write.
 *
 * A block may be listed by several sequences (a fork shares the blocks holding the source's
 * tokens); refs[b] counts them (between begin_append and commit, a block that the step copied
 * away from still counts the sequences that listed it when the step began), and a block is in the
 * free stack exactly when refs[b] is 0. A sequence never lists a block twice.
 *
 * Rows are written only at positions >= a sequence's length in a layer, so a shared block is
 * safe until one of its sequences writes into it. Before that, the writer takes a free block,
 * the block's rows are copied into it on the device (clEnqueueCopyBuffer, every layer, the rows
 * below the writer's length; the queue is in order, so the copy runs after every earlier write
 * and before the step's own write) and the writer's table points at the copy.
 *
 * In a transaction (an append step) the rule is decided on the counts as they were when the step
 * began: a block listed by several sequences then is copied by every one of them that writes
 * into it, and the old block's count drops only at commit (where it returns to the pool if it
 * reached 0). So the step never writes into a block that any sequence listed at its start unless
 * that sequence was the block's only owner, and rollback only has to point the tables back at
 * the old blocks and return the copies: nothing any sequence held has been overwritten. */
struct cache_copy {
    int entry;           /* which entry of the transaction */
    int index;           /* position in that sequence's block table */
    int32_t old_block;   /* the shared block the table listed */
    int32_t new_block;   /* its copy, now in the table */
};

/* What an append changed, so that a failure later in the step can put everything back. Its arrays
   are the cache's (txn_seq, ...). */
typedef struct cache_txn {
    clmla_cache *cache;
    int layer;
    int count;
    int32_t *seq;        /* [count] */
    int *old_blocks;     /* [count] */
    int *old_length;     /* [count] */
    int num_copies;      /* shared blocks copied (copy on write), in the order they were taken */
    cache_copy *copies;  /* [at most the number the check counted] */
} cache_txn;

/* A cache of config's layout (one layer) without memory: its kernels and build options, no layer
   buffers and no free blocks, for calls over rows a caller owns (host/mla/paged.c), which name the
   rows' buffer in each launch (latent_launch.kv). */
clmla_status clmla_cache_create_shell(clmla_context *ctx, const clmla_cache_config *config, clmla_cache **out);

/* clmla_cache_create with index keys only in the layers where index_layers[l] is non-zero (a model's
   layers with an indexer; NULL: every layer, as clmla_cache_create). */
clmla_status clmla_cache_create_indexed(clmla_context *ctx, const clmla_cache_config *config,
                                        const unsigned char *index_layers, clmla_cache **out);

/* Checks that the entries could be appended (known, distinct sequences, num_tokens >= 1, enough
   free blocks for new blocks and for copies of shared blocks written into) without changing
   anything; *total_tokens (optional) is their sum. */
clmla_status clmla_cache_check_append(clmla_cache *cache, int layer, const clmla_batch_entry *entries, int count,
                                      long long *total_tokens);
/* Checks the entries as above, takes the blocks they need (copying the shared blocks they will
   write into, see above) and advances their lengths in `layer`; on any error nothing has changed. */
clmla_status clmla_cache_begin_append(clmla_cache *cache, int layer, const clmla_batch_entry *entries, int count,
                                      cache_txn *txn);
/* Undoes begin_append (block tables, new blocks and copies back to the pool, lengths restored),
   then frees the record. */
void clmla_cache_rollback(clmla_cache *cache, cache_txn *txn);
/* Keeps the changes (the shared blocks copied away from lose an owner, and return to the pool
   when that was their last) and frees the record. */
void clmla_cache_commit(cache_txn *txn);

/* Cache row of token `pos` of a sequence (its block must exist). */
static inline int clmla_cache_row(const clmla_cache *cache, const cache_seq *s, int pos)
{
    const int bt = cache->config.block_tokens;
    return s->blocks[pos / bt] * bt + pos % bt;
}

/* What a step needs of a sequence: its block table (token order) and its length in one layer;
   valid until the cache next changes. */
typedef struct clmla_seq_view {
    const int32_t *blocks;
    int num_blocks;
    int length;
} clmla_seq_view;

/* The view of seq_id in `layer`, or CLMLA_ERROR_UNKNOWN_SEQUENCE. */
clmla_status clmla_cache_seq_view(const clmla_cache *cache, int32_t seq_id, int layer, clmla_seq_view *view);

/* Cache row of token `pos` of a viewed sequence (its block must exist). */
static inline int clmla_seq_view_row(const clmla_cache *cache, const clmla_seq_view *v, int pos)
{
    const int bt = cache->config.block_tokens;
    return v->blocks[pos / bt] * bt + pos % bt;
}

/* The sequence, or NULL after setting CLMLA_ERROR_UNKNOWN_SEQUENCE on the context. */
cache_seq *clmla_cache_find(const clmla_cache *cache, int32_t seq_id);

/* The index-key cache's buffer of `layer` (NULL when the cache or the layer has none): slot s's key at s *
   index_head_dim values of config.index_dtype. */
cl_mem clmla_cache_index_keys(const clmla_cache *cache, int layer);

/* Enqueues cache_write for count tokens whose cache rows are in `slots` (device int32 [count]). */
clmla_status clmla_cache_enqueue_write(clmla_cache *cache, int layer, int count, cl_mem c_kv, size_t c_kv_offset,
                                       int c_kv_stride, cl_mem k_rope, size_t k_rope_offset, int k_rope_stride,
                                       cl_mem slots, cl_event *event);
/* Enqueues cache_gather of tokens [start, start+n) of the sequence whose block table is on the
   device in `table` from table_offset, into out (float32 rows of rkv+dr) from out_offset. */
clmla_status clmla_cache_enqueue_gather(clmla_cache *cache, int layer, cl_mem table, int table_offset, int start, int n,
                                        cl_mem out, size_t out_offset);
/* Bytes of one token's index key of head_dim values of dtype (fp8: its codes and its scale); 0 for
   a dtype the index-key cache does not hold or head_dim <= 0. The one place the layout's sizes are
   made (the cache's buffers, the indexer kernels' block size). */
size_t clmla_index_row_bytes(clmla_cache_dtype dtype, int head_dim);

#endif
