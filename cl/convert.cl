/* Element-wise conversion between a stored dtype and float32 (the decoders of cl/prelude.cl), for
 * converting buffers on the device and for checking the decoders on every code.
 *   convert_to_f32:   out[i] = the float that code[i] denotes; the codes are SRC_BF16 (ushort),
 *                     SRC_F16 (half, loaded with vload_half) or SRC_E4M3 (uchar), one of them
 *                     defined at build time
 *   convert_to_bf16:  out[i] = bf16 bits of in[i], rounded to nearest even
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
#endif

#ifdef SRC_T
__kernel void convert_to_f32(__global const SRC_T *code, const int n, __global float *out)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = SRC_LOAD(code, i);
}
#endif

__kernel void convert_to_bf16(__global const float *in, const int n, __global ushort *out)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = dt_to_bf16(in[i]);
}
