/*
 * mla_ref.c: float64 reference implementation of Multi-head Latent Attention.
 * See mla_ref.h for the API and docs/MLA.md for the math.
 */
#include "mla_ref.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* ------------------------------------------------------------------------------------------ */
/* Small linear-algebra helpers                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Dot product of a float32 weight row with a double vector, accumulated in double.
   Four partial sums break the add dependency chain; this is still plain double arithmetic. */
static double dot_fd(const float *w /* [n] */, const double *x /* [n] */, size_t n)
{
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)w[i + 0] * x[i + 0];
        s1 += (double)w[i + 1] * x[i + 1];
        s2 += (double)w[i + 2] * x[i + 2];
        s3 += (double)w[i + 3] * x[i + 3];
    }
    for (; i < n; i++)
        s0 += (double)w[i] * x[i];
    return (s0 + s1) + (s2 + s3);
}

static double dot_dd(const double *a /* [n] */, const double *b /* [n] */, size_t n)
{
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i + 0] * b[i + 0];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++)
        s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* y = W x for a row-major weight block W [rows, cols]. */
static void matvec(const float *W /* [rows, cols] */, size_t rows, size_t cols,
                   const double *x /* [cols] */, double *y /* [rows] */)
{
    for (size_t r = 0; r < rows; r++)
        y[r] = dot_fd(W + r * cols, x, cols);
}

/* y = W^T x for a row-major weight block W [rows, cols]: y[c] = sum_r W[r, c] x[r]. */
static void matvec_t(const float *W /* [rows, cols] */, size_t rows, size_t cols,
                     const double *x /* [rows] */, double *y /* [cols] */)
{
    for (size_t c = 0; c < cols; c++)
        y[c] = 0.0;
    for (size_t r = 0; r < rows; r++) {
        const float *row = W + r * cols;
        const double xr = x[r];
        for (size_t c = 0; c < cols; c++)
            y[c] += (double)row[c] * xr;
    }
}

/* x rounded to `bits` significant bits, ties to even, with values below 2^min_exp kept on the
   grid of 2^(min_exp - bits + 1) (subnormals). */
static double round_to_bits(double x, int bits, int min_exp)
{
    if (x == 0.0 || !isfinite(x))
        return x;
    const double a = fabs(x);
    int e = 0;
    frexp(a, &e);                                  /* a in [2^(e-1), 2^e) */
    const int lead = e - 1 < min_exp ? min_exp : e - 1; /* exponent of the leading bit's place */
    const double quantum = ldexp(1.0, lead - bits + 1);
    const double q = a / quantum;                  /* exact: a power of two */
    double r = floor(q);
    const double frac = q - r;
    if (frac > 0.5 || (frac == 0.5 && fmod(r, 2.0) != 0.0))
        r += 1.0;
    return copysign(r * quantum, x);               /* a value that rounds to 0 keeps its sign */
}

double mla_ref_round_f16(double x)
{
    return round_to_bits(x, 11, -14);
}

double mla_ref_round_bf16(double x)
{
    return round_to_bits(x, 8, -126);
}

/* The value of a sign-exponent-mantissa code with `ebits` exponent bits, `mbits` mantissa bits and
   bias `bias`: exponent field 0 for subnormals; the largest exponent field holds infinity and NaN
   (ieee), or only NaN with an all-ones mantissa (e4m3). */
static double decode_code(unsigned bits, int ebits, int mbits, int bias, int ieee)
{
    const int top = (1 << ebits) - 1, ones = (1 << mbits) - 1;
    const int sign = (bits >> (ebits + mbits)) & 1, e = (bits >> mbits) & top, m = bits & ones;
    double v;
    if (e == top && (ieee || m == ones))
        v = ieee && !m ? INFINITY : NAN;
    else if (e == 0)
        v = ldexp((double)m, 1 - bias - mbits);
    else
        v = ldexp((double)(ones + 1 + m), e - bias - mbits);
    return sign ? -v : v;
}

double mla_ref_round_e4m3(double x)
{
    const double r = round_to_bits(x, 4, -6);
    return fabs(r) > 448.0 ? copysign(448.0, x) : r;
}

void mla_ref_round_cache_row(mla_ref_cache_type type, double *ckv, int rkv, double *kr, int dr)
{
    if (type == MLA_REF_CACHE_FP8) {
        for (int t0 = 0; t0 + 128 <= rkv; t0 += 128) {
            double amax = 0.0;
            int nan = 0;
            for (int i = t0; i < t0 + 128; i++) {
                amax = fmax(amax, fabs(ckv[i]));
                nan |= isnan(ckv[i]);
            }
            int e = 0;
            const double m = frexp(fmax(amax / 448.0, 1e-4), &e); /* = m 2^e, m in [0.5, 1) */
            double s = m == 0.5 ? ldexp(1.0, e - 1) : ldexp(1.0, e); /* the power of two at or above */
            if (nan)
                s = NAN; /* the whole tile reads back as NaN */
            for (int i = t0; i < t0 + 128; i++)
                ckv[i] = mla_ref_round_e4m3(ckv[i] / s) * s;
        }
        for (int i = 0; i < dr; i++)
            kr[i] = mla_ref_round_bf16(kr[i]);
        return;
    }
    for (int i = 0; i < rkv; i++)
        ckv[i] = type == MLA_REF_CACHE_F16 ? mla_ref_round_f16(ckv[i]) : type == MLA_REF_CACHE_BF16 ? mla_ref_round_bf16(ckv[i]) : ckv[i];
    for (int i = 0; i < dr; i++)
        kr[i] = type == MLA_REF_CACHE_F16 ? mla_ref_round_f16(kr[i]) : type == MLA_REF_CACHE_BF16 ? mla_ref_round_bf16(kr[i]) : kr[i];
}

