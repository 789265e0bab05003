/* Matrix products for CPU devices: C = alpha * A * op(B) + beta * C, row-major, float32, batched
 * by strides. One work-item per block of columns, in work-groups of one item with no barrier: each
 * item walks its rows of B (the weights) as a few sequential streams, its sums in registers or L1.
 * host/mla/gemm.c chooses among them on CPU devices (other devices run the work-group kernels of
 * cl/gemm_skinny.cl); each is described where it is defined below:
 *   gemm_skinny_nt_rows  y = x W^T, W [N, K] row-major, any number of rows (blocks of MR)
 *   gemm_tiled_rows      y = x W^T from 64 rows on (prefill, the decompressed up-projection), W
 *                        row-major or packed
 *   gemm_skinny_nn_rows  C = A B, B [K, N] row-major (the per-head W^UK absorption), any rows
 *   gemm_skinny_nn_wide  the same for 1 to 4 rows, B walked row by row (W^UK at decode)
 *   gemm_packed_rows     y = x W^T with W packed in panels by the host, several streams per item
 *
 * Batch b uses A + b*a_stride, B + b*b_stride, C + b*c_stride (in elements). B's elements are of
 * the type W_DTYPE chooses (cl/prelude.cl), converted in registers; products accumulate in float.
 * An fp8 B has block scales Bs [blocks(rows), bs_ld] over the whole weight it is a part of: B's
 * first row is row (b_offset + b * b_stride) / ldb of that weight (the host hands over whole rows),
 * so every kernel finds an element's block from its row and column. */
#ifndef MR
#define MR 1 /* rows of x per block (the host's 1, 2, 4 or 8) */
#endif

/* The kernels' shared ends: the sum of a float8 accumulator, and one result of a chunk of K
   into C, the first chunk (k0 == 0) with beta, the later ones added to it. */
float sum8(const float8 v)
{
    return (v.s0 + v.s1) + (v.s2 + v.s3) + (v.s4 + v.s5) + (v.s6 + v.s7);
}

void store_chunk(__global float *dst, const float s, const int k0, const float alpha, const float beta)
{
    *dst = k0 > 0 ? *dst + alpha * s : beta != 0.0f ? alpha * s + beta * *dst : alpha * s;
}

/* gemm_skinny_nt_rows: the y = x W^T product for CPU devices, any number of rows. One work-item
 * computes, for one block of MR rows, blocks of NCC columns (MR * NCC = 8 float8 accumulators, all
 * in registers), with no barrier, for columns_per_item columns (a multiple of NCC); the host picks
 * MR = the row count rounded up to 1, 2, 4 or 8. K is walked in chunks of k_chunk so that the
 * chunk of x stays in L1 (8 rows of K = 2048 are 64 KiB); with CLMLA_PREFETCH (PoCL) the next
 * column block's weights are prefetched a line at a time meanwhile, so that a chunk's first lines
 * of every weight row are not misses. The loops over MR and NCC are unrolled explicitly: PoCL
 * does not unroll them by itself, and then keeps the accumulators on the stack. Figures:
 * docs/perf-log.md, "Decode-shaped products on CPUs". */
