/* Matrix products on the device: the only place that calls CLBlast. Row-major, float32,
   offsets and leading dimensions in floats. C = alpha * op(A) * op(B) + beta * C. */
#ifndef CLMLA_GEMM_H
#define CLMLA_GEMM_H
#include "internal.h"

typedef struct clmla_matrix {
    cl_mem buffer;
    size_t offset;
    size_t ld;
    int transposed; /* use op(X) = X^T */
} clmla_matrix;

clmla_status clmla_gemm(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a, clmla_matrix b,
                        float beta, clmla_matrix c, cl_event *event);

/* batch products, the i-th using offsets + i * stride (strides in floats). */
clmla_status clmla_gemm_strided_batched(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                                        size_t a_stride, clmla_matrix b, size_t b_stride, float beta, clmla_matrix c,
                                        size_t c_stride, size_t batch, cl_event *event);
#endif
