/* Definitions every kernel file shares. The library compiles this file in front of each kernel
 * file (host/runtime/program.c), so they are defined before the file's own code. All handling of
 * stored element types (dtypes) lives here, and, at the end, the build options and rules every
 * latent attention kernel (attn_latent.cl, attn_latent_mma.cl) follows for which tokens and keys
 * it takes.
 *
 * Decoders, exact (every code maps to the float it denotes):
 *   dt_bf16(b)       bfloat16 bits (ushort) as float: the 16 bits are the float's upper half
 *   dt_bf16x4/x8(b)  the same for ushort4 / ushort8
 *   dt_e4m3(b)       float8 e4m3 "fn" bits (uchar) as float: bias 7, no infinities,
 *                    S.1111.111 is NaN, subnormals m * 2^-9
 *   dt_e4m3x8u(b)    uchar8 codes in units of DT_E4M3_UNIT^-1, without branches: the code
 *                    sign-extended and shifted puts its sign in the float's sign and its
 *                    exponent and mantissa in the float's low exponent bits, which makes it
 *                    2^-120 times the value (subnormal codes become float denormals); three
 *                    integer operations. A multiply by DT_E4M3_UNIT = 2^120 puts it right,
 *                    exactly. Codes S.1111.111 decode as 480, not NaN: a cache tile that holds
 *                    a NaN has a NaN scale instead (cl/cache_write.cl), so all of its values
 *                    read back as NaN. On a device without float denormals (CLMLA_NO_DENORMS,
 *                    set by the library from CL_DEVICE_SINGLE_FP_CONFIG) the exponent is
 *                    rebiased instead, subnormal codes are handled apart, and DT_E4M3_UNIT is 1.
 *                    On CPUs (CLMLA_FP8_HALF, host/runtime/program.h) the code is placed in a
 *                    half's bits instead: sign, then its 7 bits below a zero, which makes it
 *                    2^-8 times the value (e4m3's subnormals are half subnormals, which the
 *                    conversion to float, one instruction with F16C, makes normal floats), so no
 *                    code becomes a float denormal, which would cost a microcode assist per
 *                    vector on Intel cores; DT_E4M3_UNIT is 2^8. Through vload_half from private
 *                    memory: on PoCL as fast as clang's _Float16 converted (vcvtph2ps), which
 *                    oclgrind cannot run.
 *   DT_E4M3_SUM_X    a power of two that keeps a decoded code times an activation clear of float
 *                    denormals (2^64 where codes decode to value x 2^-120, else 1): the factor on
 *                    activations of the kernels that apply the scale after summing such products
 *   dt_e4m3u(b)      the same for one code
 *   dt_e4m3x8s(b, s) uchar8 codes times s, exact for any s (DT_E4M3_UNIT, then s)
 *   dt_e4m3x4u(b), dt_e4m3x4s(b, s) the same for uchar4
 *   dt_e4m3_bf16(c)  the code in c's low byte as the bfloat16 bits (in the low half) of the value it
 *                    denotes, which bf16 holds exactly: for the kernels whose products take bf16
 *                    operands. S.1111.111 gives 480, as the fast decoders above.
 * Encoders, rounding to nearest even:
 *   dt_to_bf16(v)    float to bfloat16 bits; NaN stays a (quiet) NaN
 *   dt_to_e4m3(v)    float to e4m3 bits; magnitudes past 448 saturate to 448, NaN gives S.1111.111
 * (half goes through OpenCL's own vload_half / vstore_half_rte, which every 1.2 device has.)
 *
 * The latent cache's element type, chosen by the build option CACHE_F16, CACHE_BF16 or CACHE_FP8
 * (else float). A cache row holds one token's [c^KV ; k^R], RKV + DR values:
 *   CACHE_T                the unit of a row in memory: float, half (storage only), ushort (bf16)
 *                          or uchar (fp8)
 *   CACHE_ROW_UNITS        CACHE_Ts per row: RKV + DR, or for fp8 its bytes (below)
 *   CACHE_CONVERTS         defined when the values are not float (kernels may convert a tile once)
 *   CACHE_LOAD(r, i)       value i of the row that starts at r, as float
 *   CACHE_LOAD_VALUE(r, i) the same for i < RKV (c^KV, not k^R): fp8 without the test of i
 *   CACHE_LOAD4(r, i)      values 4i .. 4i+3 of row r, as float4 (no alignment beyond the unit's)
 *   CACHE_LOAD8(r, i)      values 8i .. 8i+7 of row r, as float8 (likewise)
 *   CACHE_ALIGNED (build option): CACHE_LOAD4/8 read the values (for fp8 the codes, or the bf16
 *                          values of k^R) as one value of the vector type (vloada_halfN for f16),
 *                          which needs rows, and an fp8 row's k^R, aligned to that vector's
 *                          size: the caller's promise (host/mla/attention.c promises it for the
 *                          4-value loads of attn_latent, the one kernel it builds so)
 *   CACHE_HALF_BITS (build option, with CACHE_ALIGNED, f16 caches): the halves are read as one
 *                          ushort4 / ushort8 and converted from private memory, since NVIDIA's
 *                          compiler reads vloada_half4 as 4 scalar loads, as it does vload_half4
 *   CACHE_STORE(v, i, r)   float v stored as value i of row r, rounded to nearest even (not fp8:
 *                          its rows are written a 128-value tile at a time, cl/cache_write.cl)
 * The weights' element type, chosen by the build option W_DTYPE (0 float, 1 half, 2 bf16, 3 fp8
 * e4m3 with float32 scales per 128 x 128 block; host/runtime/dtype.h), for the product kernels:
 *   W_T                    the unit of a weight in memory
 *   W_SCALE(Bs, ld, r, k)  the scale of element (row r, column k), for W_LOAD's s: fp8's block
 *                          scale times DT_E4M3_UNIT (so one multiply per element applies both:
 *                          the host keeps fp8 only for block scales below 2^8, where the product
 *                          is finite, host/mla/weight.c), 1 for the other types
 *   W_LOAD(p, i, s)        element i of p as float (fp8: times s; s is unused, and need not be
 *                          read, for the other types: W_SCALED says when it is)
 *   W_LOAD4(p, i, s)       elements 4i .. 4i+3 as float4 (one block: 4i is a multiple of 4)
 *   W_LOAD8(p, i, s)       elements 8i .. 8i+7 as float8 (W_LOAD16: 16i .. 16i+15 as float16)
 *   W_ALIGNED (build option): W_LOAD4/8/16 read the N elements as one value of the N-vector of
 *                          W_T (float4, ushort8, uchar16, ...), which needs p + Ni aligned to that
 *                          vector's size: the caller's promise. vloadN promises only a W_T's
 *                          alignment, and NVIDIA's compiler reads it as N scalar loads (u8 for fp8)
 *   W_BLOCK                the columns one scale covers (128 for fp8, else a bound no K reaches):
 *                          a kernel may read s once per W_BLOCK columns of a row
 * fp8 codes S.1111.111 (NaN) are refused when a weight is uploaded, so the branch-free decoder
 * serves.
 * fp8 rows follow FlashMLA's layout for DeepSeek's latent cache: the RKV values of c^KV as e4m3
 * codes, then RKV/128 float32 scales (value = code * scale, one scale per 128 codes), then the DR
 * values of k^R as bf16: RKV + 4 RKV/128 + 2 DR bytes (656 for 512 + 64). RKV is a multiple of 128
 * and DR even, so the scales are 4-byte and the bf16 values 2-byte aligned when rows are.
 */