#ifndef NCC
#define NCC 8
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemm_skinny_nt_rows(const int M, const int N, const int K, const float alpha,
                         __global const float *A, const int a_offset, const int lda, const int a_stride,
                         __global const W_T *B, const int b_offset, const int ldb, const int b_stride,
                         const float beta, __global float *C, const int c_offset, const int ldc, const int c_stride,
                         __global const float *Bs, const int bs_ld,
                         const int columns_per_item, const int row_blocks, const int k_chunk)
{
    /* dimension 1 enumerates (batch, block of MR rows) */
    const int batch = get_global_id(1) / row_blocks;
    const int m0 = get_global_id(1) % row_blocks * MR;
    const int brow0 = (b_offset + batch * b_stride) / ldb; /* B's first row in the weight (W_SCALE) */
    A += a_offset + (size_t)batch * a_stride + (size_t)m0 * lda;
    B += b_offset + (size_t)batch * b_stride;
    C += c_offset + (size_t)batch * c_stride + (size_t)m0 * ldc;
    const int rows_here = min(MR, M - m0);
    __global const float *xs[MR];
#pragma unroll
    for (int m = 0; m < MR; m++)
        xs[m] = A + (size_t)min(m, rows_here - 1) * lda;
    const int k_vec = K & ~7;
    const int first = get_global_id(0) * columns_per_item;
    const int last = min(first + columns_per_item, N);

    /* K in chunks of k_chunk (0: all of it), so that the chunk of the item's MR rows of x stays in
       L1 while the item walks its columns; partial sums go to C, the first chunk with beta. Several
       column blocks per item: a work-group costs PoCL about a microsecond to start. */
    const int chunk = k_chunk > 0 && k_chunk < k_vec ? k_chunk : (k_vec > 0 ? k_vec : 8);
    int k0 = 0;
    do {
        const int k1 = min(k0 + chunk, k_vec);
        for (int n0 = first; n0 < last; n0 += NCC) {
            __global const W_T *rows[NCC];
            int rn[NCC]; /* the rows read, for their block scales */
        #pragma unroll
            for (int c = 0; c < NCC; c++) {
                rn[c] = brow0 + min(n0 + c, N - 1); /* past N: a valid row, result dropped */
                rows[c] = B + (size_t)(rn[c] - brow0) * ldb;
            }
#ifdef CLMLA_PREFETCH
            __global const W_T *next[NCC]; /* the next block's rows, a line every 16 values */
        #pragma unroll
            for (int c = 0; c < NCC; c++)
                next[c] = B + (size_t)min(n0 + NCC + c, N - 1) * ldb;
#endif
            float8 acc[MR][NCC];
        #pragma unroll
            for (int m = 0; m < MR; m++)
#pragma unroll
                for (int c = 0; c < NCC; c++)
                    acc[m][c] = (float8)(0.0f);
            for (int kb = k0; kb < k1;) { /* to the end of a scale block (W_BLOCK): its scales once */
                const int kend = min((kb | (W_BLOCK - 1)) + 1, k1);
                float sc[NCC];
#pragma unroll
                for (int c = 0; c < NCC; c++)
                    sc[c] = W_SCALE(Bs, bs_ld, rn[c], kb);
                for (int k = kb; k < kend; k += 8) {
#ifdef CLMLA_PREFETCH
                    if (((k - k0) & 15) == 0) {
#pragma unroll
                        for (int c = 0; c < NCC; c++)
                            __builtin_prefetch(next[c] + k, 0, 3);
                    }
#endif
                    float8 x[MR];
#pragma unroll
                    for (int m = 0; m < MR; m++)
                        x[m] = vload8(0, xs[m] + k);
#pragma unroll
                    for (int c = 0; c < NCC; c++) {
                        const float8 w = W_LOAD8(rows[c] + k, 0, sc[c]);
#pragma unroll
                        for (int m = 0; m < MR; m++)
                            acc[m][c] = fma(x[m], w, acc[m][c]);
                    }
                }
                kb = kend;
            }
            /* Constant indices only, so that acc stays in registers; out-of-range results are dropped. */
        #pragma unroll
            for (int m = 0; m < MR; m++)
#pragma unroll
                for (int c = 0; c < NCC; c++) {
                    float s = sum8(acc[m][c]);
                    if (k1 == k_vec)
                        for (int k = k_vec; k < K; k++)
                            s = fma(xs[m][k], W_LOAD(rows[c], k, W_SCALE(Bs, bs_ld, rn[c], k)), s);
                    if (m < rows_here && n0 + c < last)
                        store_chunk(C + (size_t)m * ldc + n0 + c, s, k0, alpha, beta);
                }
        }
        k0 += chunk;
    } while (k0 < k_vec);
}

/* gemm_tiled_rows: C = alpha * A B^T + beta * C for CPU devices and 64 rows or more (prefill,
 * the decompressed path's up-projection; TILED_MIN_ROWS in host/mla/gemm.c), B [N, K] row-major (panel 0) or packed by the host in
 * panels of `panel` rows (clmla_pack_weight; then KC must be the packing's chunk, PCH). A
 * work-item owns a tile of TR rows x TC columns of C and walks K in chunks of KC: the chunk of its
 * TC rows of B (192 KiB at TC 48, KC 1024) stays in L2 while the item walks its TR rows of A four
 * at a time, those 4 rows' chunk (16 KiB) in L1, against MC = 3 rows of B at a time: 4 x 3 float8
 * accumulators along K, 12 independent FMA chains (4 x 2 leaves the FMA units waiting on their
 * latency). Partial sums of a chunk go to C, the first chunk with beta (store_chunk). With 8 rows
 * per item and no tiling, every 8 rows of A would re-read all of B from the last-level cache or
 * DRAM (docs/perf-log.md, "Larger products on CPUs"). */
#ifndef TR
#define TR 256
#endif
#ifndef TC
#define TC 48
#endif
#ifndef KC
#define KC 1024
#endif
#ifndef MC
#define MC 3 /* rows of B against 4 rows of A at a time (the host's tiled_weight_rows) */
#endif

/* Row r of B from k0 on: row-major, or in the packed layout [panel][chunk][row][value] */
__global const W_T *tiled_b_row(__global const W_T *B, const int r, const int k0, const int N, const int K,
                                  const int ldb, const int panel)
{
    if (panel == 0)
        return B + (size_t)r * ldb + k0;
    const int p = r / panel, i = r - p * panel, rows_p = min(panel, N - p * panel);
    return B + (size_t)p * panel * K + (size_t)k0 * rows_p + (size_t)i * min(KC, K - k0);
}

/* TILED_DECODE (a weight dtype other than f32; the host's tiled_decode): the item first decodes
   its TC rows of B's chunk, scales applied, into local memory (TC x KC floats, 192 KiB at 48 x
   1024), and the product reads them from there as the f32 form reads B, so that each weight is
   decoded once per chunk instead of once per 4 rows of A (TR / 4 times). */
