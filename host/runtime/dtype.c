/* Host side of the element types (dtype.h): written from the formats' definitions; the device's
   decoders are cl/prelude.cl, and test_kernels holds both to ref/'s. */
#include "dtype.h"

#include <math.h>
#include <string.h>

size_t clmla_dtype_bytes(clmla_dtype dtype)
{
    switch (dtype) {
    case CLMLA_DTYPE_F32:
        return 4;
    case CLMLA_DTYPE_F16:
    case CLMLA_DTYPE_BF16:
        return 2;
    case CLMLA_DTYPE_FP8_E4M3:
        return 1;
    }
    return 0;
}

int clmla_dtype_valid(clmla_dtype dtype)
{
    return clmla_dtype_bytes(dtype) != 0;
}

const char *clmla_dtype_name(clmla_dtype dtype)
{
    static const char *const names[] = {"f32", "f16", "bf16", "fp8"};
    return clmla_dtype_valid(dtype) ? names[dtype] : NULL;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

float clmla_bf16_to_float(uint16_t b)
{
    return from_bits((uint32_t)b << 16);
}

float clmla_f16_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const int e = (h >> 10) & 0x1F;
    const uint32_t m = h & 0x3FFu;
    if (e == 0x1F) /* infinity or NaN, payload kept */
        return from_bits(sign | 0x7F800000u | (m << 13));
    const float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 0x400u), e - 25);
    return sign ? -v : v;
}

float clmla_e4m3_to_float(uint8_t c)
{
    const int e = (c >> 3) & 0xF, m = c & 7;
    if (e == 0xF && m == 7)
        return (c & 0x80) ? -NAN : NAN;
    const float v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(m | 8), e - 10);
    return (c & 0x80) ? -v : v;
}

uint16_t clmla_float_to_bf16(float f)
{
    const uint32_t u = to_bits(f);
    if (isnan(f))
        return (uint16_t)((u >> 16) | 0x40u); /* quiet, sign kept */
    /* round to nearest even on the 16 bits dropped; a carry into the exponent is the right result */
    const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(rounded >> 16);
}

uint16_t clmla_float_to_f16(float f)
{
    const uint16_t sign = (to_bits(f) >> 16) & 0x8000u;
    if (isnan(f))
        return (uint16_t)(sign | 0x7E00u);
    double a = fabs((double)f);
    if (a >= 65520.0) /* 65504 + half a step and beyond round to infinity */
        return (uint16_t)(sign | 0x7C00u);
    int e;
    frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
    int exp = e - 1; /* a in [2^exp, 2^(exp+1)) */
    if (exp < -14)
        exp = -14; /* subnormals: the grid of 2^-24 */
    double q = nearbyint(ldexp(a, 10 - exp)); /* multiple of 2^(exp-10) */
    if (q >= 2048.0) { /* rounded up into the next binade */
        q /= 2.0;
        exp++;
    }
    if (q < 1024.0) /* subnormal (exp == -14) or zero */
        return (uint16_t)(sign | (uint16_t)q);
    if (exp > 15)
        return (uint16_t)(sign | 0x7C00u);
    return (uint16_t)(sign | (uint16_t)((exp + 15) << 10) | (uint16_t)((int)q - 1024));
}

uint8_t clmla_double_to_e4m3(double x)
{
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x))
        return (uint8_t)(sign | 0x7F);
    double a = fabs(x);
    if (a >= 448.0)
        return (uint8_t)(sign | 0x7E); /* saturate: 1.75 * 2^8 */
    int e;
    frexp(a, &e);
    int exp = e - 1;
    if (exp < -6)
        exp = -6; /* subnormals: the grid of 2^-9 */
    double q = nearbyint(ldexp(a, 3 - exp)); /* multiple of 2^(exp-3) */
    if (q >= 16.0) {
        q /= 2.0;
        exp++;
    }
    if (q < 8.0)
        return (uint8_t)(sign | (uint8_t)q);
    if (exp > 8 || (exp == 8 && q > 14.0)) /* past 448 after rounding */
        return (uint8_t)(sign | 0x7E);
    return (uint8_t)(sign | (uint8_t)((exp + 7) << 3) | (uint8_t)((int)q - 8));
}

float clmla_dtype_element(const void *data, clmla_dtype dtype, size_t i)
{
    switch (dtype) {
    case CLMLA_DTYPE_F32: {
        float f;
        memcpy(&f, (const char *)data + 4 * i, sizeof(f));
        return f;
    }
    case CLMLA_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, (const char *)data + 2 * i, sizeof(h));
        return clmla_f16_to_float(h);
    }
    case CLMLA_DTYPE_BF16: {
        uint16_t b;
        memcpy(&b, (const char *)data + 2 * i, sizeof(b));
        return clmla_bf16_to_float(b);
    }
    case CLMLA_DTYPE_FP8_E4M3:
        return clmla_e4m3_to_float(((const uint8_t *)data)[i]);
    }
    return NAN;
}

float clmla_tensor_element(const clmla_tensor *t, size_t i, size_t j)
{
    const size_t cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
    const float v = clmla_dtype_element(t->data, t->dtype, i * cols + j);
    if (t->dtype != CLMLA_DTYPE_FP8_E4M3)
        return v;
    return v * t->scale[(i / CLMLA_FP8_BLOCK) * clmla_fp8_blocks(cols) + j / CLMLA_FP8_BLOCK];
}

int clmla_fp8_quantize(const float *w, size_t rows, size_t cols, uint8_t *codes, float *scale)
{
    const size_t bc = clmla_fp8_blocks(cols);
    for (size_t r0 = 0; r0 < rows; r0 += CLMLA_FP8_BLOCK)
        for (size_t c0 = 0; c0 < cols; c0 += CLMLA_FP8_BLOCK) {
            const size_t r1 = r0 + CLMLA_FP8_BLOCK < rows ? r0 + CLMLA_FP8_BLOCK : rows;
            const size_t c1 = c0 + CLMLA_FP8_BLOCK < cols ? c0 + CLMLA_FP8_BLOCK : cols;
            float amax = 0.0f;
            for (size_t r = r0; r < r1; r++)
                for (size_t c = c0; c < c1; c++) {
                    const float v = w[r * cols + c];
                    if (!isfinite(v))
                        return -1;
                    amax = fmaxf(amax, fabsf(v));
                }
            float s = amax > 0.0f ? amax / 448.0f : 1.0f;
            if (s == 0.0f) /* amax below 448 times the smallest float: its quotient underflowed */
                s = 0x1p-149f;
            scale[(r0 / CLMLA_FP8_BLOCK) * bc + c0 / CLMLA_FP8_BLOCK] = s;
            for (size_t r = r0; r < r1; r++)
                for (size_t c = c0; c < c1; c++)
                    codes[r * cols + c] = clmla_double_to_e4m3((double)w[r * cols + c] / (double)s);
        }
    return 0;
}