/* The latent row's widths, set by the host (-D RKV -D DR): c^KV's and k^R's values; DeepSeek's
   512 and 64 where a file is built without them. */
#ifndef RKV
#define RKV 512
#endif
#ifndef DR
#define DR 64
#endif
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

/* On x86 no function is called with a 16-value vector of 32-bit values (512 bits), passed or
   returned: without AVX-512 (PoCL on AVX2 processors) clang warns that such a call depends on
   AVX-512 for its convention (-Wpsabi), and PoCL prints "warnings generated" at every build of a
   program that holds one (tests/kernel_warnings.sh checks it). There the 16-value decoders
   (dt_bf16x16, dt_e4m3x16u) are not defined: W_LOAD16 is two W_LOAD8 (below), and the 64-byte
   lines below go through pointers. */
#ifndef __x86_64__
inline float16 dt_bf16x16(const ushort16 b)
{
    return as_float16(convert_uint16(b) << 16);
}
#endif
/* The CPU kernels' 16-lane built-ins, on x86 as two calls over 8 lanes each (each argument is read
   twice), elsewhere one call (oclgrind, which runs every kernel, marks the halves of a 16-value
   vector taken as 8-value ones uninitialised):
     V16_FMA(a, b, c), V16_EXP2(x), V16_SELECT(a, b, c)   fma, exp2, select
     V16_LOAD(T, i, p), V16_STORE(v, i, p)                 vload16 as a T##16, vstore16 */
