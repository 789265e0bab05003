/* Decode-shaped matrix products: C = alpha * A * op(B) + beta * C with few rows (M <= 8), where
 * the cost is streaming B (the weights) once. Row-major, float32, batched by strides.
 *
 * gemm_skinny_nt (GPUs): op(B) = B^T, B is [N, K] (a linear layer's weight, y = x W^T)
 *   work-group (block of NC columns, batch) of WG items; the items split K so that consecutive
 *   items read consecutive float4s of each weight row (coalesced), UK float4s of each of the NC
 *   rows loaded before any is used; each item keeps MR x NC partial sums (MR = the rows bucketed
 *   to 1, 2, 4 or 8, rows past M neither read nor stored), then a tree over local memory adds
 *   the WG partials of every (row, column), log2(WG) steps of consecutive addresses. Built with
 *   W_ALIGNED (the product tuning's skinny_aligned, where the host finds A's and B's vectors
 *   aligned) it reads each vector of A and B as one load of the vector type.
 * gemm_skinny_nn: op(B) = B, B is [K, N] (the per-head W^UK absorption)
 *   one work-item per column n walks K; consecutive items read consecutive columns.
 * gemm_skinny_nn_split: the same product for N a multiple of 4, K split across the items of a
 *   work-group (the product tuning's skinny_nn_slices; experimental, off by default).
 *
 * CPU devices run the row-walking kernels of cl/gemm_rows.cl instead; host/mla/gemm.c chooses.
 *
 * Batch b uses A + b*a_stride, B + b*b_stride, C + b*c_stride (in elements). B's elements are of
 * the type W_DTYPE chooses (cl/prelude.cl), converted in registers; products accumulate in float.
 * An fp8 B has block scales Bs [blocks(rows), bs_ld] over the whole weight it is a part of: B's
 * first row is row (b_offset + b * b_stride) / ldb of that weight (the host hands over whole rows),
 * so every kernel finds an element's block from its row and column. */
#ifndef MMAX
#define MMAX 8
#endif
#ifndef MR
#define MR 1
#endif
#ifndef WG
#define WG 64
#endif
#ifndef NC
#define NC 4
#endif
#ifndef UK
#define UK 2
#endif
/* VW: gemm_skinny_nt's values per item and load, 4 (a float4's worth, the default), 8 or 16 (the
   product tuning's skinny_vector): with fp8 or bf16 weights, 4 values are 4 or 8 bytes per load,
   and 16 make each load as wide as f32's while the block scale is looked up once per 16 values. */
#ifndef VW
#define VW 4
#endif
#if VW == 16
#define VEC float16
#define W_LOADV W_LOAD16
#define VLOADV(i, p) V16_LOAD(float, i, p)
#define VDOT(a, b) (dot((a).s0123, (b).s0123) + dot((a).s4567, (b).s4567) + dot((a).s89ab, (b).s89ab) + \
                    dot((a).scdef, (b).scdef))
#elif VW == 8
#define VEC float8
#define W_LOADV W_LOAD8
#define VLOADV vload8
#define VDOT(a, b) (dot((a).lo, (b).lo) + dot((a).hi, (b).hi))
#else
#define VEC float4
#define W_LOADV W_LOAD4
#define VLOADV vload4
#define VDOT(a, b) dot((a), (b))
#endif

/* A's vectors in gemm_skinny_nt: with W_ALIGNED (cl/prelude.cl) the host has checked that A's are
   aligned too, and reads them as whole vectors */