#ifdef TILED_DECODE
#define TW_T __local const float
#define TW_LOAD8(p, k, s) vload8(0, (p) + (k))
#define TW_LOAD(p, k, s) ((p)[k])
#define TW_SCALE(r, k) 1.0f
#else
#define TW_T __global const W_T
#define TW_LOAD8(p, k, s) W_LOAD8((p) + (k), 0, s)
#define TW_LOAD(p, k, s) W_LOAD(p, k, s)
#define TW_SCALE(r, k) W_SCALE(Bs, bs_ld, r, k)
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemm_tiled_rows(const int M, const int N, const int K, const float alpha,
                     __global const float *A, const int a_offset, const int lda, const int a_stride,
                     __global const W_T *B, const int b_offset, const int ldb, const int b_stride,
                     const float beta, __global float *C, const int c_offset, const int ldc, const int c_stride,
                     __global const float *Bs, const int bs_ld,
                     const int panel)
{
#ifdef TILED_DECODE
    __local float decoded[TC * KC];
#endif
    /* one product: the batch strides are there for the arguments the product kernels share, unused */
    const int c0 = get_global_id(0) * TC, r0 = get_global_id(1) * TR;
    const int c_end = min(c0 + TC, N), r_end = min(r0 + TR, M);
    const int brow0 = b_offset / ldb; /* B's first row in the weight (W_SCALE); 0 when packed */
    A += a_offset;
    B += b_offset;
    C += c_offset;
    int k0 = 0;
    do { /* once even for K = 0, so that C is still scaled by beta */
        const int len = min(KC, K - k0), len8 = len & ~7;
#ifdef TILED_DECODE
        for (int r = c0; r < c_end; r++) {
            __global const W_T *src = tiled_b_row(B, r, k0, N, K, ldb, panel);
            __local float *dst = decoded + (r - c0) * KC;
            for (int kb = 0; kb < len8; kb += W_BLOCK) {
                const float sc = W_SCALE(Bs, bs_ld, r + brow0, k0 + kb);
                const int kend = min(kb + W_BLOCK, len8);
                for (int k = kb; k < kend; k += 8)
                    vstore8(W_LOAD8(src + k, 0, sc), 0, dst + k);
            }
            for (int k = len8; k < len; k++)
                dst[k] = W_LOAD(src, k, W_SCALE(Bs, bs_ld, r + brow0, k0 + k));
        }
#endif
        for (int m0 = r0; m0 < r_end; m0 += 4) {
            __global const float *xs[4];
#pragma unroll
            for (int m = 0; m < 4; m++)
                xs[m] = A + (size_t)min(m0 + m, M - 1) * lda + k0; /* past M: a valid row, result dropped */
            for (int n0 = c0; n0 < c_end; n0 += MC) {
                TW_T *ws[MC];
                int wn[MC]; /* the rows read, for their block scales */
#pragma unroll
                for (int c = 0; c < MC; c++) {
#ifdef TILED_DECODE
                    wn[c] = min(n0 + c, c_end - 1); /* past the tile: a decoded row, result dropped */
                    ws[c] = decoded + (wn[c] - c0) * KC;
#else
                    wn[c] = min(n0 + c, N - 1);
                    ws[c] = tiled_b_row(B, wn[c], k0, N, K, ldb, panel);
#endif
                    wn[c] += brow0;
                }
                float8 acc[4][MC];
#pragma unroll
                for (int m = 0; m < 4; m++)
#pragma unroll
                    for (int c = 0; c < MC; c++)
                        acc[m][c] = (float8)(0.0f);
                for (int kb = 0; kb < len8; kb += W_BLOCK) { /* KC: a multiple of W_BLOCK */
                    float sc[MC];
#pragma unroll
                    for (int c = 0; c < MC; c++)
                        sc[c] = TW_SCALE(wn[c], k0 + kb);
                    const int kend = min(kb + W_BLOCK, len8);
                    for (int k = kb; k < kend; k += 8) {
                        float8 w[MC];
#pragma unroll
                        for (int c = 0; c < MC; c++)
                            w[c] = TW_LOAD8(ws[c], k, sc[c]);
#pragma unroll
                        for (int m = 0; m < 4; m++) {
                            const float8 x = vload8(0, xs[m] + k);
#pragma unroll
                            for (int c = 0; c < MC; c++)
                                acc[m][c] = fma(x, w[c], acc[m][c]);
                        }
                    }
                }
#pragma unroll
                for (int m = 0; m < 4; m++)
#pragma unroll
                    for (int c = 0; c < MC; c++) {
                        float s = sum8(acc[m][c]);
                        for (int k = len8; k < len; k++)
                            s = fma(xs[m][k], TW_LOAD(ws[c], k, TW_SCALE(wn[c], k0 + k)), s);
                        if (m0 + m < r_end && n0 + c < c_end)
                            store_chunk(C + (size_t)(m0 + m) * ldc + n0 + c, s, k0, alpha, beta);
                    }
            }
        }
        k0 += KC;
    } while (k0 < K);
}

