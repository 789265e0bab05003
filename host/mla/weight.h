/* A projection's weight on the device, in its dtype: the one place weights are converted, packed
   and uploaded (the layer's projections and clmla_linear). */
#ifndef CLMLA_WEIGHT_H
#define CLMLA_WEIGHT_H
#include "gemm.h"

typedef struct clmla_weight {
    cl_mem data;       /* codes of dtype: [n, k] row-major, or packed in panels (panel > 0) */
    cl_mem scale;      /* FP8: [blocks(n), blocks(k)] float32 block scales; else NULL */
    clmla_dtype dtype;
    size_t n, k;
    size_t panel;      /* rows per panel of the packed layout (gemm.h), 0 for row-major */
    size_t data_bytes, scale_bytes;
} clmla_weight;

/* Uploads W [n, k], optionally stacked: parts[0..count) are 2-D tensors with the same k whose rows
   follow one another (the layer stacks q_proj or q_a_proj with kv_a_proj_with_mqa). Every part
   is converted to the dtype `want` gives the first part; parts of different dtypes under
   CLMLA_WEIGHTS_AS_GIVEN are kept in float32 (a warning is logged). FP8 parts after the first
   start on a block boundary: the rows before them are padded with zero codes to a multiple of
   128, and *row_offsets (optional, [count]) says where each part starts. `packable`: panels where
   clmla_weight_panel says so (CPU devices), else row-major. `name` names the weight in messages.
   On failure nothing is left allocated. */
clmla_status clmla_weight_upload(clmla_context *ctx, const char *name, const clmla_tensor *parts, int count,
                                 clmla_weights_dtype want, int packable, clmla_weight *w, size_t *row_offsets);
void clmla_weight_release(clmla_weight *w);

/* The block [r0, r0 + rows) x [c0, c0 + cols) of a 2-D weight as a tensor of its own: a
   tensor-parallel shard's rows of q_b_proj or kv_b_proj, or its columns of o_proj
   (docs/MODELS.md, "Tensor-parallel shards"). `t` is a view into the weight where the block is whole
   rows of it, else a copy of the block's elements (`data`, `scale`: owned, freed by
   clmla_tensor_block_free); either way the host never holds more than the block. An FP8 weight keeps
   its codes and the matching block scales when the block's edges lie on multiples of 128 (or on the
   weight's own edges). Otherwise no block scale fits the block: its values are decoded to float32,
   and where the layer would hold it in fp8 (`want` AS_GIVEN or FP8) `want` becomes
   CLMLA_WEIGHTS_F32, with a warning logged, as for a scale past CLMLA_FP8_SCALE_LIMIT. Upload
   b->t under b->want. `name` names the weight in messages. On failure nothing is left allocated. */
typedef struct clmla_tensor_block {
    clmla_tensor t;
    void *data;
    float *scale;
    clmla_weights_dtype want;
} clmla_tensor_block;

clmla_status clmla_tensor_block_make(clmla_context *ctx, const char *name, const clmla_tensor *t, size_t r0, size_t rows,
                                     size_t c0, size_t cols, clmla_weights_dtype want, clmla_tensor_block *b);
void clmla_tensor_block_free(clmla_tensor_block *b);

/* A read-only device copy of `bytes` of host data for weight `name` (messages name it), refused
   above the device's largest allocation. */
clmla_status clmla_weight_copy(clmla_context *ctx, const char *name, const void *host, size_t bytes, cl_mem *out);

/* op(B) = W^T for clmla_gemm (y = x W^T), and W's rows [row0, row0 + rows) as an untransposed B
   (offset in elements) for x W slices (the absorbed path's W^UK). */
clmla_matrix clmla_weight_matrix(const clmla_weight *w);
clmla_matrix clmla_weight_slice(const clmla_weight *w, size_t row0, int transposed);

/* A tensor's values as float32 on the host (1-D weights: norms and biases): *values is t's data
   when it is float32 (*owned NULL), else a converted copy (*owned, for the caller to free). */
clmla_status clmla_tensor_values(clmla_context *ctx, const char *name, const clmla_tensor *t, const float **values,
                                 float **owned);
#endif
