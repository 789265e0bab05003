/* Element-wise conversion between a stored dtype and float32 (the decoders of cl/prelude.cl), for
 * converting buffers on the device and for checking the decoders on every code.
 *   convert_to_f32:   out[i] = the float that code[i] denotes; the codes are SRC_BF16 (ushort),
 *                     SRC_F16 (half, loaded with vload_half) or SRC_E4M3 (uchar), one of them
 *                     defined at build time; SRC_E4M3X8 and SRC_E4M3U: the kernels' fast e4m3
 *                     decoders (8 codes and one), with the decoder's own build option;
 *                     SRC_E4M3BF16: the decoder to bf16 bits
 *   convert_to_bf16:  out[i] = bf16 bits of in[i], rounded to nearest even
 *   convert_to_e4m3:  out[i] = e4m3 bits of in[i], rounded to nearest even, saturating at 448
 *   gemm_weight_f32:  rows of a weight of the dtype W_DTYPE chooses decoded to float32 (below)
 * Dimension 0 runs over n values (items past n return). */
#if defined(SRC_BF16)
#define SRC_T ushort
#define SRC_LOAD(p, i) dt_bf16((p)[i])
#elif defined(SRC_F16)
#define SRC_T half
#define SRC_LOAD(p, i) vload_half((i), (p))
#elif defined(SRC_E4M3)
#define SRC_T uchar
#define SRC_LOAD(p, i) dt_e4m3((p)[i])
#elif defined(SRC_E4M3X8) /* the cache's vector decoder, 8 codes per item (n a multiple of 8): S.1111.111
                             is not NaN there (cl/prelude.cl) */
#define SRC_T uchar
#define SRC_VECTOR
#elif defined(SRC_E4M3U) /* the same decoder for one code (dt_e4m3u) */
#define SRC_T uchar
#define SRC_LOAD(p, i) (dt_e4m3u((p)[i]) * DT_E4M3_UNIT)
#elif defined(SRC_E4M3BF16) /* the decoder to bf16 bits (dt_e4m3_bf16) */
#define SRC_T uchar
#define SRC_LOAD(p, i) dt_bf16((ushort)dt_e4m3_bf16((p)[i]))
#endif

#if defined(SRC_VECTOR)
__kernel void convert_to_f32(__global const SRC_T *code, const int n, __global float *out)
{
    const int i = get_global_id(0);
    if (8 * i < n)
        vstore8(dt_e4m3x8s(vload8(i, code), 1.0f), i, out);
}
#elif defined(SRC_T)
__kernel void convert_to_f32(__global const SRC_T *code, const int n, __global float *out)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = SRC_LOAD(code, i);
}
#endif

__kernel void convert_to_e4m3(__global const float *in, const int n, __global uchar *out)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = dt_to_e4m3(in[i]);
}

__kernel void convert_to_bf16(__global const float *in, const int n, __global ushort *out)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = dt_to_bf16(in[i]);
}

/* gemm_weight_f32: `rows` rows of B (row-major from b_offset, K values each) decoded to float32,
 * out [rows, K], for CLBlast where a product of a weight dtype has no kernel of its own here
 * (host/mla/gemm.c, decoded_gemm): a piece of the weight at a time. */
__kernel void gemm_weight_f32(__global const W_T *B, const int b_offset, const int ldb, const int rows, const int K,
                              __global const float *Bs, const int bs_ld, __global float *out)
{
    const int k = get_global_id(0), r = get_global_id(1);
    if (k >= K || r >= rows)
        return;
    const int brow0 = b_offset / ldb;
    (void)brow0; /* read only through W_SCALE, which unscaled dtypes drop */
    out[(size_t)r * K + k] = W_LOAD(B + b_offset, (size_t)r * ldb + k, W_SCALE(Bs, bs_ld, brow0 + r, k));
}