#ifdef W_ALIGNED
#define A_LOADV(v, p) (((__global const VEC *)(p))[v])
#else
#define A_LOADV(v, p) VLOADV((v), (p))
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void gemm_skinny_nt(const int M, const int N, const int K, const float alpha,
                    __global const float *A, const int a_offset, const int lda, const int a_stride,
                    __global const W_T *B, const int b_offset, const int ldb, const int b_stride,
                    const float beta, __global float *C, const int c_offset, const int ldc, const int c_stride,
                    __global const float *Bs, const int bs_ld)
{
    __local float partial[MR * NC * WG]; /* [MR*NC][WG] */
    const int lid = get_local_id(0);
    const int n0 = get_group_id(0) * NC;
    const int batch = get_group_id(1);
    const int brow0 = (b_offset + batch * b_stride) / ldb; /* B's first row in the weight (W_SCALE) */
    A += a_offset + (size_t)batch * a_stride;
    B += b_offset + (size_t)batch * b_stride;
    C += c_offset + (size_t)batch * c_stride;

    float acc[MR][NC];
    #pragma unroll
    for (int m = 0; m < MR; m++)
        #pragma unroll
        for (int c = 0; c < NC; c++)
            acc[m][c] = 0.0f;
    __global const W_T *brow[NC];
    int bn[NC]; /* the rows read, for their block scales */
    #pragma unroll
    for (int c = 0; c < NC; c++) { /* a column past N reads row 0 (N >= 1) and is never stored */
        bn[c] = brow0 + (n0 + c < N ? n0 + c : 0);
        brow[c] = B + (size_t)(bn[c] - brow0) * ldb;
    }

    const int kv = K / VW; /* whole vectors of a row */
    for (int v0 = 0; v0 < kv; v0 += WG * UK) {
        VEC b[UK][NC];
        #pragma unroll
        for (int u = 0; u < UK; u++) {
            const int v = min(v0 + u * WG + lid, kv - 1); /* past the end: a repeat, skipped below */
            #pragma unroll
            for (int c = 0; c < NC; c++) /* a vector lies in one 128-value block of the scales */
                b[u][c] = W_LOADV(brow[c], v, W_SCALE(Bs, bs_ld, bn[c], VW * v));
        }
        #pragma unroll
        for (int u = 0; u < UK; u++) {
            const int v = v0 + u * WG + lid;
            if (v < kv) /* not a repeat (skipped, not weighed 0: 0 * inf would be NaN) */
                #pragma unroll
                for (int m = 0; m < MR; m++) {
                    if (MR == 1 || m < M) {
                        const VEC a = A_LOADV(v, A + (size_t)m * lda);
                        #pragma unroll
                        for (int c = 0; c < NC; c++)
                            acc[m][c] += VDOT(a, b[u][c]);
                    }
                }
        }
    }
    for (int k = VW * kv + lid; k < K; k += WG) /* K % VW */
        #pragma unroll
        for (int m = 0; m < MR; m++)
            if (MR == 1 || m < M)
                #pragma unroll
                for (int c = 0; c < NC; c++)
                    acc[m][c] = fma(A[(size_t)m * lda + k], W_LOAD(brow[c], k, W_SCALE(Bs, bs_ld, bn[c], k)), acc[m][c]);

    #pragma unroll
    for (int m = 0; m < MR; m++)
        #pragma unroll
        for (int c = 0; c < NC; c++)
            partial[(m * NC + c) * WG + lid] = acc[m][c];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            #pragma unroll
            for (int o = 0; o < MR * NC; o++)
                partial[o * WG + lid] += partial[o * WG + lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int o = lid; o < MR * NC; o += WG) {
        const int m = o / NC, c = o % NC;
        if (m < M && n0 + c < N) {
            const float s = partial[o * WG];
            __global float *dst = C + (size_t)m * ldc + n0 + c;
            *dst = beta != 0.0f ? alpha * s + beta * *dst : alpha * s;
        }
    }
}