/* The code of x in a float format of 1 sign, `ebits` exponent and `mbits` mantissa bits with this
   bias, read as mla_ref_decode_* reads codes: exponent field 0 for subnormals (grid
   2^(1 - bias - mbits)), all ones for infinities and NaN when `ieee`, while e4m3 (not `ieee`) uses
   that field for normals too, all but the all-ones mantissa. -1 when the format does not hold x. */
static int encode_bits(double x, int ebits, int mbits, int bias, int ieee)
{
    if (isnan(x))
        return -1;
    const int sign = signbit(x) ? 1 << (ebits + mbits) : 0;
    const int all_ones = (1 << ebits) - 1;
    const double a = fabs(x);
    if (a == 0.0)
        return sign;
    if (isinf(a))
        return ieee ? sign | all_ones << mbits : -1;
    int e = 0;
    frexp(a, &e); /* a in [2^(e-1), 2^e) */
    int field = e - 1 + bias;
    double m;
    if (field < 1) { /* a subnormal: a multiple of the smallest one */
        field = 0;
        m = ldexp(a, bias - 1 + mbits);
    } else {
        m = ldexp(a, mbits - (e - 1)) - ldexp(1.0, mbits); /* the bits after the leading one */
    }
    if (m != floor(m) || m >= ldexp(1.0, mbits))
        return -1; /* more significant bits than the format has */
    const int mant = (int)m;
    if (field > all_ones || (ieee && field == all_ones) || (!ieee && field == all_ones && mant == (1 << mbits) - 1))
        return -1; /* past the largest finite value */
    return sign | field << mbits | mant;
}

/* mla_ref_decode_NAME and mla_ref_encode_NAME of each format, from its exponent and mantissa bits,
   bias and kind of the largest exponent field. */
#define CODE_FORMAT(name, ebits, mbits, bias, ieee)                                                          \
    double mla_ref_decode_##name(unsigned bits) { return decode_code(bits, ebits, mbits, bias, ieee); }     \
    int mla_ref_encode_##name(double x) { return encode_bits(x, ebits, mbits, bias, ieee); }
CODE_FORMAT(f16, 5, 10, 15, 1)
CODE_FORMAT(bf16, 8, 7, 127, 1)
CODE_FORMAT(e4m3, 4, 3, 7, 0)
#undef CODE_FORMAT

/* Number of FP8 scale blocks along a dimension of n values. */
static size_t fp8_blocks(size_t n)
{
    return (n + MLA_REF_FP8_BLOCK - 1) / MLA_REF_FP8_BLOCK;
}

int mla_ref_quantize_fp8(const float *w, int rows, int cols, unsigned char *codes, float *scale)
{
    if (rows < 0 || cols < 0 || ((size_t)rows * (size_t)cols > 0 && (!w || !codes || !scale)))
        return -1;
    const size_t R = (size_t)rows, C = (size_t)cols, bc = fp8_blocks(C);
    for (size_t i = 0; i < R * C; i++)
        if (!isfinite(w[i]))
            return -1;
    for (size_t r0 = 0; r0 < R; r0 += MLA_REF_FP8_BLOCK) {
        for (size_t c0 = 0; c0 < C; c0 += MLA_REF_FP8_BLOCK) {
            const size_t r1 = r0 + MLA_REF_FP8_BLOCK < R ? r0 + MLA_REF_FP8_BLOCK : R;
            const size_t c1 = c0 + MLA_REF_FP8_BLOCK < C ? c0 + MLA_REF_FP8_BLOCK : C;
            double amax = 0.0;
            for (size_t r = r0; r < r1; r++)
                for (size_t c = c0; c < c1; c++)
                    amax = fmax(amax, fabs((double)w[r * C + c]));
            /* The float32 quotient: the double quotient of two floats, rounded to float, is the
               correctly rounded float32 one (53 >= 2 * 24 + 2 bits: the double rounding is
               harmless), so this is the float32 division the rule names. */
            float s = amax > 0.0 ? (float)(amax / 448.0) : 1.0f;
            if (s == 0.0f)
                s = ldexpf(1.0f, -149);
            scale[(r0 / MLA_REF_FP8_BLOCK) * bc + c0 / MLA_REF_FP8_BLOCK] = s;
            for (size_t r = r0; r < r1; r++)
                for (size_t c = c0; c < c1; c++)
                    codes[r * C + c] =
                        (unsigned char)mla_ref_encode_e4m3(mla_ref_round_e4m3((double)w[r * C + c] / (double)s));
        }
    }
    return 0;
}

/* x rounded by `round` (to f16 or bf16), then past the format's largest finite value `max` to an
   infinity: round_to_bits knows no largest exponent, and IEEE rounding overflows exactly when the
   unbounded rounding lands past the largest value. */
static float round_16(double (*round)(double), double max, float x)
{
    const double r = round((double)x);
    return fabs(r) > max ? copysignf(INFINITY, x) : (float)r;
}