/* gemm_skinny_nn_rows: C = alpha * A * B + beta * C for CPU devices, B [K, N] row-major with N a
 * multiple of 8. A work-item computes blocks of MR rows x (8 * NCC) columns as MR * NCC float8
 * accumulators (8 in all): per k it loads NCC float8 strips of B's row k and broadcasts A[m, k];
 * it takes strips_per_item such blocks along N, one after another. Dimension 1 enumerates (batch,
 * block of MR rows): one block for decode-shaped products (M <= MR), ceil(M / MR) for the
 * absorbed path's W^UK of a prefill chunk. */
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemm_skinny_nn_rows(const int M, const int N, const int K, const float alpha,
                         __global const float *A, const int a_offset, const int lda, const int a_stride,
                         __global const W_T *B, const int b_offset, const int ldb, const int b_stride,
                         const float beta, __global float *C, const int c_offset, const int ldc, const int c_stride,
                         __global const float *Bs, const int bs_ld, const int strips_per_item, const int row_blocks)
{
    const int batch = get_global_id(1) / row_blocks;
    const int m0 = get_global_id(1) % row_blocks * MR;
    const int brow0 = (b_offset + batch * b_stride) / ldb; /* B's first row in the weight (W_SCALE) */
    (void)brow0; /* read only through W_SCALE, which unscaled dtypes drop */
    A += a_offset + (size_t)batch * a_stride + (size_t)m0 * lda;
    B += b_offset + (size_t)batch * b_stride;
    C += c_offset + (size_t)batch * c_stride + (size_t)m0 * ldc;
    const int rows_here = min(MR, M - m0);
    __global const float *xs[MR];
#pragma unroll
    for (int m = 0; m < MR; m++)
        xs[m] = A + (size_t)min(m, rows_here - 1) * lda;
    const int first = get_global_id(0) * strips_per_item * 8 * NCC;
    const int last = min(first + strips_per_item * 8 * NCC, N);
    for (int n0 = first; n0 < last; n0 += 8 * NCC) {
        int cols[NCC];
#pragma unroll
        for (int c = 0; c < NCC; c++)
            cols[c] = min(n0 + 8 * c, N - 8); /* past N: a valid strip, result dropped */
        float8 acc[MR][NCC];
#pragma unroll
        for (int m = 0; m < MR; m++)
#pragma unroll
            for (int c = 0; c < NCC; c++)
                acc[m][c] = (float8)(0.0f);
        for (int k = 0; k < K; k++) {
            __global const W_T *brow = B + (size_t)k * ldb;
#pragma unroll
            for (int c = 0; c < NCC; c++) {
                const float8 b = W_LOAD8(brow + cols[c], 0, W_SCALE(Bs, bs_ld, brow0 + k, cols[c])); /* 8 | cols[c]: one block */
#pragma unroll
                for (int m = 0; m < MR; m++)
                    acc[m][c] = fma((float8)(xs[m][k]), b, acc[m][c]);
            }
        }
#pragma unroll
        for (int m = 0; m < MR; m++)
#pragma unroll
            for (int c = 0; c < NCC; c++)
                if (m < rows_here && n0 + 8 * c < N) {
                    __global float *dst = C + (size_t)m * ldc + n0 + 8 * c;
                    const float8 r = alpha * acc[m][c];
                    vstore8(beta != 0.0f ? r + beta * vload8(0, dst) : r, 0, dst);
                }
    }
}

/* gemm_skinny_nn_wide: C = alpha * A * B + beta * C for CPU devices and 1 to 4 rows of x (MR),
 * B [K, N] row-major with N a multiple of 8: the absorbed path's W^UK at decode, one product per
 * head. A work-item takes a run of NW float8 strips (8 NW = 512 columns, a whole row of W^UK at
 * kv_lora_rank 512) and walks B row by row, adding A[m, k] times row k's run into MR x NW float8
 * sums kept in private memory (L1, 8 KiB per row of x), so that the weights are read as
 * sequential streams: NWS of them, rows k, k + K/NWS, ... taken together (the rows past NWS
 * (K/NWS) one at a time), so that several streams overlap what decoding a weight of fp8 keeps
 * a lone stream from overlapping. gemm_skinny_nn_rows keeps its sums in registers but then reads
 * 64 columns of every row before the next 64, a stride the prefetchers follow badly
 * (docs/perf-log.md, "The absorbed path's per-head products", has the runs behind both).
 * fp8 weights: A[m, k] is taken times the scale of its block once per 128 columns, so each weight
 * costs its decode and an FMA; the scale carries DT_E4M3_UNIT (2^120 with the shift decoder,
 * cl/prelude.cl), so x is taken times DT_E4M3_SUM_X^-1 as well (2^-64 there), which keeps it finite
 * and the products clear of denormals, and the sums times DT_E4M3_SUM_X at the end. Dimension 1 enumerates (batch, block of MR rows). */
