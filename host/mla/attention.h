/* Launchers of the attention kernels. */
#ifndef CLMLA_ATTENTION_H
#define CLMLA_ATTENTION_H
#include "cache.h"
#include "clmla_tuning.h"

typedef struct latent_launch {
    int num_tokens, num_heads;
    float scale;
    cl_mem q_latent; size_t q_latent_offset; int q_latent_token_stride, q_latent_head_stride;
    cl_mem q_rope; size_t q_rope_offset; int q_rope_token_stride, q_rope_head_stride;
    cl_mem block_table; int max_blocks_per_seq;
    cl_mem token_seq, token_ctx_len;
    int max_ctx_len;
    cl_mem out; size_t out_offset;  /* [T, H, rkv] */
    cl_mem lse; size_t lse_offset;  /* [T, H]; NULL = not wanted */
    /* Sparse (cl/attn_latent.cl built with -D SPARSE) when indices is not NULL: token t's keys are
       the positions indices[indices_offset + t*topk + e], e < topk, those outside [0, ctx) skipped;
       the split then cuts the list (topk, not max_ctx_len, sizes it). */
    cl_mem indices; size_t indices_offset; int topk;
    /* Multi-token decode (dense only): tokens of one sequence that attn_latent may take together
       (FOLD in cl/attn_latent.cl). token_first [T] names the first token of each token's group
       (consecutive tokens of one sequence); NULL: groups of query_len tokens from token 0 (0 or 1:
       every token alone). max_run: the most tokens of one group. */
    cl_mem token_first;
    int query_len, max_run;
    /* The cache rows read: cache->layers[layer] when NULL (a caller's rows, clmla_paged_attention),
       starting kv_offset elements of the cache dtype into it (a multiple of 16 bytes). */
    cl_mem kv;
    size_t kv_offset;
    /* An additive mask (dense only; attn_latent_rows, or attn_latent unfolded): token t's key j adds mask[mask_offset +
       t * mask_stride + j] (half) to its score; -inf makes it no key. NULL: none. */
    cl_mem mask; size_t mask_offset; int mask_stride;
} latent_launch;

/* (The variants, CLMLA_LATENT_*: internal.h.) */
/* Test hook: force a variant on this context (CLMLA_LATENT_AUTO: by device type). */
void clmla_attention_set_variant(clmla_context *ctx, int variant);
/* The variant the context runs, GROUP or ROWS: the forced one, else ROWS on CPU devices and GROUP
   on every other device. The one place this choice is made, for both attention paths. */
int clmla_attention_variant(const clmla_context *ctx);

/* Where attn_latent_mma (the latent tuning's group_mma) runs: 2 on the tensor cores (NVIDIA GPUs of
   compute capability 8.0 and later), 1 with its products computed by the work-items (CPU devices),
   0 not at all (attn_latent runs). */
int clmla_latent_mma_device(const clmla_context *ctx);

/* Vectors of 16 heads a work-item of the row-walking variant holds for a call of `num_heads` heads
   under tuning `tn`: 0 where it runs attn_latent_rows (rows_lanes 0, or fewer than 16 heads, where
   the row kernel computes less), 1 or 2 where attn_latent_lanes runs (2: rows_lanes 2 and 32 heads
   or more). Read by the kernel choice and by the AUTO path rule of CPU layers. */
/* The latent kernel the cache has built for a form, or NULL (for tests; builds nothing): rows 0
   attn_latent (or attn_latent_mma) for hg rows of a group (fold > 1: hg / fold heads of fold
   tokens), rows 1 attn_latent_rows for hg heads an item, or attn_latent_lanes with `lanes`
   vectors (fold 2: of two tokens). */
cl_kernel clmla_latent_kernel_built(const clmla_cache *cache, int rows, int hg, int sparse, int mask, int lanes, int fold);

int clmla_latent_lanes_vectors(const clmla_latent_tuning *tn, int num_heads);

/* Split-KV latent attention (attn_latent.cl, and attn_combine.cl when the keys are split). */
clmla_status clmla_latent_attention_enqueue(clmla_cache *cache, int layer, const latent_launch *p, cl_event *event);
#endif
