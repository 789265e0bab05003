/* Definitions every kernel file shares. The library compiles this file in front of each kernel
 * file (host/runtime/program.c), so they are defined before the file's own code. All handling of
 * stored element types (dtypes) lives here.
 *
 * Decoders, exact (every code maps to the float it denotes):
 *   dt_bf16(b)       bfloat16 bits (ushort) as float: the 16 bits are the float's upper half
 *   dt_bf16x4/x8(b)  the same for ushort4 / ushort8
 *   dt_e4m3(b)       float8 e4m3 "fn" bits (uchar) as float: bias 7, no infinities,
 *                    S.1111.111 is NaN, subnormals m * 2^-9
 * Encoder:
 *   dt_to_bf16(v)    float to bfloat16 bits, rounded to nearest even; NaN stays a (quiet) NaN
 * (half goes through OpenCL's own vload_half / vstore_half_rte, which every 1.2 device has.)
 *
 * The latent cache's element type, chosen by the build option CACHE_F16 or CACHE_BF16 (else float):
 *   CACHE_T               the element type in memory: float, half (storage only) or ushort (bf16)
 *   CACHE_CONVERTS        defined when CACHE_T is not float (kernels may then convert a tile once)
 *   CACHE_LOAD(p, i)      element i of p, as float
 *   CACHE_LOAD4(p, i)     elements 4i .. 4i+3 of p, as float4 (no alignment beyond the element's)
 *   CACHE_LOAD8(p, i)     elements 8i .. 8i+7 of p, as float8 (likewise)
 *   CACHE_STORE(v, i, p)  float v stored as element i of p, rounded to nearest even
 */
inline float dt_bf16(const ushort b)
{
    return as_float((uint)b << 16);
}

inline float4 dt_bf16x4(const ushort4 b)
{
    return as_float4(convert_uint4(b) << 16);
}

inline float8 dt_bf16x8(const ushort8 b)
{
    return as_float8(convert_uint8(b) << 16);
}

inline ushort dt_to_bf16(const float v)
{
    const uint u = as_uint(v);
    if (isnan(v))
        return (ushort)((u >> 16) | 0x0040u);
    return (ushort)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float dt_e4m3(const uchar b)
{
    const uint e = (b >> 3) & 15u, m = b & 7u;
    float v;
    if (e == 15u && m == 7u)
        v = as_float(0x7FC00000u);
    else if (e == 0u)
        v = (float)m * 0x1.0p-9f;
    else
        v = as_float(((e + 120u) << 23) | (m << 20));
    return (b & 0x80u) ? -v : v;
}

#if defined(CACHE_F16)
#define CACHE_T half
#define CACHE_CONVERTS
#define CACHE_LOAD(p, i) vload_half((i), (p))
#define CACHE_LOAD4(p, i) vload_half4((i), (p))
#define CACHE_LOAD8(p, i) vload_half8((i), (p))
#define CACHE_STORE(v, i, p) vstore_half_rte((v), (i), (p))
#elif defined(CACHE_BF16)
#define CACHE_T ushort
#define CACHE_CONVERTS
#define CACHE_LOAD(p, i) dt_bf16((p)[i])
#define CACHE_LOAD4(p, i) dt_bf16x4(vload4((i), (p)))
#define CACHE_LOAD8(p, i) dt_bf16x8(vload8((i), (p)))
#define CACHE_STORE(v, i, p) ((p)[i] = dt_to_bf16(v))
#else
#define CACHE_T float
#define CACHE_LOAD(p, i) ((p)[i])
#define CACHE_LOAD4(p, i) vload4((i), (p))
#define CACHE_LOAD8(p, i) vload8((i), (p))
#define CACHE_STORE(v, i, p) ((p)[i] = (v))
#endif