#ifdef __x86_64__
#define V16_FMA(a, b, c) ((float16)(fma((a).lo, (b).lo, (c).lo), fma((a).hi, (b).hi, (c).hi)))
#define V16_EXP2(x) ((float16)(exp2((x).lo), exp2((x).hi)))
#define V16_SELECT(a, b, c) ((float16)(select((a).lo, (b).lo, (c).lo), select((a).hi, (b).hi, (c).hi)))
#define V16_LOAD(T, i, p) ((T##16)(vload8(2 * (i), (p)), vload8(2 * (i) + 1, (p))))
#define V16_STORE(v, i, p)                                                                          \
    do {                                                                                            \
        vstore8((v).lo, 2 * (i), (p));                                                              \
        vstore8((v).hi, 2 * (i) + 1, (p));                                                          \
    } while (0)
#else
#define V16_FMA(a, b, c) fma((a), (b), (c))
#define V16_EXP2(x) exp2(x)
#define V16_SELECT(a, b, c) select((a), (b), (c))
#define V16_LOAD(T, i, p) vload16((i), (p))
#define V16_STORE(v, i, p) vstore16((v), (i), (p))
#endif

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

inline uint dt_e4m3_bf16(const uint c)
{
    /* a normal code's exponent and mantissa moved into place, the exponent rebiased by 127 - 7; a
       subnormal one (m 2^-9) through a float */
    const uint mag = c & 0x7Fu, sub = as_uint((float)(c & 7u) * 0x1.0p-9f) >> 16;
    return (c & 0x80u) << 8 | (mag >= 8u ? (mag << 4) + (120u << 7) : sub);
}

inline uchar dt_to_e4m3(const float v)
{
    const uint sign = (as_uint(v) >> 24) & 0x80u;
    const float a = fabs(v);
    if (isnan(v))
        return (uchar)(sign | 0x7Fu);
    if (a >= 464.0f) /* 448 + half its unit and beyond */
        return (uchar)(sign | 0x7Eu);
    if (a < 0x1.0p-6f) /* subnormal codes, a grid of 2^-9 (the product is exact) */
        return (uchar)(sign | (uint)rint(a * 512.0f));
    const uint u = as_uint(a), r = u + 0x7FFFFu + ((u >> 20) & 1u); /* to 3 mantissa bits */
    return (uchar)(sign | ((((r >> 23) - 120u) << 3) | ((r >> 20) & 7u)));
}

#if defined(CLMLA_FP8_HALF)
#define DT_E4M3_UNIT 0x1.0p8f
#define DT_E4M3_SUM_X 1.0f
inline float dt_e4m3u(const uchar b)
{
    const ushort h = (ushort)((short)as_char(b) << 7) & (ushort)0xBF80u;
    return vload_half(0, (const half *)&h);
}
#define DT_E4M3_VECTOR(N)                                                                           \
    inline float##N dt_e4m3x##N##u(const uchar##N b)                                                \
    {                                                                                               \
        const ushort##N h = as_ushort##N(convert_short##N(as_char##N(b)) << (short)7) & (ushort)0xBF80u; \
        return vload_half##N(0, (const half *)&h);                                                  \
    }