#ifndef NW
#define NW 64
#endif
#ifndef NWS
#define NWS 8 /* rows of B walked together, each a stream of its own */
#endif
#if defined(W_SCALED)
#if (8 * NW) % W_BLOCK != 0
#error "gemm_skinny_nn_wide: a run of 8 NW columns must hold whole scale blocks"
#endif
#define NW_FACTOR DT_E4M3_SUM_X
#else
#define NW_FACTOR 1.0f
#endif
#define NW_BLOCK_STRIPS (W_BLOCK / 8)

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemm_skinny_nn_wide(const int M, const int N, const int K, const float alpha,
                         __global const float *A, const int a_offset, const int lda, const int a_stride,
                         __global const W_T *B, const int b_offset, const int ldb, const int b_stride,
                         const float beta, __global float *C, const int c_offset, const int ldc, const int c_stride,
                         __global const float *Bs, const int bs_ld, const int row_blocks)
{
    const int batch = get_global_id(1) / row_blocks;
    const int m0 = get_global_id(1) % row_blocks * MR;
    const int brow0 = (b_offset + batch * b_stride) / ldb; /* B's first row in the weight (W_SCALE) */
    (void)brow0; /* read only through W_SCALE, which unscaled dtypes drop */
    const int first = get_global_id(0) * NW * 8;
    if (first >= N)
        return;
    const int strips = min(NW, (N - first) / 8);
    A += a_offset + (size_t)batch * a_stride + (size_t)m0 * lda;
    B += b_offset + (size_t)batch * b_stride + first;
    C += c_offset + (size_t)batch * c_stride + (size_t)m0 * ldc + first;
    const int rows_here = min(MR, M - m0);
    __global const float *xs[MR];
#pragma unroll
    for (int m = 0; m < MR; m++)
        xs[m] = A + (size_t)min(m, rows_here - 1) * lda;
    float8 acc[MR][NW];
    for (int s = 0; s < strips; s++)
#pragma unroll
        for (int m = 0; m < MR; m++)
            acc[m][s] = (float8)(0.0f);
    /* rows k, k + kh, ..., k + (NWS - 1) kh together: NWS sequential streams of B, whose reads the
       core keeps in flight together, and one load and store of the sums per NWS rows */
    const int kh = K / NWS, rest = K - NWS * kh;
    for (int r = 0; r < kh + rest; r++) {
        /* pass r < kh: rows r + j kh of the NWS streams; after them, the rows past NWS kh, one a
           pass (stream 0; the others repeat its row and are skipped) */
        const int streams = r < kh ? NWS : 1, k = r < kh ? r : NWS * kh + (r - kh);
        int kj[NWS];
        __global const W_T *brow[NWS];
#pragma unroll
        for (int j = 0; j < NWS; j++) {
            kj[j] = j < streams ? k + j * kh : k;
            brow[j] = B + (size_t)kj[j] * ldb;
        }
        for (int s0 = 0; s0 < strips; s0 += NW_BLOCK_STRIPS) {
            float xv[NWS][MR];
#pragma unroll
            for (int j = 0; j < NWS; j++) {
                const float sc = W_SCALE(Bs, bs_ld, brow0 + kj[j], first + 8 * s0) / NW_FACTOR;
#pragma unroll
                for (int m = 0; m < MR; m++)
                    xv[j][m] = xs[m][kj[j]] * sc;
            }
            const int s1 = min(s0 + NW_BLOCK_STRIPS, strips);
            for (int s = s0; s < s1; s++) {
#pragma unroll
                for (int j = 0; j < NWS; j++)
                    if (j < streams) {
                        const float8 w = W_LOAD8(brow[j] + 8 * s, 0, 1.0f);
#pragma unroll
                        for (int m = 0; m < MR; m++)
                            acc[m][s] = fma((float8)(xv[j][m]), w, acc[m][s]);
                    }
            }
        }
    }
    for (int m = 0; m < rows_here; m++)
        for (int s = 0; s < strips; s++) {
            __global float *dst = C + (size_t)m * ldc + 8 * s;
            const float8 r = (alpha * NW_FACTOR) * acc[m][s];
            vstore8(beta != 0.0f ? r + beta * vload8(0, dst) : r, 0, dst);
        }
}

