/* Weights in a clmla_dtype, encoded on the host for the products phase.
 *
 * clmla_linear takes a clmla_tensor in any dtype but has no option to convert one, and the bench
 * uses the public API only (the library's own encoders are internal), so the bench encodes the
 * float32 weights itself, by the rules include/clmla.h states for the formats:
 *   f16, bf16  each value rounded to nearest, ties to even;
 *   fp8        DeepSeek-V3's 128 x 128 blocks: the float32 scale s = max|W| / 448 of the block
 *              (a block of zeros: s = 1), and the codes e4m3(w / s), the quotient taken in double
 *              (one rounding), rounded to nearest even and saturating at 448.
 * The float32 array is then overwritten with the values the codes denote (times their scale), so
 * that the float64 check of the product compares against the weights the library multiplies by. */
#include "bench.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FP8_BLOCK 128
#define E4M3_MAX 448.0

static uint16_t to_bf16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof(bits));
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((bits >> 16) | 0x0040u); /* NaN stays a (quiet) NaN */
    bits += 0x7FFFu + ((bits >> 16) & 1u);      /* round to nearest, ties to even */
    return (uint16_t)(bits >> 16);
}

static float from_bf16(uint16_t code)
{
    const uint32_t bits = (uint32_t)code << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* nearbyint rounds to nearest even in the default rounding mode; each quotient below is exact in
   double, so the one rounding is the format's. */
static uint16_t to_f16(float f)
{
    const uint16_t sign = signbit(f) ? 0x8000u : 0;
    const double a = fabs((double)f);
    if (isnan(f))
        return (uint16_t)(sign | 0x7E00u);
    if (a >= 65520.0) /* rounds past the largest binary16, 65504 */
        return (uint16_t)(sign | 0x7C00u);
    if (a < ldexp(1.0, -14)) /* subnormal: multiples of 2^-24; 1024 of them is the smallest normal's code */
        return (uint16_t)(sign | (uint16_t)nearbyint(ldexp(a, 24)));
    int e;
    frexp(a, &e);
    e -= 1; /* a = m * 2^e, m in [1, 2) */
    double q = nearbyint((ldexp(a, -e) - 1.0) * 1024.0);
    if (q == 1024.0) {
        q = 0;
        e++;
    }
    if (e > 15)
        return (uint16_t)(sign | 0x7C00u);
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)q);
}

static float from_f16(uint16_t code)
{
    const int e = (code >> 10) & 31, m = code & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1.0 + m / 1024.0, e - 15);
    return (float)(code & 0x8000u ? -v : v);
}

/* OCP E4M3FN: bias 7, subnormals m * 2^-9, no infinities, 0x7F NaN, largest 448 (0x7E). */
static uint8_t to_e4m3(double x)
{
    const uint8_t sign = signbit(x) ? 0x80u : 0;
    const double a = fabs(x);
    if (isnan(x))
        return (uint8_t)(sign | 0x7Fu);
    if (a >= E4M3_MAX)
        return (uint8_t)(sign | 0x7Eu);
    if (a < ldexp(1.0, -6)) /* subnormal; 8 of 2^-9 is the smallest normal's code, 0x08 */
        return (uint8_t)(sign | (uint8_t)nearbyint(ldexp(a, 9)));
    int e;
    frexp(a, &e);
    e -= 1;
    double q = nearbyint((ldexp(a, -e) - 1.0) * 8.0);
    if (q == 8.0) {
        q = 0;
        e++;
    }
    unsigned code = (unsigned)((e + 7) << 3) | (unsigned)q;
    if (code > 0x7Eu) /* between 448 and 464 rounds to 448 above; past it would be 480: saturate */
        code = 0x7Eu;
    return (uint8_t)(sign | code);
}

static double from_e4m3(uint8_t code)
{
    const int e = (code >> 3) & 15, m = code & 7;
    const double v = e == 0 ? ldexp(m, -9) : (e == 15 && m == 7) ? NAN : ldexp(1.0 + m / 8.0, e - 7);
    return code & 0x80u ? -v : v;
}

