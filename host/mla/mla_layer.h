/* The MLA layer's state, shared by its three files: layer.c (weights, kernels, creation, warm-up),
   layer_plan.c (which attention path AUTO takes, and the scratch each path may hold) and
   layer_step.c (the forward step). */
#ifndef CLMLA_MLA_LAYER_H
#define CLMLA_MLA_LAYER_H
#include "internal.h"
#include "scratch.h"
#include "weight.h"

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
    int auto_min_tokens;    /* AUTO: entries of fewer tokens stay absorbed (auto_threshold_of) */
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
static inline int selects(const clmla_layer *L)
{
    return L->HI > 0 || L->shared;
}

/* ---- the path planner (layer_plan.c) ---- */

/* AUTO's token threshold of a layer whose kernels are built (clmla_layer_auto_threshold), from the
   device's planner rates (kernel_tuning.h), and in *chunk_keys how many keys each of an entry's own
   tokens counts as in the decompressed path's cost, in *min_tokens the fewest tokens of an entry
   it sends decompressed; LAYER_AUTO_NEVER: the decompressed path never pays. */
#define LAYER_AUTO_NEVER 1000000
int clmla_layer_auto_threshold_of(const clmla_layer *L, double *chunk_keys, int *min_tokens);
/* Whether AUTO sends an entry of `tokens` new tokens after `prefix` cached ones decompressed, in a
   dense step or (sparse) a selecting one. */
int clmla_layer_auto_decompressed(const clmla_layer *L, int prefix, int tokens, int sparse);
/* The scratch bytes the attention paths may hold beyond the step's activations. */
uint64_t clmla_layer_scratch_budget(const clmla_layer *L);
/* Rows of a step whose absorbed attention runs at once (its queries in latent space and outputs
   within the budget). */
int clmla_layer_absorbed_piece_rows(const clmla_layer *L);
/* The decompressed path's scratch bytes a key: the gathered row, the up-projected one. */
void clmla_layer_decompressed_key_bytes(const clmla_layer *L, uint64_t *gather, uint64_t *up);
/* The most keys a decompressed entry can have within the device's largest buffer. */
long long clmla_layer_decompressed_max_keys(const clmla_layer *L);

#endif