#elif !defined(CLMLA_NO_DENORMS)
#define DT_E4M3_UNIT 0x1.0p120f
#define DT_E4M3_SUM_X 0x1.0p64f
inline float dt_e4m3u(const uchar b)
{
    return as_float(((uint)as_char(b) << 20) & 0x87F00000u);
}
#define DT_E4M3_VECTOR(N)                                                                           \
    inline float##N dt_e4m3x##N##u(const uchar##N b)                                                \
    {                                                                                               \
        return as_float##N((convert_uint##N(as_char##N(b)) << 20) & 0x87F00000u);                   \
    }
#else
#define DT_E4M3_UNIT 1.0f
#define DT_E4M3_SUM_X 1.0f
inline float dt_e4m3u(const uchar b)
{
    const uint u = b, mag = (u & 0x7Fu) << 20;
    const float normal = as_float(mag + (120u << 23));
    const float subnormal = as_float(mag + (121u << 23)) - 0x1.0p-6f;
    const float v = (u & 0x78u) == 0u ? subnormal : normal;
    return as_float(as_uint(v) | ((u & 0x80u) << 24));
}
#define DT_E4M3_VECTOR(N)                                                                           \
    inline float##N dt_e4m3x##N##u(const uchar##N b)                                                \
    {                                                                                               \
        const uint##N u = convert_uint##N(b), mag = (u & 0x7Fu) << 20;                              \
        const float##N normal = as_float##N(mag + (120u << 23));                                    \
        const float##N subnormal = as_float##N(mag + (121u << 23)) - 0x1.0p-6f;                     \
        float##N v = select(normal, subnormal, (u & 0x78u) == 0u);                                  \
        return as_float##N(as_uint##N(v) | ((u & 0x80u) << 24));                                   \
    }
#endif
#define DT_E4M3_SCALED(N)                                                                           \
    inline float##N dt_e4m3x##N##s(const uchar##N b, const float s)                                 \
    {                                                                                               \
        return dt_e4m3x##N##u(b) * DT_E4M3_UNIT * s;                                                \
    }
DT_E4M3_VECTOR(4)
DT_E4M3_VECTOR(8)
#ifndef __x86_64__ /* see dt_bf16x16 */
DT_E4M3_VECTOR(16)
#endif
DT_E4M3_SCALED(4)
DT_E4M3_SCALED(8)

/* Whole 64-byte lines, read as a uint16 whose byte j is element j (a little-endian device), decoded
 * with 32-bit operations, in an order of their own: the even elements first, then the odd ones.
 *   dt_half16(u, i)   halves 16i .. 16i + 15 of the 32 whose bits u (an lvalue) holds, as float16.
 *                     On PoCL for x86 (clang 15 or later, F16C) through clang's _Float16 vectors: one
 *                     vcvtph2ps of a 256-bit register, where vload_half16 converts 8 at a time and
 *                     joins them; oclgrind, which has no _Float16, and other devices take
 *                     vload_half16 (from all of u: oclgrind takes the halves of a 16-value vector
 *                     for uninitialised values), other x86 compilers two vload_half8
 *   dt_halfbits16(h)  the 16 halves whose bits h (an lvalue) holds, as float16, the same two ways
 *   dt_bf16x32p(d, q) the 32 bf16 values of *d: q[0] elements 0, 2, .., 30, q[1] elements 1, .., 31
 *                     (each 32-bit lane holds two: the low one shifted up, the high one masked)
 *   dt_e4m3x64p(d, q) the 64 fp8 codes of *d as dt_e4m3u decodes them under CLMLA_FP8_HALF
 *                     (2^-8 times the value): q[0], q[1] codes 0, 2, .., 62, q[2], q[3] codes
 *                     1, 3, .., 63. Each 16-bit half of a lane holds two codes: the low code's
 *                     7 bits shifted up 7 under its sign shifted up 8, the high code's shifted
 *                     down 1 under its own sign, which is the half S.0.eeee.mmm.0000000
 * The first two are macros and the others take the 64-byte line through a pointer (see
 * dt_bf16x16). */