int mla_ref_round_weight(int dtype, float *w, int rows, int cols)
{
    if (rows < 0 || cols < 0 || dtype < MLA_REF_WEIGHT_F32 || dtype > MLA_REF_WEIGHT_FP8)
        return -1;
    const size_t n = (size_t)rows * (size_t)cols;
    if (n == 0 || dtype == MLA_REF_WEIGHT_F32)
        return 0;
    if (!w)
        return -1;
    if (dtype == MLA_REF_WEIGHT_F16 || dtype == MLA_REF_WEIGHT_BF16) {
        const double max = dtype == MLA_REF_WEIGHT_F16 ? 65504.0 : ldexp(255.0, 120); /* (2 - 2^-7) 2^127 */
        for (size_t i = 0; i < n; i++)
            w[i] = round_16(dtype == MLA_REF_WEIGHT_F16 ? mla_ref_round_f16 : mla_ref_round_bf16, max, w[i]);
        return 0;
    }
    const size_t bc = fp8_blocks((size_t)cols);
    unsigned char *codes = malloc(n);
    float *scale = malloc(fp8_blocks((size_t)rows) * bc * sizeof(float));
    int rc = -1;
    if (codes && scale && mla_ref_quantize_fp8(w, rows, cols, codes, scale) == 0) {
        for (size_t i = 0; i < n; i++) {
            const size_t r = i / (size_t)cols, c = i % (size_t)cols;
            const double s = scale[(r / MLA_REF_FP8_BLOCK) * bc + c / MLA_REF_FP8_BLOCK];
            w[i] = (float)(mla_ref_decode_e4m3(codes[i]) * s); /* the product is exact in double */
        }
        rc = 0;
    }
    free(codes);
    free(scale);
    return rc;
}

/* In place: x = w * x / sqrt(mean(x^2) + eps), all in double. */
static void rmsnorm(double *x /* [n] */, const float *w /* [n] */, size_t n, double eps)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    const double inv_rms = 1.0 / sqrt(ss / (double)n + eps);
    for (size_t i = 0; i < n; i++)
        x[i] = (double)w[i] * (x[i] * inv_rms);
}

/* ------------------------------------------------------------------------------------------ */
/* RoPE: default, linear, YaRN, LongRoPE, llama3, none (docs/MLA.md sections 3 and 4)          */
/* ------------------------------------------------------------------------------------------ */

/* All zero: no features, what mla_ref_config alone describes. */
static const mla_ref_features no_features;

static const mla_ref_features *features_or_none(const mla_ref_features *f)
{
    return f ? f : &no_features;
}

static int yarn_on(const mla_ref_config *cfg)
{
    return cfg->yarn_factor > 1.0;
}

mla_ref_rope_type mla_ref_rope_type_of(const mla_ref_config *cfg, const mla_ref_features *f)
{
    f = features_or_none(f);
    if (f->rope_type == MLA_REF_ROPE_AUTO)
        return yarn_on(cfg) ? MLA_REF_ROPE_YARN : MLA_REF_ROPE_DEFAULT;
    return f->rope_type;
}

/* g(s, m) = 1 if s <= 1 else 0.1 * m * ln(s) + 1 */
static double yarn_g(double s, double m)
{
    if (s <= 1.0)
        return 1.0;
    return 0.1 * m * log(s) + 1.0;
}

/* cd(r) = dr * ln(L / (2 pi r)) / (2 ln theta) */
static double yarn_correction_dim(const mla_ref_config *cfg, double r)
{
    return (double)cfg->rope_dim * log(cfg->yarn_original_max_pos / (2.0 * M_PI * r)) /
           (2.0 * log(cfg->rope_theta));
}

