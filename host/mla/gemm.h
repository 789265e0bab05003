/* Matrix products on the device: the only place that runs CLBlast's GEMMs (tuning.c sets their
   parameters). Row-major; A and C float32, B (the weights) float32 or a weight dtype; offsets and
   leading dimensions in elements. C = alpha * op(A) * op(B) + beta * C. */
#ifndef CLMLA_GEMM_H
#define CLMLA_GEMM_H
#include "internal.h"

typedef struct clmla_matrix {
    cl_mem buffer;
    size_t offset;
    size_t ld;
    int transposed; /* use op(X) = X^T */
    size_t panel;   /* B of y = x W^T only: W packed by clmla_pack_weight in panels of this many rows
                       (0: row-major, ld used) */
    /* B only (A and C are float32): the element type, and for FP8 the block scales of the whole
       weight B is part of ([blocks(rows), scale_ld] float32; B's offset and batch strides are
       whole rows of it, ld its row length) */
    clmla_dtype dtype;
    cl_mem scale;
    size_t scale_ld;
} clmla_matrix;

/* Weights of y = x W^T on CPU devices are kept packed for the kernel gemm_packed_rows, so that
   each work-item's share is one contiguous region, walked as a few sequential streams while its
   chunk of x stays in L1: panels of clmla_weight_panel() rows, each stored
   [chunk of clmla_pack_chunk() values of K][row of the panel][value].
   A chunk holds 2 KiB of each row whatever the dtype (512 values of f32, 1024 of f16 or bf16, 2048
   of fp8), so that a stream runs as long between its jumps with narrow weights as with f32 ones
   (docs/perf-log.md, "Packed chunks by bytes"). */
#define CLMLA_PACK_CHUNK_BYTES 2048

/* Values of K per chunk of a packed weight whose elements take `bytes` bytes. */
static inline size_t clmla_pack_chunk(size_t bytes)
{
    return CLMLA_PACK_CHUNK_BYTES / bytes;
}

/* Rows per panel for a weight [n, k] on this context's device (a work-item's share: the product
   tuning's cpu_items_per_cu per compute unit, 8 by default); 0 where weights stay row-major:
   non-CPU devices, and contexts whose products all go through CLBlast. */
size_t clmla_weight_panel(const clmla_context *ctx, size_t n, size_t k);

/* W [n, k] row-major into out (n * k elements of `bytes` bytes, not overlapping w), panels of
   `panel` rows. */
void clmla_pack_weight(const void *w, size_t n, size_t k, size_t bytes, size_t panel, void *out);

clmla_status clmla_gemm(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a, clmla_matrix b,
                        float beta, clmla_matrix c, cl_event *event);

/* batch products, the i-th using offsets + i * stride (strides in floats). */
clmla_status clmla_gemm_strided_batched(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                                        size_t a_stride, clmla_matrix b, size_t b_stride, float beta, clmla_matrix c,
                                        size_t c_stride, size_t batch, cl_event *event);
/* Releases the context's product kernels and forgets their parameters, so that the next product
   looks the parameters up again and builds its kernels with them (clmla_context_set_product_tuning). */
void clmla_gemm_retune(clmla_context *ctx);

/* Whether the context runs the CPU forms of the products (clmla_context_options.product_kernels:
   "rows", or "auto" on a CPU device) rather than the work-group forms; the one place this is decided. */
int clmla_products_rows(const clmla_context *ctx);

/* Test hook: every product through CLBlast (on = 1) or as dispatched (0). */
clmla_status clmla_gemm_force_clblast(clmla_context *ctx, int on);
/* Test hook: the bytes of float32 a batched product with a weight dtype decodes at a time through
   CLBlast (0: the default, 32 MiB), so that small shapes take several groups. */
clmla_status clmla_gemm_set_weight_piece(clmla_context *ctx, size_t bytes);
#endif