#if defined(__x86_64__) && defined(__F16C__) && defined(__clang__) && __clang_major__ >= 15 /* _Float16 on x86 */
typedef _Float16 dt_half16_t __attribute__((ext_vector_type(16)));
#define dt_half16(u, i) __builtin_convertvector(__builtin_astype((i) ? (u).hi : (u).lo, dt_half16_t), float16)
#define dt_halfbits16(h) __builtin_convertvector(__builtin_astype((h), dt_half16_t), float16)
#elif defined(__x86_64__)
#define dt_half16(u, i)                                                                             \
    ((float16)(vload_half8(2 * (i), (const half *)&(u)), vload_half8(2 * (i) + 1, (const half *)&(u))))
#define dt_halfbits16(h) ((float16)(vload_half8(0, (const half *)&(h)), vload_half8(1, (const half *)&(h))))
#else
#define dt_half16(u, i) vload_half16((i), (const half *)&(u))
#define dt_halfbits16(h) vload_half16(0, (const half *)&(h))
#endif

inline void dt_bf16x32p(const uint16 *d, float16 *q)
{
    q[0] = as_float16(*d << 16);
    q[1] = as_float16(*d & 0xFFFF0000u);
}

#ifdef CLMLA_FP8_HALF
/* 16 fp8 codes in their own order as dt_e4m3u decodes them (2^-8 times the value) into *q, through
   dt_halfbits16: one conversion of 16 halves where dt_e4m3x8u converts 8 */
inline void dt_e4m3x16h(const uchar16 b, float16 *q)
{
    const ushort16 h = as_ushort16(convert_short16(as_char16(b)) << (short)7) & (ushort)0xBF80u;
    *q = dt_halfbits16(h);
}
inline void dt_e4m3x64p(const uint16 *d, float16 *q)
{
    const uint16 ev = ((*d << 7) & 0x3F803F80u) | ((*d << 8) & 0x80008000u);
    const uint16 od = ((*d >> 1) & 0x3F803F80u) | (*d & 0x80008000u);
    q[0] = dt_half16(ev, 0);
    q[1] = dt_half16(ev, 1);
    q[2] = dt_half16(od, 0);
    q[3] = dt_half16(od, 1);
}
#endif

/* CACHE_VLOAD(T, N, i, p): elements Ni .. Ni+N-1 of p as a T##N, through vloadN or, with
   CACHE_ALIGNED, one load of the vector type */