/* gemm_packed_rows: y = x W^T for CPU devices, with W packed by the host (host/mla/gemm.c,
 * clmla_pack_weight): W's N rows in panels of `panel` rows, a work-item's share, and each panel
 * stored chunk by chunk of PCH values of K, [chunk][row of the panel][value], so that an item's
 * weights are one contiguous region walked in storage order while the chunk of x stays close
 * (8 rows x 512 floats = 16 KiB, in L1, with f32 weights; PCH holds 2 KiB of a row whatever the
 * dtype, host/mla/gemm.h, so 64 KiB with fp8 weights).
 *
 * Within a chunk the item walks S rows of the panel at once, spread over it: row i of each of S
 * segments of ceil(rows / S) rows. Each of the S pointers then moves through its own segment
 * sequentially, so the hardware prefetchers see S streams, not one. Rows of x go MRP = min(MR, 4)
 * at a time against S streams, MRP x S float8 accumulators: 1 row against 8 streams, 2 against 4,
 * 4 against 3 (12 accumulators, 3 weight vectors: 15 of AVX2's 16 registers, and 12 independent
 * FMA chains to cover the FMA latency); 8 rows take two passes over the same S pieces of W, the
 * second from L1. The partial sums of a chunk go to C, the first chunk with beta. Dimension 1
 * enumerates (batch, block of MR rows of x). The alternatives measured against this layout are in
 * docs/perf-log.md, "Decode-shaped products on CPUs". */
#ifndef PCH
#define PCH 512
#endif
#define MRP (MR < 4 ? MR : 4)
#if defined(W_BLOCK_SUMS) && defined(W_SCALED) && MRP <= 2 /* fp8 weights, 1 or 2 rows (below) */
#define BLOCK_SUMS
#endif
#ifndef STREAMS /* the host's packed_streams_1/2/4 where the tuning changes them */
#define STREAMS (MRP == 4 ? 3 : 8 / MRP)
#endif
#define PASSES (MR / MRP)

/* PACKED_WIDE (the product tuning's cpu_wide): one row of x against bf16 or fp8 weights (fp8 with
 * the half decoder, the CPUs' own) takes packed_wide_row where K is a multiple of 128 and the
 * weights start on 4-byte boundaries: the same walk of the panel (STREAMS 8), but a 64-byte line of
 * each stream a step, decoded by 32-bit lanes into float16 in the order cl/prelude.cl's
 * dt_bf16x32p and dt_e4m3x64p leave it (even elements, then odd ones), against a copy of x's chunk
 * in that order. Per line of fp8 codes that is 7 integer operations, 4 conversions of 16 halves and
 * 4 FMAs where the float8 loop above takes 8 loads with sign extension, 16 integer operations, 8
 * conversions of 8 halves and 8 FMAs, all on 256-bit registers (objdump of the kernels PoCL
 * builds; docs/perf-log.md, "64-byte lines for one row of bf16 and fp8"). fp8 sums each 128-value
 * block apart and scales it once, as BLOCK_SUMS does. */
#if defined(PACKED_WIDE) && MR == 1 && STREAMS == 8 && defined(__ENDIAN_LITTLE__) &&                                 \
    (W_DTYPE == 2 || (W_DTYPE == 3 && defined(CLMLA_FP8_HALF)))
#define WIDE_ROW
#define WIDE_LINE (W_DTYPE == 3 ? 64 : 32) /* values in a 64-byte line */
#ifndef WIDE_AHEAD
#define WIDE_AHEAD 1024 /* bytes of a stream prefetched ahead, with CLMLA_PREFETCH */
#endif
/* *p's 16 values summed, lane by lane (oclgrind marks the halves of a float16 taken as float8s
   uninitialised), through a pointer (no call with a 512-bit vector: cl/prelude.cl, dt_bf16x16) */
float sum16(const float16 *p)
{
    const float16 v = *p;
    return sum8((float8)(v.s0 + v.s8, v.s1 + v.s9, v.s2 + v.sa, v.s3 + v.sb, v.s4 + v.sc, v.s5 + v.sd, v.s6 + v.se,
                         v.s7 + v.sf));
}

