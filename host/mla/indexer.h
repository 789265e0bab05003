/* DeepSeek Sparse Attention's lightning indexer on the device (internal; the layer's sparse steps
   run it, host/mla/layer_step.c): the index keys written into the key cache, RoPE on the indexer's
   queries, the scores of every cached index key for each query token, and their top-k selection
   (cl/indexer.cl, docs/DESIGN.md "Sparse attention").

   A clmla_index_kernels holds the two kernels built once for one shape (indexer heads, head dim,
   block tokens, key dtype) on one context; enqueuing them creates nothing. Both enqueue on the
   context's queue without waiting; *event (optional) completes when the output is written (NULL
   after a failure). Arguments are checked before anything is enqueued; a bad one is
   CLMLA_ERROR_INVALID_ARGUMENT with a message naming it. The contents of the int32 arrays are the
   caller's to get right: a block id or table row outside the arrays is clamped on the device (no
   read out of bounds, meaningless scores), a ctx_len is clamped to [0, max_ctx_len]. */
#ifndef CLMLA_INDEXER_H
#define CLMLA_INDEXER_H
#include "internal.h"

typedef struct clmla_index_config {
    int heads;        /* H_I (index_n_heads), >= 1 */
    int head_dim;     /* d_I (index_head_dim), >= 1 */
    int block_tokens; /* P: tokens per block of the key cache, >= 1 */
    /* the keys' element type, as clmla_cache_config.index_dtype: f32, f16, bf16 (rounded by the
       writer) or fp8 (DeepSeek's: the key rotated by a Hadamard transform, e4m3 codes with a float32
       power-of-two scale per key, a block its codes then its scales; head_dim a power of two) */
    clmla_cache_dtype key_dtype;
    /* The key writer and the queries' RoPE (0: those two kernels are not built): the rotated dims
       (the first rope_dim of each key and head, even, <= head_dim) and their pairing. */
    int rope_dim;
    clmla_rope_pairing rope_pairing;
} clmla_index_config;

typedef struct clmla_index_kernels clmla_index_kernels;

/* Builds both kernels for cfg on ctx (one program build, cached like every program). *out NULL on
   failure. The object belongs to its context and is destroyed before it. */
clmla_status clmla_index_kernels_create(clmla_context *ctx, const clmla_index_config *cfg, clmla_index_kernels **out);
void clmla_index_kernels_destroy(clmla_index_kernels *ik);

/* (The bytes of one token's index key: clmla_index_row_bytes, cache.h.) */

/* Bytes of one block of the key cache: block_tokens * head_dim values of the key dtype (fp8: and
   block_tokens float32 scales after the codes). Block b starts at byte b times this, its row r (a
   token) at b * block_tokens + r keys of head_dim values (fp8: codes at r * head_dim of the block,
   the scale at block_tokens * head_dim + 4 r). */
size_t clmla_index_block_bytes(const clmla_index_kernels *ik);

/* scores[t, s] = sum_h w[t, h] max(q[t, h] . k_s, 0) for s < token_ctx_len[t], -inf for
   token_ctx_len[t] <= s < max_ctx_len; columns past max_ctx_len are not written. */
typedef struct clmla_index_scores_args {
    int num_tokens;                     /* T >= 1 */
    cl_mem q; size_t q_offset;          /* [T, H_I, d_I] float32, after RoPE (offset in floats) */
    cl_mem weights; size_t weights_offset; /* [T, H_I] float32: w' = W_w x (H_I d_I)^-1/2 */
    cl_mem keys;                        /* the key cache: num_blocks blocks (its size over
                                           clmla_index_block_bytes, at least 1) */
    cl_mem block_table;                 /* [rows, max_blocks_per_seq] int32 block ids (rows: its size
                                           over a row's bytes, at least 1) */
    int max_blocks_per_seq;             /* >= 1 */
    cl_mem token_seq;                   /* [T] int32: row of block_table */
    cl_mem token_ctx_len;               /* [T] int32: visible positions 0 .. ctx_len-1 */
    int max_ctx_len;                    /* >= 1, at most max_blocks_per_seq * block_tokens */
    cl_mem scores; size_t scores_offset; /* [T, scores_stride] float32 (offset in floats) */
    int scores_stride;                  /* >= max_ctx_len */
    int token_offset;                   /* token t's entries of token_seq and token_ctx_len are at
                                           token_offset + t (>= 0; the buffers hold that many more) */
} clmla_index_scores_args;