#ifdef CACHE_ALIGNED
#define CACHE_VLOAD(T, N, i, p) (((__global const T##N *)(p))[i])
#else
#define CACHE_VLOAD(T, N, i, p) vload##N((i), (p))
#endif
#if defined(CACHE_F16)
#define CACHE_T half
#define CACHE_ROW_UNITS (RKV + DR)
#define CACHE_CONVERTS
#define CACHE_LOAD(p, i) vload_half((i), (p))
#if defined(CACHE_ALIGNED) && defined(CACHE_HALF_BITS)
/* dt_halfbits4/8: as dt_halfbits16, the 4 or 8 halves whose bits h holds, read from private memory */
inline float4 dt_halfbits4(const ushort4 h)
{
    return vload_half4(0, (const half *)&h);
}
inline float8 dt_halfbits8(const ushort8 h)
{
    return vload_half8(0, (const half *)&h);
}
#define CACHE_LOAD4(p, i) dt_halfbits4(((__global const ushort4 *)(p))[i])
#define CACHE_LOAD8(p, i) dt_halfbits8(((__global const ushort8 *)(p))[i])
#elif defined(CACHE_ALIGNED)
#define CACHE_LOAD4(p, i) vloada_half4((i), (p))
#define CACHE_LOAD8(p, i) vloada_half8((i), (p))
#else
#define CACHE_LOAD4(p, i) vload_half4((i), (p))
#define CACHE_LOAD8(p, i) vload_half8((i), (p))
#endif
#define CACHE_STORE(v, i, p) vstore_half_rte((v), (i), (p))
#elif defined(CACHE_BF16)
#define CACHE_T ushort
#define CACHE_ROW_UNITS (RKV + DR)
#define CACHE_CONVERTS
#define CACHE_LOAD(p, i) dt_bf16((p)[i])
#define CACHE_LOAD4(p, i) dt_bf16x4(CACHE_VLOAD(ushort, 4, (i), (p)))
#define CACHE_LOAD8(p, i) dt_bf16x8(CACHE_VLOAD(ushort, 8, (i), (p)))
#define CACHE_STORE(v, i, p) ((p)[i] = dt_to_bf16(v))
#elif defined(CACHE_FP8)
#define CACHE_T uchar
#define CACHE_ROW_UNITS (RKV + 4 * (RKV / 128) + 2 * DR)
#define CACHE_CONVERTS
#define FP8_SCALES(r) ((__global const float *)((r) + RKV))
#define FP8_ROPE(r) ((__global const ushort *)((r) + RKV + 4 * (RKV / 128)))
#define CACHE_LOAD_VALUE(r, i) (dt_e4m3u((r)[i]) * DT_E4M3_UNIT * FP8_SCALES(r)[(i) / 128])
#define CACHE_LOAD(r, i) ((i) < RKV ? CACHE_LOAD_VALUE((r), (i)) : dt_bf16(FP8_ROPE(r)[(i) - RKV]))
inline float4 fp8_load4(__global const uchar *r, const int i)
{
    if (4 * i < RKV)
        return dt_e4m3x4s(CACHE_VLOAD(uchar, 4, i, r), FP8_SCALES(r)[4 * i / 128]);
    return dt_bf16x4(CACHE_VLOAD(ushort, 4, 0, FP8_ROPE(r) + (4 * i - RKV)));
}
inline float8 fp8_load8(__global const uchar *r, const int i)
{
    if (8 * i < RKV)
        return dt_e4m3x8s(CACHE_VLOAD(uchar, 8, i, r), FP8_SCALES(r)[8 * i / 128]);
    return dt_bf16x8(CACHE_VLOAD(ushort, 8, 0, FP8_ROPE(r) + (8 * i - RKV)));
}
#define CACHE_LOAD4(r, i) fp8_load4((r), (i))
#define CACHE_LOAD8(r, i) fp8_load8((r), (i))
#else
#define CACHE_T float
#define CACHE_ROW_UNITS (RKV + DR)
#define CACHE_LOAD(p, i) ((p)[i])
#define CACHE_LOAD4(p, i) vload4((i), (p))
#define CACHE_LOAD8(p, i) vload8((i), (p))
#define CACHE_STORE(v, i, p) ((p)[i] = (v))
#endif
#ifndef CACHE_LOAD_VALUE
#define CACHE_LOAD_VALUE(p, i) CACHE_LOAD((p), (i))
#endif

/* W_VLOAD(T, N, i, p): elements Ni .. Ni+N-1 of p (a W_T pointer) as a T##N, through vloadN or,
   with W_ALIGNED, one load of the vector type */