__kernel void gemm_skinny_nn(const int M, const int N, const int K, const float alpha,
                             __global const float *A, const int a_offset, const int lda, const int a_stride,
                             __global const W_T *B, const int b_offset, const int ldb, const int b_stride,
                             const float beta, __global float *C, const int c_offset, const int ldc, const int c_stride,
                             __global const float *Bs, const int bs_ld)
{
    const int n = get_global_id(0);
    const int batch = get_global_id(1);
    if (n >= N)
        return;
    const int brow0 = (b_offset + batch * b_stride) / ldb; /* B's first row in the weight (W_SCALE) */
    (void)brow0; /* read only through W_SCALE, which unscaled dtypes drop */
    A += a_offset + (size_t)batch * a_stride;
    B += b_offset + (size_t)batch * b_stride;
    C += c_offset + (size_t)batch * c_stride;
    float acc[MMAX];
    for (int m = 0; m < MMAX; m++)
        acc[m] = 0.0f;
    for (int k = 0; k < K; k++) {
        const float b = W_LOAD(B, (size_t)k * ldb + n, W_SCALE(Bs, bs_ld, brow0 + k, n));
        for (int m = 0; m < MMAX; m++)
            if (m < M)
                acc[m] = fma(A[(size_t)m * lda + k], b, acc[m]);
    }
    for (int m = 0; m < MMAX; m++)
        if (m < M) {
            __global float *dst = C + (size_t)m * ldc + n;
            *dst = beta != 0.0f ? alpha * acc[m] + beta * *dst : alpha * acc[m];
        }
}

/* gemm_skinny_nn_split: C = alpha A B + beta C as gemm_skinny_nn, for N a multiple of 4, with K
 * split into KS slices. A work-group of WG items takes WG / KS float4s of columns and all of K:
 * item (c, s) sums rows s, s + KS, s + 2 KS, ... of its float4 of columns (consecutive items,
 * consecutive float4s of a row) for the MR rows of A it keeps (rows past M neither read nor
 * stored), so that a column's K rows are in flight from KS items at once rather than read in
 * turn by one; then a tree over local memory adds the KS partial float4s of each column, log2(KS)
 * steps. An fp8 float4 lies in one 128-column block of the scales (n is a multiple of 4). */
#ifndef KS
#define KS 8
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void gemm_skinny_nn_split(const int M, const int N, const int K, const float alpha,
                          __global const float *A, const int a_offset, const int lda, const int a_stride,
                          __global const W_T *B, const int b_offset, const int ldb, const int b_stride,
                          const float beta, __global float *C, const int c_offset, const int ldc, const int c_stride,
                          __global const float *Bs, const int bs_ld)
{
    __local float4 partial[MR * WG]; /* [MR][WG] */
    const int lid = get_local_id(0);
    const int c4 = WG / KS; /* float4s of columns per group */
    const int s = lid / c4;
    const int n = (get_group_id(0) * c4 + lid % c4) * 4; /* the item's first column */
    const int batch = get_group_id(1);
    const int brow0 = (b_offset + batch * b_stride) / ldb; /* B's first row in the weight (W_SCALE) */
    (void)brow0; /* read only through W_SCALE, which unscaled dtypes drop */
    A += a_offset + (size_t)batch * a_stride;
    B += b_offset + (size_t)batch * b_stride;
    C += c_offset + (size_t)batch * c_stride;
    float4 acc[MR];
    #pragma unroll
    for (int m = 0; m < MR; m++)
        acc[m] = (float4)(0.0f);
    if (n < N) {
        /* no unroll pragma: with a run-time trip count PoCL cannot honour one and says so in the
           build log of every program of this file; GPU compilers unroll such loops by themselves */
        for (int k = s; k < K; k += KS) {
            const float4 b = W_LOAD4(B + (size_t)k * ldb + n, 0, W_SCALE(Bs, bs_ld, brow0 + k, n));
            #pragma unroll
            for (int m = 0; m < MR; m++)
                if (MR == 1 || m < M)
                    acc[m] = fma((float4)(A[(size_t)m * lda + k]), b, acc[m]);
        }
    }
    #pragma unroll
    for (int m = 0; m < MR; m++)
        partial[m * WG + lid] = acc[m];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = KS / 2; h > 0; h >>= 1) {
        if (s < h)
            #pragma unroll
            for (int m = 0; m < MR; m++)
                partial[m * WG + lid] += partial[m * WG + lid + h * c4];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (s == 0 && n < N)
        #pragma unroll
        for (int m = 0; m < MR; m++)
            if (m < M) {
                __global float *dst = C + (size_t)m * ldc + n;
                const float4 v = partial[m * WG + lid];
                vstore4(beta != 0.0f ? alpha * v + beta * vload4(0, dst) : alpha * v, 0, dst);
            }
}