clmla_status clmla_index_scores(clmla_index_kernels *ik, const clmla_index_scores_args *a, cl_event *event);

/* indices[t, :] = the n_t = min(top_k, ctx_len[t]) positions of row t ranked first by (score
   descending, position ascending), in ascending position order, then -1 up to top_k (DSA.md
   section 4; -0 ranks as +0, NaN below -inf). Only the first min(ctx_len[t], max_ctx_len) columns
   of a row are read. */
typedef struct clmla_index_topk_args {
    int num_tokens;                      /* T >= 1 */
    int top_k;                           /* K >= 1 */
    cl_mem scores; size_t scores_offset; /* [T, scores_stride] float32 */
    int scores_stride;                   /* >= max_ctx_len */
    cl_mem token_ctx_len;                /* [T] int32 */
    int max_ctx_len;                     /* >= 0 */
    cl_mem indices; size_t indices_offset; /* [T, top_k] int32 (offset in ints) */
    int token_offset;                    /* as in clmla_index_scores_args */
} clmla_index_topk_args;

clmla_status clmla_index_topk(clmla_index_kernels *ik, const clmla_index_topk_args *a, cl_event *event);

/* The index keys of T new tokens into the key cache `keys` (its layout above): key t is
   LayerNorm(src[t]) (norm_w, norm_b [head_dim] float32, eps), its first rope_dim values rotated
   with row positions[t] of `table` ([rows, rope_dim/2] float2 A cos, A sin), stored at slot
   slots[t] in the key dtype. src [T, src_stride] float32 from src_offset. No checks beyond the
   kernels being built: the layer's own buffers. */
clmla_status clmla_index_write_keys(clmla_index_kernels *ik, int T, cl_mem src, int src_offset, int src_stride,
                                    cl_mem norm_w, cl_mem norm_b, float eps, cl_mem positions, cl_mem table,
                                    cl_mem slots, cl_mem keys);
/* RoPE on the first rope_dim values of every head of q [T, heads, head_dim] (float32 from q_offset),
   in place, with rows positions[t] of table. */
clmla_status clmla_index_rope_queries(clmla_index_kernels *ik, int T, cl_mem q, int q_offset, cl_mem positions,
                                      cl_mem table);

/* The kernels for `heads` indexer heads with the cache's block size, key dtype and d_I, with the
   key writer and query RoPE for rope_dim (0: none) and pairing: built on the first call with that
   shape and kept by the cache (a few shapes at most; more is CLMLA_ERROR_UNSUPPORTED). */
struct clmla_cache;
clmla_status clmla_index_kernels_for(struct clmla_cache *cache, int heads, int rope_dim, clmla_rope_pairing pairing,
                                     clmla_index_kernels **out);

/* clmla_index_select's work once its arguments are checked: scores of at most
   CLMLA_INDEX_SCORE_VALUES (token, key) pairs at a time in the context's scratch, the top-k of each
   chunk into a->indices. `keys` is the cache layer's index-key buffer. */
#define CLMLA_INDEX_SCORE_VALUES ((size_t)1 << 24)
clmla_status clmla_index_select_enqueue(clmla_index_kernels *ik, cl_mem keys, const clmla_index_select_args *a,
                                        cl_event *event);

/* Test hooks: the work-group size the top-k kernel runs with (0: the library's choice, else at most
   the kernel's limit) and the keys per work-item of the scores kernel (0: the library's choice, a
   multiple of the kernel's tile of 16 keys; else exactly this many). */
void clmla_index_set_topk_items(clmla_index_kernels *ik, int items);
void clmla_index_set_score_chunk(clmla_index_kernels *ik, int keys);
#endif