void packed_wide_row(const int K, __global const float *x, __global const W_T *chunk, const int rows_p, const int seg,
                     const int row0, __global const float *Bs, const int bs_ld, __global float *C, const float alpha,
                     const float beta)
{
    float xp[PCH]; /* x's chunk, per line its even elements, then its odd ones */
    for (int k0 = 0; k0 < K; k0 += PCH) {
        const int len = min(PCH, K - k0);
        for (int g = 0; g < len; g += WIDE_LINE)
            for (int t = 0; t < WIDE_LINE / 2; t++) {
                xp[g + t] = x[k0 + g + 2 * t];
                xp[g + WIDE_LINE / 2 + t] = x[k0 + g + 2 * t + 1];
            }
        for (int i = 0; i < seg; i++) {
            __global const W_T *w[8];
            int wr[8]; /* the weight rows read, for their block scales */
#pragma unroll
            for (int s = 0; s < 8; s++) {
                wr[s] = min(s * seg + i, rows_p - 1); /* past the panel: a valid row, dropped */
                w[s] = chunk + (size_t)wr[s] * len;
            }
            float16 acc[8];
#pragma unroll
            for (int s = 0; s < 8; s++)
                acc[s] = (float16)(0.0f);
            for (int kb = 0; kb < len; kb += 128) {
#if W_DTYPE == 3
                float16 blk[8];
#pragma unroll
                for (int s = 0; s < 8; s++)
                    blk[s] = (float16)(0.0f);
#define WIDE_SUMS blk
#else
#define WIDE_SUMS acc
#endif
                for (int kw = kb; kw < kb + 128; kw += WIDE_LINE) {
                    float16 xv[WIDE_LINE / 16];
#pragma unroll
                    for (int j = 0; j < WIDE_LINE / 16; j++)
                        xv[j] = V16_LOAD(float, j, xp + kw);
#pragma unroll
                    for (int s = 0; s < 8; s++) {
#ifdef CLMLA_PREFETCH
                        __builtin_prefetch(w[s] + kw + WIDE_AHEAD / sizeof(W_T), 0, 3);
#endif
                        const uint16 d = V16_LOAD(uint, 0, (__global const uint *)(w[s] + kw));
                        float16 q[WIDE_LINE / 16];
#if W_DTYPE == 3
                        dt_e4m3x64p(&d, q);
#else
                        dt_bf16x32p(&d, q);
#endif
#pragma unroll
                        for (int j = 0; j < WIDE_LINE / 16; j++)
                            WIDE_SUMS[s] = V16_FMA(xv[j], q[j], WIDE_SUMS[s]);
                    }
                }
#undef WIDE_SUMS
#if W_DTYPE == 3
#pragma unroll
                for (int s = 0; s < 8; s++)
                    acc[s] = V16_FMA(blk[s], (float16)(W_SCALE(Bs, bs_ld, row0 + wr[s], k0 + kb)), acc[s]);
#endif
            }
#pragma unroll
            for (int s = 0; s < 8; s++)
                if (s * seg + i < rows_p)
                    store_chunk(C + s * seg + i, sum16(&acc[s]), k0, alpha, beta);
        }
        chunk += (size_t)len * rows_p;
    }
}
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemm_packed_rows(const int M, const int N, const int K, const float alpha,
                      __global const float *A, const int a_offset, const int lda, const int a_stride,
                      __global const W_T *B, const int b_offset, const int ldb, const int b_stride,
                      const float beta, __global float *C, const int c_offset, const int ldc, const int c_stride,
                      __global const float *Bs, const int bs_ld,
                      const int panel, const int row_blocks)
{
    const int batch = get_global_id(1) / row_blocks;
    const int m0 = get_global_id(1) % row_blocks * MR;
    A += a_offset + (size_t)batch * a_stride + (size_t)m0 * lda;
    C += c_offset + (size_t)batch * c_stride + (size_t)m0 * ldc;
    const int rows_here = min(MR, M - m0);
    __global const float *xs[MR];
#pragma unroll
    for (int m = 0; m < MR; m++)
        xs[m] = A + (size_t)min(m, rows_here - 1) * lda;
    const int p0 = get_global_id(0) * panel;
    if (p0 >= N)
        return;
    /* B's first row in the weight (W_SCALE): 0 for a weight packed whole; a row-major W (rows of K
       values, one chunk each) may be part of a larger one, such as one head's rows of kv_b_proj */
    const int brow0 = (b_offset + batch * b_stride) / K;
    (void)brow0; /* read only through W_SCALE, which unscaled dtypes drop */
    const int rows_p = min(panel, N - p0);
    const int seg = (rows_p + STREAMS - 1) / STREAMS;
    /* every panel but the last holds panel * K values, so panel p starts at p0 * K */
    __global const W_T *chunk = B + b_offset + (size_t)batch * b_stride + (size_t)p0 * K;
#ifdef WIDE_ROW
    if (K % 128 == 0 && (size_t)(b_offset + batch * b_stride) * sizeof(W_T) % 4 == 0) {
        packed_wide_row(K, xs[0], chunk, rows_p, seg, p0 + brow0, Bs, bs_ld, C + p0, alpha, beta);
        return;
    }
#endif
    for (int k0 = 0; k0 < K; k0 += PCH) {
        const int len = min(PCH, K - k0), len8 = len & ~7;
        for (int i = 0; i < seg; i++) {
            __global const W_T *w[STREAMS];
            int wr[STREAMS]; /* the weight rows read, for their block scales */
#pragma unroll
            for (int s = 0; s < STREAMS; s++) {
                wr[s] = min(s * seg + i, rows_p - 1); /* past the panel: a valid row, dropped */
                w[s] = chunk + (size_t)wr[s] * len;
                wr[s] += p0 + brow0;
            }
#if defined(CLMLA_PREFETCH) && MRP == 4
            /* each stream's next piece: the next row of its segment, or after the segment's last
               row the segment's first row in the next chunk (a jump the hardware cannot guess) */
            __global const W_T *next[STREAMS];
            const int len_next = clamp(K - k0 - PCH, 0, PCH);
#pragma unroll
            for (int s = 0; s < STREAMS; s++)
                next[s] = i + 1 < seg ? w[s] + len : chunk + (size_t)len * rows_p + (size_t)(s * seg) * len_next;
#endif
#pragma unroll
            for (int pass = 0; pass < PASSES; pass++) {
                float8 acc[MRP][STREAMS];
#pragma unroll
                for (int m = 0; m < MRP; m++)
#pragma unroll
                    for (int s = 0; s < STREAMS; s++)
                        acc[m][s] = (float8)(0.0f);
                /* PCH is a multiple of W_BLOCK or larger than K: a block's scales once */
                for (int kb = 0; kb < len8; kb += W_BLOCK) {
                    float sc[STREAMS];
#pragma unroll
                    for (int s = 0; s < STREAMS; s++)
                        sc[s] = W_SCALE(Bs, bs_ld, wr[s], k0 + kb);
                    const int kend = min(kb + W_BLOCK, len8);
#ifdef BLOCK_SUMS
                    /* the block's products summed unscaled, the scale applied once: the activations
                       are taken times DT_E4M3_SUM_X (exact; 2^64 where codes decode to value *
                       2^-120, cl/prelude.cl) to keep the products clear of float denormals, and the
                       sum is scaled by the block's scale (which carries DT_E4M3_UNIT) over it */
                    float8 blk[MRP][STREAMS];
#pragma unroll
                    for (int m = 0; m < MRP; m++)
#pragma unroll
                        for (int s = 0; s < STREAMS; s++)
                            blk[m][s] = (float8)(0.0f);
#define SUMS blk         /* where the loop below adds its products */
#define W_FACTOR(s) 1.0f /* on each weight */
#define X_FACTOR DT_E4M3_SUM_X /* on each activation */
#else
#define SUMS acc
#define W_FACTOR(s) sc[s]
#define X_FACTOR 1.0f
#endif
                    int k = kb;
#if defined(BLOCK_SUMS) && defined(CLMLA_FP8_HALF) && MRP == 1
                    /* One row: 16 codes a stream a step, sign-extended in one 256-bit operation
                       where two loads of 8 take one each (dt_e4m3x16h), against x's 16 values
                       (docs/perf-log.md). Only with the block sums: a block scale on each weight
                       here makes the compiler keep the decoded halves on the stack. */
                    for (; k + 16 <= kend; k += 16) {
                        const float16 xv = V16_LOAD(float, 0, xs[pass] + k0 + k) * X_FACTOR;
#pragma unroll
                        for (int s = 0; s < STREAMS; s++) {
                            float16 q;
                            dt_e4m3x16h(vload16(0, w[s] + k), &q);
                            SUMS[0][s] = fma(xv.lo, q.lo, SUMS[0][s]);
                            SUMS[0][s] = fma(xv.hi, q.hi, SUMS[0][s]);
                        }
                    }
#endif
                    for (; k < kend; k += 8) {
#if defined(CLMLA_PREFETCH) && MRP == 4
                        /* With 4 rows of x per pass the streams advance slowly, and for 8 rows the
                           second pass reads W from L1, leaving the memory idle: in the last pass, a
                           line of each stream's next piece every 16 values (past the panel's end: a
                           prefetch, which does not fault), following the jump to the next chunk.
                           With fewer rows the streams keep the memory busy and the prefetches only
                           cost. */
                        if (pass == PASSES - 1 && (k & 15) == 0) {
#pragma unroll
                            for (int s = 0; s < STREAMS; s++)
                                __builtin_prefetch(next[s] + k, 0, 3);
                        }
#endif
                        float8 wv[STREAMS];
#pragma unroll
                        for (int s = 0; s < STREAMS; s++)
                            wv[s] = W_LOAD8(w[s] + k, 0, W_FACTOR(s));
#pragma unroll
                        for (int m = 0; m < MRP; m++) {
                            const float8 xv = vload8(0, xs[pass * MRP + m] + k0 + k) * X_FACTOR;
#pragma unroll
                            for (int s = 0; s < STREAMS; s++)
                                SUMS[m][s] = fma(xv, wv[s], SUMS[m][s]);
                        }
                    }
#ifdef BLOCK_SUMS
#pragma unroll
                    for (int m = 0; m < MRP; m++)
#pragma unroll
                        for (int s = 0; s < STREAMS; s++)
                            acc[m][s] = fma(blk[m][s], (float8)(sc[s] / DT_E4M3_SUM_X), acc[m][s]);
#endif
#undef SUMS
#undef W_FACTOR
#undef X_FACTOR
                }
                /* Constant indices only, so that acc stays in registers; rows past M or past the
                   panel are dropped. */
#pragma unroll
                for (int m = 0; m < MRP; m++)
#pragma unroll
                    for (int s = 0; s < STREAMS; s++) {
                        const int row = pass * MRP + m, col = s * seg + i;
                        float sum = sum8(acc[m][s]);
                        for (int kk = len8; kk < len; kk++)
                            sum = fma(xs[row][k0 + kk], W_LOAD(w[s], kk, W_SCALE(Bs, bs_ld, wr[s], k0 + kk)), sum);
                        if (row < rows_here && col < rows_p)
                            store_chunk(C + (size_t)row * ldc + p0 + col, sum, k0, alpha, beta);
                    }
            }
        }
        chunk += (size_t)len * rows_p;
    }
}
