#include "gemm.h"
#include "clcall.h"

#include <clblast_c.h>

static CLBlastTranspose op(const clmla_matrix *x)
{
    return x->transposed ? CLBlastTransposeYes : CLBlastTransposeNo;
}

clmla_status clmla_gemm(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a, clmla_matrix b,
                        float beta, clmla_matrix c, cl_event *event)
{
    if (clmla_fault_hit(ctx))
        return clmla_fail(ctx, CL_OUT_OF_RESOURCES, "CLBlastSgemm(m=%zu n=%zu k=%zu): injected fault", m, n, k);
    CLBlastStatusCode st = CLBlastSgemm(CLBlastLayoutRowMajor, op(&a), op(&b), m, n, k, alpha, a.buffer, a.offset, a.ld,
                                        b.buffer, b.offset, b.ld, beta, c.buffer, c.offset, c.ld, &ctx->queue, event);
    if (st != CLBlastSuccess)
        return clmla_fail(ctx, st, "CLBlastSgemm(m=%zu n=%zu k=%zu) failed: %s", m, n, k, clmla_status_string(st));
    return CLMLA_SUCCESS;
}

clmla_status clmla_gemm_strided_batched(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                                        size_t a_stride, clmla_matrix b, size_t b_stride, float beta, clmla_matrix c,
                                        size_t c_stride, size_t batch, cl_event *event)
{
    if (clmla_fault_hit(ctx))
        return clmla_fail(ctx, CL_OUT_OF_RESOURCES, "CLBlastSgemmStridedBatched: injected fault");
    CLBlastStatusCode st = CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, op(&a), op(&b), m, n, k, alpha, a.buffer,
                                                      a.offset, a.ld, a_stride, b.buffer, b.offset, b.ld, b_stride, beta,
                                                      c.buffer, c.offset, c.ld, c_stride, batch, &ctx->queue, event);
    if (st != CLBlastSuccess)
        return clmla_fail(ctx, st, "CLBlastSgemmStridedBatched(m=%zu n=%zu k=%zu batch=%zu) failed: %s", m, n, k, batch,
                          clmla_status_string(st));
    return CLMLA_SUCCESS;
}