#ifdef W_ALIGNED
#define W_VLOAD(T, N, i, p) (((__global const T##N *)(p))[i])
#else
#define W_VLOAD(T, N, i, p) vload##N((i), (p))
#endif
#if W_DTYPE == 1
#define W_T half
#define W_LOAD(p, i, s) vload_half((i), (p))
#ifdef W_ALIGNED
#define W_LOAD4(p, i, s) vloada_half4((i), (p))
#define W_LOAD8(p, i, s) vloada_half8((i), (p))
#define W_LOAD16(p, i, s) vloada_half16((i), (p))
#else
#define W_LOAD4(p, i, s) vload_half4((i), (p))
#define W_LOAD8(p, i, s) vload_half8((i), (p))
#define W_LOAD16(p, i, s) vload_half16((i), (p))
#endif
#elif W_DTYPE == 2
#define W_T ushort
#define W_LOAD(p, i, s) dt_bf16((p)[i])
#define W_LOAD4(p, i, s) dt_bf16x4(W_VLOAD(ushort, 4, (i), (p)))
#define W_LOAD8(p, i, s) dt_bf16x8(W_VLOAD(ushort, 8, (i), (p)))
#define W_LOAD16(p, i, s) dt_bf16x16(W_VLOAD(ushort, 16, (i), (p)))
#elif W_DTYPE == 3
#define W_T uchar
#define W_SCALED
#define W_BLOCK 128
#define W_LOAD(p, i, s) (dt_e4m3u((p)[i]) * (s))
#define W_LOAD4(p, i, s) (dt_e4m3x4u(W_VLOAD(uchar, 4, (i), (p))) * (s))
#define W_LOAD8(p, i, s) (dt_e4m3x8u(W_VLOAD(uchar, 8, (i), (p))) * (s))
#define W_LOAD16(p, i, s) (dt_e4m3x16u(W_VLOAD(uchar, 16, (i), (p))) * (s))
#else
#define W_T float
#define W_LOAD(p, i, s) ((p)[i])
#define W_LOAD4(p, i, s) W_VLOAD(float, 4, (i), (p))
#define W_LOAD8(p, i, s) W_VLOAD(float, 8, (i), (p))
#define W_LOAD16(p, i, s) W_VLOAD(float, 16, (i), (p))
#endif
#ifdef __x86_64__ /* two loads of 8, in place of the forms above (x86 has no 16-value decoder: see dt_bf16x16) */
#undef W_LOAD16
#define W_LOAD16(p, i, s) ((float16)(W_LOAD8((p), 2 * (i), (s)), W_LOAD8((p), 2 * (i) + 1, (s))))
#endif
/* Bs [blocks(rows), bs_ld] holds fp8's block scales as stored */
#ifdef W_SCALED
#define W_SCALE(Bs, bs_ld, r, k) ((Bs)[((r) >> 7) * (bs_ld) + ((k) >> 7)] * DT_E4M3_UNIT)
#else
#define W_BLOCK 0x40000000
#define W_SCALE(Bs, bs_ld, r, k) 1.0f
#endif

/* ---- the latent attention kernels' tokens and keys ------------------------------------------- */
/* FOLD: query tokens of one sequence per work-group (multi-token decode, 1: one token); HT: heads
   of each of them, the group's HG "heads" being HT * FOLD (token, head) pairs */
#ifndef FOLD
#define FOLD 1
#endif
#ifndef HT
#define HT HG
#endif
#if FOLD > 1 && defined(SPARSE)
#error "FOLD needs every token of a group to walk the same keys: not with SPARSE"
#endif
/* LATENT_RUN_FIRST(u): the first token of query token u's run, the new tokens of one sequence in
   multi-token decode: token_first[u], or (token_first NULL) groups of query_len tokens from token
   0; the kernel's arguments token_first and query_len. */
#define LATENT_RUN_FIRST(u) (token_first ? token_first[u] : (u) - (u) % query_len)
/* LATENT_KEYS_END(ctx, k_begin): the end of the keys a token with ctx keys walks in the split that
   starts at k_begin: its context, or with SPARSE entries of its index list of topk (none when the
   token has no positions); the kernel's arguments split_tokens and topk. */
#ifdef SPARSE
#define LATENT_KEYS_END(ctx, k_begin) ((ctx) > 0 ? min(topk, (k_begin) + split_tokens) : (k_begin))
/* LATENT_LIST(t): token t's index list (the arguments indices, indices_offset and topk) */
#define LATENT_LIST(t) (indices + indices_offset + (size_t)(t) * topk)
#else
#define LATENT_KEYS_END(ctx, k_begin) min((ctx), (k_begin) + split_tokens)
#endif