size_t bench_weight_stored_bytes(clmla_dtype dtype, size_t n, size_t k)
{
    switch (dtype) {
    case CLMLA_DTYPE_F16:
    case CLMLA_DTYPE_BF16:
        return n * k * 2;
    case CLMLA_DTYPE_FP8_E4M3:
        return n * k + ((n + FP8_BLOCK - 1) / FP8_BLOCK) * ((k + FP8_BLOCK - 1) / FP8_BLOCK) * sizeof(float);
    default:
        return n * k * sizeof(float);
    }
}

static void encode_fp8(float *w, size_t n, size_t k, uint8_t *codes, float *scale)
{
    const size_t bn = (n + FP8_BLOCK - 1) / FP8_BLOCK, bk = (k + FP8_BLOCK - 1) / FP8_BLOCK;
    for (size_t bi = 0; bi < bn; bi++)
        for (size_t bj = 0; bj < bk; bj++) {
            const size_t i1 = (bi + 1) * FP8_BLOCK < n ? (bi + 1) * FP8_BLOCK : n;
            const size_t j1 = (bj + 1) * FP8_BLOCK < k ? (bj + 1) * FP8_BLOCK : k;
            float amax = 0;
            for (size_t i = bi * FP8_BLOCK; i < i1; i++)
                for (size_t j = bj * FP8_BLOCK; j < j1; j++)
                    amax = fmaxf(amax, fabsf(w[i * k + j]));
            const float s = amax > 0 ? (float)(amax / E4M3_MAX) : 1.0f;
            scale[bi * bk + bj] = s;
            for (size_t i = bi * FP8_BLOCK; i < i1; i++)
                for (size_t j = bj * FP8_BLOCK; j < j1; j++) {
                    const uint8_t c = to_e4m3((double)w[i * k + j] / s);
                    codes[i * k + j] = c;
                    w[i * k + j] = (float)(from_e4m3(c) * s);
                }
        }
}

int bench_encode_weight(float *w, size_t n, size_t k, clmla_dtype dtype, bench_encoded *out)
{
    memset(out, 0, sizeof(*out));
    out->tensor = clmla_tensor_2d(w, (int64_t)n, (int64_t)k);
    out->tensor.dtype = dtype;
    if (dtype == CLMLA_DTYPE_F32)
        return 0;
    const size_t count = n * k;
    if (dtype == CLMLA_DTYPE_F16 || dtype == CLMLA_DTYPE_BF16) {
        uint16_t *codes = malloc(count * sizeof(uint16_t));
        if (!codes)
            return 1;
        for (size_t i = 0; i < count; i++) {
            codes[i] = dtype == CLMLA_DTYPE_F16 ? to_f16(w[i]) : to_bf16(w[i]);
            w[i] = dtype == CLMLA_DTYPE_F16 ? from_f16(codes[i]) : from_bf16(codes[i]);
        }
        out->codes = codes;
    } else if (dtype == CLMLA_DTYPE_FP8_E4M3) {
        const size_t blocks = ((n + FP8_BLOCK - 1) / FP8_BLOCK) * ((k + FP8_BLOCK - 1) / FP8_BLOCK);
        uint8_t *codes = malloc(count);
        out->scale = malloc(blocks * sizeof(float));
        if (!codes || !out->scale) {
            free(codes);
            free(out->scale);
            out->scale = NULL;
            return 1;
        }
        encode_fp8(w, n, k, codes, out->scale);
        out->codes = codes;
        out->tensor.scale = out->scale;
    } else {
        return 1;
    }
    out->tensor.data = out->codes;
    return 0;
}

void bench_encoded_free(bench_encoded *e)
{
    free(e->codes);
    free(e->scale);
    memset(e, 0, sizeof(*e));
}