void mla_ref_yarn_bounds_ext(const mla_ref_config *cfg, const mla_ref_features *f, double *low, double *high)
{
    f = features_or_none(f);
    double lo = yarn_correction_dim(cfg, cfg->yarn_beta_fast);
    double hi = yarn_correction_dim(cfg, cfg->yarn_beta_slow);
    if (!f->yarn_no_truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    if (lo < 0.0)
        lo = 0.0;
    if (hi > (double)(cfg->rope_dim - 1))
        hi = (double)(cfg->rope_dim - 1);
    if (lo == hi)
        hi += 0.001;
    *low = lo;
    *high = hi;
}

void mla_ref_yarn_bounds(const mla_ref_config *cfg, double *low, double *high)
{
    mla_ref_yarn_bounds_ext(cfg, NULL, low, high);
}

int mla_ref_longrope_long(const mla_ref_config *cfg, const mla_ref_features *f, long step_last_pos)
{
    f = features_or_none(f);
    if (mla_ref_rope_type_of(cfg, f) != MLA_REF_ROPE_LONGROPE)
        return 0;
    return (double)step_last_pos + 1.0 > f->longrope_original_max_pos;
}

/* The factor s by which a type scales frequencies (its g(s, mscale_all_dim) enters tau); 0 for the
   types that have none (DEFAULT, NONE). */
static double rope_factor(const mla_ref_config *cfg, const mla_ref_features *f, mla_ref_rope_type type)
{
    switch (type) {
    case MLA_REF_ROPE_LINEAR:
        return f->linear_factor;
    case MLA_REF_ROPE_YARN:
        return cfg->yarn_factor;
    case MLA_REF_ROPE_LONGROPE:
        return f->longrope_factor;
    case MLA_REF_ROPE_LLAMA3:
        return f->llama3_factor;
    default:
        return 0.0;
    }
}

/* f_i of pair i for the resolved type. low / high (YaRN's ramp bounds) are read only for YARN,
   use_long (LongRoPE's choice for the step) only for LONGROPE. */
static double rope_inv_freq(const mla_ref_config *cfg, const mla_ref_features *f, mla_ref_rope_type type, int i,
                            double low, double high, int use_long)
{
    const double f0 = pow(cfg->rope_theta, -2.0 * (double)i / (double)cfg->rope_dim); /* theta^(-2i/dr) */
    switch (type) {
    case MLA_REF_ROPE_DEFAULT:
        return f0;
    case MLA_REF_ROPE_LINEAR:
        return f0 / f->linear_factor;
    case MLA_REF_ROPE_YARN: {
        /* f0 * (1 - ramp + ramp / s), ramp = clamp((i - low) / (high - low), 0, 1) */
        double ramp = ((double)i - low) / (high - low);
        if (ramp < 0.0)
            ramp = 0.0;
        if (ramp > 1.0)
            ramp = 1.0;
        return f0 * (1.0 - ramp + ramp / cfg->yarn_factor);
    }
    case MLA_REF_ROPE_LONGROPE:
        return f0 / (use_long ? f->longrope_long_factor[i] : f->longrope_short_factor[i]);
    case MLA_REF_ROPE_LLAMA3: {
        const double s = f->llama3_factor, lo = f->llama3_low_freq_factor, hi = f->llama3_high_freq_factor;
        const double L = f->llama3_original_max_pos;
        const double wavelength = 2.0 * M_PI / f0;
        if (wavelength < L / hi) /* high frequencies: kept */
            return f0;
        if (wavelength > L / lo) /* low frequencies: interpolated by s */
            return f0 / s;
        const double a = (L / wavelength - lo) / (hi - lo); /* in between: a blend */
        return (1.0 - a) * f0 / s + a * f0;
    }
    default: /* NONE: no rotation */
        return 0.0;
    }
}

/* A: the attention factor when given (YaRN, LongRoPE), else the type's rule. */
static double rope_amplitude(const mla_ref_config *cfg, const mla_ref_features *f, mla_ref_rope_type type)
{
    if (type == MLA_REF_ROPE_YARN) {
        if (f->rope_attention_factor > 0.0)
            return f->rope_attention_factor;
        /* g(s, mscale) / g(s, mscale_all_dim) */
        return yarn_g(cfg->yarn_factor, cfg->yarn_mscale) / yarn_g(cfg->yarn_factor, cfg->yarn_mscale_all_dim);
    }
    if (type == MLA_REF_ROPE_LONGROPE) {
        if (f->rope_attention_factor > 0.0)
            return f->rope_attention_factor;
        const double s = f->longrope_factor;
        if (s <= 1.0)
            return 1.0;
        return sqrt(1.0 + log(s) / log(f->longrope_original_max_pos)); /* sqrt(1 + ln s / ln L) */
    }
    return 1.0;
}

void mla_ref_rope_tables_ext(const mla_ref_config *cfg, const mla_ref_features *f, long step_last_pos,
                             double *inv_freq /* [dr/2] */, double *amplitude)
{
    f = features_or_none(f);
    const mla_ref_rope_type type = mla_ref_rope_type_of(cfg, f);
    double low = 0.0, high = 1.0;
    if (type == MLA_REF_ROPE_YARN)
        mla_ref_yarn_bounds_ext(cfg, f, &low, &high);
    const int use_long = mla_ref_longrope_long(cfg, f, step_last_pos);
    for (int i = 0; i < cfg->rope_dim / 2; i++)
        inv_freq[i] = rope_inv_freq(cfg, f, type, i, low, high, use_long);
    if (amplitude)
        *amplitude = rope_amplitude(cfg, f, type);
}

void mla_ref_rope_tables(const mla_ref_config *cfg, double *inv_freq /* [dr/2] */, double *amplitude)
{
    mla_ref_rope_tables_ext(cfg, NULL, 0, inv_freq, amplitude);
}

double mla_ref_softmax_scale_ext(const mla_ref_config *cfg, const mla_ref_features *f)
{
    f = features_or_none(f);
    const double dq = (double)(cfg->nope_dim + cfg->rope_dim);
    double tau = 1.0 / sqrt(dq);
    const double s = rope_factor(cfg, f, mla_ref_rope_type_of(cfg, f));
    if (s > 0.0) {
        const double g = yarn_g(s, cfg->yarn_mscale_all_dim);
        tau *= g * g;
    }
    return tau;
}

double mla_ref_softmax_scale(const mla_ref_config *cfg)
{
    return mla_ref_softmax_scale_ext(cfg, NULL);
}

double mla_ref_query_scale(const mla_ref_features *f, long pos)
{
    f = features_or_none(f);
    if (f->query_scale_beta == 0.0)
        return 1.0;
    /* m(p) = 1 + beta * ln(1 + floor(p / interval)), p >= 0 */
    const long block = pos / f->query_scale_interval;
    return 1.0 + f->query_scale_beta * log(1.0 + (double)block);
}

/* Rotate pair (a, b) by angle pos * f, scaled by amplitude A:
   a' = A (a cos - b sin), b' = A (a sin + b cos). The angle is formed in double. */
static void rotate_pair(double *a, double *b, double f, double amplitude, long pos)
{
    const double angle = (double)pos * f;
    const double c = cos(angle) * amplitude;
    const double s = sin(angle) * amplitude;
    const double x0 = *a, x1 = *b;
    *a = x0 * c - x1 * s;
    *b = x0 * s + x1 * c;
}

/* Pair i is (x[2i], x[2i+1]) when interleaved, (x[i], x[i + dr/2]) when half split. */
static void rope_pair_indices(int dr, int half_split, int i, int *ia, int *ib)
{
    *ia = half_split ? i : 2 * i;
    *ib = half_split ? i + dr / 2 : 2 * i + 1;
}

/* RoPE with precomputed tables (used by the forward pass). */
static void rope_rotate(int dr, int half_split, const double *inv_freq /* [dr/2] */,
                        double amplitude, double *x /* [dr] */, long pos)
{
    for (int i = 0; i < dr / 2; i++) {
        int ia, ib;
        rope_pair_indices(dr, half_split, i, &ia, &ib);
        rotate_pair(&x[ia], &x[ib], inv_freq[i], amplitude, pos);
    }
}

void mla_ref_rope_apply_ext(const mla_ref_config *cfg, const mla_ref_features *f, double *x /* [dr] */, long pos,
                            long step_last_pos)
{
    f = features_or_none(f);
    const mla_ref_rope_type type = mla_ref_rope_type_of(cfg, f);
    if (type == MLA_REF_ROPE_NONE)
        return; /* the rope dims are used as they are */
    double low = 0.0, high = 1.0;
    if (type == MLA_REF_ROPE_YARN)
        mla_ref_yarn_bounds_ext(cfg, f, &low, &high);
    const int use_long = mla_ref_longrope_long(cfg, f, step_last_pos);
    const double amplitude = rope_amplitude(cfg, f, type);
    for (int i = 0; i < cfg->rope_dim / 2; i++) {
        int ia, ib;
        rope_pair_indices(cfg->rope_dim, cfg->rope_half_split, i, &ia, &ib);
        rotate_pair(&x[ia], &x[ib], rope_inv_freq(cfg, f, type, i, low, high, use_long), amplitude, pos);
    }
}

void mla_ref_rope_apply(const mla_ref_config *cfg, double *x /* [dr] */, long pos)
{
    mla_ref_rope_apply_ext(cfg, NULL, x, pos, pos);
}

/* ------------------------------------------------------------------------------------------ */
/* Attention kernels                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* Latent attention of every head over `count` keys: key i is indices[i] (a row of ckv and kr; one
   outside [0, n_keys) is no key, one listed twice counts twice) or, with indices NULL, i. `any`:
   whether any key counts (else latent 0 and lse -infinity). */
static void latent_attention(int heads, size_t rkv, size_t dr, double scale, int n_keys, const int *indices, int count,
                             int any, const double *q_tilde, const double *q_rope, const double *ckv, const double *kr,
                             double *latent_out, double *lse_out)
{
    for (int h = 0; h < heads; h++) {
        const double *qt = q_tilde + (size_t)h * rkv; /* [rkv] */
        const double *qr = q_rope + (size_t)h * dr;   /* [dr] */
        double *lat = latent_out + (size_t)h * rkv;   /* [rkv] */

        for (size_t r = 0; r < rkv; r++)
            lat[r] = 0.0;
        if (!any) {
            lse_out[h] = -INFINITY;
            continue;
        }

        /* Pass 1: the maximum score, for a numerically stable softmax. */
        double m = -INFINITY;
        for (int i = 0; i < count; i++) {
            const int j = indices ? indices[i] : i;
            if (j < 0 || j >= n_keys)
                continue; /* no key */
            const double s = scale * (dot_dd(qt, ckv + (size_t)j * rkv, rkv) +
                                      dot_dd(qr, kr + (size_t)j * dr, dr));
            if (s > m)
                m = s;
        }

        /* Pass 2: recompute each score, weight exp(s - m), accumulate the weighted latents. */
        double sum = 0.0;
        for (int i = 0; i < count; i++) {
            const int j = indices ? indices[i] : i;
            if (j < 0 || j >= n_keys)
                continue;
            const double *c = ckv + (size_t)j * rkv; /* [rkv] */
            const double s = scale * (dot_dd(qt, c, rkv) + dot_dd(qr, kr + (size_t)j * dr, dr));
            const double e = exp(s - m);
            sum += e;
            for (size_t r = 0; r < rkv; r++)
                lat[r] += e * c[r];
        }
        for (size_t r = 0; r < rkv; r++)
            lat[r] /= sum;
        lse_out[h] = m + log(sum);
    }
}

void mla_ref_latent_attention(int heads, int kv_lora_rank, int rope_dim, double scale, int n_keys,
                              const double *q_tilde /* [H, rkv] */, const double *q_rope /* [H, dr] */,
                              const double *ckv /* [n_keys, rkv] */, const double *kr /* [n_keys, dr] */,
                              double *latent_out /* [H, rkv] */, double *lse_out /* [H] */)
{
    latent_attention(heads, (size_t)kv_lora_rank, (size_t)rope_dim, scale, n_keys, NULL, n_keys, n_keys > 0, q_tilde,
                     q_rope, ckv, kr, latent_out, lse_out);
}

int mla_ref_sparse_latent_attention(int heads, int kv_lora_rank, int rope_dim, double scale, int n_keys,
                                    const int *indices /* [topk] */, int topk,
                                    const double *q_tilde /* [H, rkv] */, const double *q_rope /* [H, dr] */,
                                    const double *ckv /* [n_keys, rkv] */, const double *kr /* [n_keys, dr] */,
                                    double *latent_out /* [H, rkv] */, double *lse_out /* [H] */)
{
    int valid = 0;
    for (int i = 0; i < topk; i++)
        if (indices[i] >= 0 && indices[i] < n_keys)
            valid++;
    latent_attention(heads, (size_t)kv_lora_rank, (size_t)rope_dim, scale, n_keys, indices, topk, valid > 0, q_tilde,
                     q_rope, ckv, kr, latent_out, lse_out);
    return valid;
}

/* ------------------------------------------------------------------------------------------ */
/* Full forward pass                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* out[0..width) = sum over j < n of p[j] * rows[j][0..width), summed in the order of j. */
static void weighted_sum(double *out, const double *p, size_t n, const double *rows, size_t width)
{
    for (size_t i = 0; i < width; i++)
        out[i] = 0.0;
    for (size_t j = 0; j < n; j++)
        for (size_t i = 0; i < width; i++)
            out[i] += p[j] * rows[j * width + i];
}

/* malloc of a * b doubles (at least one), NULL on overflow or failure. */
static double *alloc_doubles(size_t a, size_t b)
{
    if (b != 0 && a > SIZE_MAX / b)
        return NULL;
    size_t n = a * b;
    if (n == 0)
        n = 1;
    if (n > SIZE_MAX / sizeof(double))
        return NULL;
    return malloc(n * sizeof(double));
}

static int config_ok(const mla_ref_config *cfg, const mla_ref_features *f)
{
    if (cfg->hidden < 1 || cfg->heads < 1 || cfg->q_lora_rank < 0 || cfg->kv_lora_rank < 1)
        return 0;
    if (cfg->nope_dim < 0 || cfg->rope_dim < 0 || (cfg->rope_dim & 1) != 0 || cfg->v_dim < 1)
        return 0;
    if (cfg->nope_dim + cfg->rope_dim < 1)
        return 0;
    if (!(cfg->rms_eps >= 0.0))
        return 0;
    if (cfg->rope_half_split != 0 && cfg->rope_half_split != 1)
        return 0;
    if (f->rope_type < MLA_REF_ROPE_AUTO || f->rope_type > MLA_REF_ROPE_NONE)
        return 0;
    const mla_ref_rope_type type = mla_ref_rope_type_of(cfg, f);
    if (cfg->rope_dim > 0 && type != MLA_REF_ROPE_NONE && !(cfg->rope_theta > 1.0))
        return 0;
    if (!(f->rope_attention_factor >= 0.0) || !isfinite(f->rope_attention_factor))
        return 0;
    if (cfg->rope_dim > 0) {
        switch (type) {
        case MLA_REF_ROPE_LINEAR:
            if (!(f->linear_factor > 0.0))
                return 0;
            break;
        case MLA_REF_ROPE_YARN:
            if (!(cfg->yarn_factor > 0.0) || !(cfg->yarn_original_max_pos > 0.0) || !(cfg->yarn_beta_fast > 0.0) ||
                !(cfg->yarn_beta_slow > 0.0))
                return 0;
            break;
        case MLA_REF_ROPE_LONGROPE:
            if (!f->longrope_short_factor || !f->longrope_long_factor || !(f->longrope_original_max_pos >= 1.0))
                return 0;
            for (int i = 0; i < cfg->rope_dim / 2; i++)
                if (!(f->longrope_short_factor[i] > 0.0) || !(f->longrope_long_factor[i] > 0.0) ||
                    !isfinite(f->longrope_short_factor[i]) || !isfinite(f->longrope_long_factor[i]))
                    return 0;
            /* A = sqrt(1 + ln s / ln L) needs ln L > 0 */
            if (f->longrope_factor > 1.0 && f->rope_attention_factor == 0.0 && !(f->longrope_original_max_pos > 1.0))
                return 0;
            break;
        case MLA_REF_ROPE_LLAMA3:
            if (!(f->llama3_factor > 0.0) || !(f->llama3_low_freq_factor > 0.0) ||
                !(f->llama3_high_freq_factor > f->llama3_low_freq_factor) || !(f->llama3_original_max_pos > 0.0))
                return 0;
            break;
        default:
            break;
        }
    }
    if (f->query_scale_beta != 0.0 && (!isfinite(f->query_scale_beta) || f->query_scale_interval < 1))
        return 0;
    if (!isfinite(f->q_latent_scale) || !isfinite(f->kv_latent_scale))
        return 0;
    if (f->cache_type < MLA_REF_CACHE_F32 || f->cache_type > MLA_REF_CACHE_FP8 ||
        (f->cache_type == MLA_REF_CACHE_FP8 && cfg->kv_lora_rank % 128 != 0))
        return 0;
    return 1;
}

static int weights_ok(const mla_ref_config *cfg, const mla_ref_features *f, const mla_ref_weights *w)
{
    if (cfg->q_lora_rank > 0) {
        if (!w->q_a_proj || !w->q_a_layernorm || !w->q_b_proj)
            return 0;
    } else if (!w->q_proj || f->q_a_proj_bias) {
        return 0; /* q_proj has no bias */
    }
    return w->kv_a_proj_with_mqa && w->kv_a_layernorm && w->kv_b_proj && w->o_proj;
}

/* y += b for a float32 bias b [n]; nothing when b is NULL. */
static void add_bias(double *y /* [n] */, const float *b /* [n] or NULL */, size_t n)
{
    if (!b)
        return;
    for (size_t i = 0; i < n; i++)
        y[i] += (double)b[i];
}

/* x *= s for n values (s = 1 leaves x bitwise unchanged). */
static void scale_by(double *x /* [n] */, size_t n, double s)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

int mla_ref_forward(const mla_ref_config *cfg, const mla_ref_weights *w, int T,
                    const float *x /* [T, D] */, int path, double *out /* [T, D] */,
                    double *ckv_out, double *kr_out, double *q_tilde_out, double *q_rope_out,
                    double *latent_out, double *lse_out)
{
    return mla_ref_forward_ext(cfg, NULL, w, T, x, NULL, 0, path, out, ckv_out, kr_out, q_tilde_out, q_rope_out,
                               latent_out, lse_out);
}

int mla_ref_forward_ext(const mla_ref_config *cfg, const mla_ref_features *f, const mla_ref_weights *w, int T,
                        const float *x /* [T, D] */, const int *step_tokens /* [num_steps] */, int num_steps,
                        int path, double *out /* [T, D] */, double *ckv_out, double *kr_out, double *q_tilde_out,
                        double *q_rope_out, double *latent_out, double *lse_out)
{
    if (!cfg || !w || !x || !out || T < 1)
        return -1;
    if (path != MLA_REF_ABSORBED && path != MLA_REF_DECOMPRESSED)
        return -1;
    f = features_or_none(f);
    if (!config_ok(cfg, f) || !weights_ok(cfg, f, w))
        return -1;
    /* The steps: step_tokens[k] >= 1 tokens each, T in all; none given = one step of T. */
    const int whole[1] = {T};
    if (!step_tokens || num_steps == 0) {
        step_tokens = whole;
        num_steps = 1;
    }
    if (num_steps < 1)
        return -1;
    long total = 0;
    for (int k = 0; k < num_steps; k++) {
        if (step_tokens[k] < 1)
            return -1;
        total += step_tokens[k];
    }
    if (total != (long)T)
        return -1;

    const size_t D = (size_t)cfg->hidden;
    const size_t H = (size_t)cfg->heads;
    const size_t rq = (size_t)cfg->q_lora_rank;
    const size_t rkv = (size_t)cfg->kv_lora_rank;
    const size_t dn = (size_t)cfg->nope_dim;
    const size_t dr = (size_t)cfg->rope_dim;
    const size_t dv = (size_t)cfg->v_dim;
    const size_t dq = dn + dr;
    const size_t nT = (size_t)T;
    const double tau = mla_ref_softmax_scale_ext(cfg, f);
    const int rotate = mla_ref_rope_type_of(cfg, f) != MLA_REF_ROPE_NONE;
    const double sq = f->q_latent_scale == 0.0 ? 1.0 : f->q_latent_scale;    /* LongCat-Flash's sq */
    const double skv = f->kv_latent_scale == 0.0 ? 1.0 : f->kv_latent_scale; /* and skv */

    /* Working buffers (alloc_doubles never returns a zero-size block). */
    double *hx = alloc_doubles(D, 1);            /* [D] one input token */
    double *cq = alloc_doubles(rq, 1);           /* [rq] query latent */
    double *q = alloc_doubles(nT * H, dq);       /* [T, H, dq] q^C | q^R (after RoPE and m(p)) */
    double *kv = alloc_doubles(rkv + dr, 1);     /* [rkv+dr] kv_a output of one token */
    double *ckv = alloc_doubles(nT, rkv);        /* [T, rkv] c^KV after RMSNorm */
    double *kr = alloc_doubles(nT, dr);          /* [T, dr] k^R after RoPE */
    double *o = alloc_doubles(nT * H, dv);       /* [T, H*dv] per-head attention outputs */
    double *inv_freq = alloc_doubles(dr / 2, 1); /* [dr/2] */
    double *qt = alloc_doubles(H, rkv);          /* [H, rkv] q-tilde of one token */
    double *qr = alloc_doubles(H, dr);           /* [H, dr] q^R of one token */
    double *lat = alloc_doubles(H, rkv);         /* [H, rkv] o-bar of one token */
    double *lse = alloc_doubles(H, 1);           /* [H] lse of one token */
    double *kc = alloc_doubles(nT, dn);          /* [T, dn] k^C of one head */
    double *vc = alloc_doubles(nT, dv);          /* [T, dv] v^C of one head */
    double *p = alloc_doubles(nT, 1);            /* [T] scores, then probabilities */
    int rc = -1;
    if (!hx || !cq || !q || !kv || !ckv || !kr || !o || !inv_freq || !qt || !qr || !lat || !lse ||
        !kc || !vc || !p)
        goto done;

    /* Phase 1: per-token projections (section 2), step by step: the RoPE tables of a step depend
       on its last position (LongRoPE's short or long factors). */
    for (size_t k = 0, t = 0; k < (size_t)num_steps; k++) {
        const size_t step_end = t + (size_t)step_tokens[k];
        double amplitude = 1.0;
        if (dr > 0)
            mla_ref_rope_tables_ext(cfg, f, (long)step_end - 1, inv_freq, &amplitude);

        for (; t < step_end; t++) {
            for (size_t i = 0; i < D; i++)
                hx[i] = (double)x[t * D + i];

            double *q_tok = q + t * H * dq; /* [H, dq] */
            if (rq > 0) {
                matvec(w->q_a_proj, rq, D, hx, cq);
                add_bias(cq, f->q_a_proj_bias, rq);
                rmsnorm(cq, w->q_a_layernorm, rq, cfg->rms_eps);
                scale_by(cq, rq, sq);
                matvec(w->q_b_proj, H * dq, rq, cq, q_tok);
            } else {
                matvec(w->q_proj, H * dq, D, hx, q_tok);
            }
            if (rotate)
                for (size_t h = 0; h < H; h++)
                    rope_rotate((int)dr, cfg->rope_half_split, inv_freq, amplitude, q_tok + h * dq + dn, (long)t);
            scale_by(q_tok, H * dq, mla_ref_query_scale(f, (long)t)); /* q_h = m(p) [q^C_h ; q^R_h] */

            matvec(w->kv_a_proj_with_mqa, rkv + dr, D, hx, kv);
            add_bias(kv, f->kv_a_proj_with_mqa_bias, rkv + dr);
            rmsnorm(kv, w->kv_a_layernorm, rkv, cfg->rms_eps);
            scale_by(kv, rkv, skv);
            if (rotate)
                rope_rotate((int)dr, cfg->rope_half_split, inv_freq, amplitude, kv + rkv, (long)t);
            mla_ref_round_cache_row(f->cache_type, kv, (int)rkv, kv + rkv, (int)dr);
            if (f->stored_ckv)
                for (size_t i = 0; i < rkv; i++)
                    kv[i] = (double)f->stored_ckv[t * rkv + i];
            if (f->stored_kr)
                for (size_t i = 0; i < dr; i++)
                    kv[rkv + i] = (double)f->stored_kr[t * dr + i];
            memcpy(ckv + t * rkv, kv, rkv * sizeof(double));
            if (dr > 0)
                memcpy(kr + t * dr, kv + rkv, dr * sizeof(double));
        }
    }

    /* Phase 2: attention (section 5). */
    for (size_t t = 0; t < nT; t++) {
        /* The absorbed query q~_h = (W^UK_h)^T q^C_h, and q^R of this token as [H, dr]. */
        for (size_t h = 0; h < H; h++) {
            const float *w_uk = w->kv_b_proj + h * (dn + dv) * rkv; /* [dn, rkv] */
            matvec_t(w_uk, dn, rkv, q + (t * H + h) * dq, qt + h * rkv);
            if (dr > 0)
                memcpy(qr + h * dr, q + (t * H + h) * dq + dn, dr * sizeof(double));
        }
        if (q_tilde_out)
            memcpy(q_tilde_out + t * H * rkv, qt, H * rkv * sizeof(double));
        if (q_rope_out && dr > 0)
            memcpy(q_rope_out + t * H * dr, qr, H * dr * sizeof(double));

        if (path == MLA_REF_ABSORBED) {
            /* Attention in latent space over keys 0..t, then o_h = W^UV_h o-bar_h. */
            mla_ref_latent_attention((int)H, (int)rkv, (int)dr, tau, (int)t + 1, qt, qr, ckv, kr,
                                     lat, lse);
            for (size_t h = 0; h < H; h++) {
                const float *w_uv = w->kv_b_proj + (h * (dn + dv) + dn) * rkv; /* [dv, rkv] */
                matvec(w_uv, dv, rkv, lat + h * rkv, o + (t * H + h) * dv);
            }
            if (latent_out)
                memcpy(latent_out + t * H * rkv, lat, H * rkv * sizeof(double));
            if (lse_out)
                memcpy(lse_out + t * H, lse, H * sizeof(double));
        }
    }

    if (path == MLA_REF_DECOMPRESSED) {
        /* Head by head: up-project k^C = W^UK_h c^KV_j and v^C = W^UV_h c^KV_j for every token,
           then ordinary causal attention with head dims dq (keys) and dv (values). */
        for (size_t h = 0; h < H; h++) {
            const float *w_uk = w->kv_b_proj + h * (dn + dv) * rkv;        /* [dn, rkv] */
            const float *w_uv = w->kv_b_proj + (h * (dn + dv) + dn) * rkv; /* [dv, rkv] */
            for (size_t j = 0; j < nT; j++) {
                matvec(w_uk, dn, rkv, ckv + j * rkv, kc + j * dn);
                matvec(w_uv, dv, rkv, ckv + j * rkv, vc + j * dv);
            }
            for (size_t t = 0; t < nT; t++) {
                const double *qc_th = q + (t * H + h) * dq;      /* [dn] */
                const double *qr_th = q + (t * H + h) * dq + dn; /* [dr] */
                double m = -INFINITY;
                for (size_t j = 0; j <= t; j++) {
                    p[j] = tau * (dot_dd(qc_th, kc + j * dn, dn) + dot_dd(qr_th, kr + j * dr, dr));
                    if (p[j] > m)
                        m = p[j];
                }
                double sum = 0.0;
                for (size_t j = 0; j <= t; j++) {
                    p[j] = exp(p[j] - m);
                    sum += p[j];
                }
                for (size_t j = 0; j <= t; j++)
                    p[j] /= sum;

                weighted_sum(o + (t * H + h) * dv, p, t + 1, vc, dv);
                if (lse_out)
                    lse_out[t * H + h] = m + log(sum);
                if (latent_out)
                    weighted_sum(latent_out + (t * H + h) * rkv, p, t + 1, ckv, rkv);
            }
        }
    }

    /* Phase 3: u = W^O [o_1; ...; o_H] (+ its bias). */
    for (size_t t = 0; t < nT; t++) {
        matvec(w->o_proj, D, H * dv, o + t * H * dv, out + t * D);
        add_bias(out + t * D, f->o_proj_bias, D);
    }

    if (ckv_out)
        memcpy(ckv_out, ckv, nT * rkv * sizeof(double));
    if (kr_out && dr > 0)
        memcpy(kr_out, kr, nT * dr * sizeof(double));
    rc = 0;

done:
    free(hx);
    free(cq);
    free(q);
    free(kv);
    free(ckv);
    free(kr);
    free(o);
    free(inv_freq);
    free(qt);
    free(qr);
    free(lat);
    free(lse);
    free(kc);
    free(vc);
    free(p);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Comparison helper                                                                           */
/* ------------------------------------------------------------------------------------------ */

double mla_ref_max_rel_err(const float *got, const double *want, size_t n, size_t *worst_index)
{
    double max_diff = 0.0, max_ref = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        if (!isfinite(d)) {
            if (worst_index)
                *worst_index = i;
            return INFINITY;
        }
        if (d > max_diff) {
            max_diff = d;
            worst = i;
        }
        const double a = fabs(want[i]);
        if (a > max_ref)
            max_ref = a;
    }
    if (worst_index)
        *worst_index = worst;
    return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}
