#include "rope.h"
#include "layer_config.h"
#include "internal.h"

#include <math.h>

#define PI 3.14159265358979323846

/* YaRN's g(s, m). */
static double yarn_mscale(double s, double m)
{
    return s <= 1.0 ? 1.0 : 0.1 * m * log(s) + 1.0;
}

/* The dimension index whose wavelength makes `rotations` turns over the original context. */
static double correction_dim(const clmla_layer_config *c, double rotations)
{
    return c->qk_rope_head_dim * log(c->yarn_original_max_position / (2.0 * PI * rotations)) / (2.0 * log(c->rope_theta));
}

static void yarn_range(const clmla_layer_config *c, double *low, double *high)
{
    double lo = correction_dim(c, c->yarn_beta_fast), hi = correction_dim(c, c->yarn_beta_slow);
    if (!c->yarn_no_truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    if (lo < 0)
        lo = 0;
    if (hi > c->qk_rope_head_dim - 1)
        hi = c->qk_rope_head_dim - 1;
    if (lo == hi)
        hi += 0.001;
    *low = lo;
    *high = hi;
}

static double llama3_inv_freq(const clmla_layer_config *c, double f)
{
    const double s = c->yarn_factor > 0 ? c->yarn_factor : 1.0, L = c->yarn_original_max_position;
    const double lo = c->llama3_low_freq_factor, hi = c->llama3_high_freq_factor;
    const double wavelen = 2.0 * PI / f;
    if (wavelen < L / hi)
        return f;
    if (wavelen > L / lo)
        return f / s;
    const double smooth = (L / wavelen - lo) / (hi - lo);
    return (1.0 - smooth) * f / s + smooth * f;
}

void clmla_rope_inv_freq(const clmla_layer_config *c, int long_factors, double *inv_freq, double *amplitude)
{
    const int half = c->qk_rope_head_dim / 2;
    const double s = c->yarn_factor;
    double low = 0, high = 0, A = 1.0;
    switch (c->rope_type) {
    case CLMLA_ROPE_TYPE_YARN:
        yarn_range(c, &low, &high);
        A = yarn_mscale(s, c->yarn_mscale) / yarn_mscale(s, c->yarn_mscale_all_dim);
        break;
    case CLMLA_ROPE_TYPE_LONGROPE:
        A = s <= 1.0 ? 1.0 : sqrt(1.0 + log(s) / log((double)c->yarn_original_max_position));
        break;
    default:
        break;
    }
    if (c->rope_attention_factor > 0)
        A = c->rope_attention_factor;
    for (int i = 0; i < half; i++) {
        double f = pow(c->rope_theta, -2.0 * i / c->qk_rope_head_dim);
        switch (c->rope_type) {
        case CLMLA_ROPE_TYPE_NONE:
            f = 0.0;
            break;
        case CLMLA_ROPE_TYPE_LINEAR:
            f /= s > 0 ? s : 1.0;
            break;
        case CLMLA_ROPE_TYPE_YARN:
            if (s > 0) {
                double ramp = (i - low) / (high - low);
                ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
                f *= 1.0 - ramp + ramp / s;
            }
            break;
        case CLMLA_ROPE_TYPE_LONGROPE:
            f /= long_factors ? c->longrope_long_factor[i] : c->longrope_short_factor[i];
            break;
        case CLMLA_ROPE_TYPE_LLAMA3:
            f = llama3_inv_freq(c, f);
            break;
        default:
            break;
        }
        inv_freq[i] = f;
    }
    *amplitude = A;
}

void clmla_rope_fill_table(const clmla_layer_config *c, int long_factors, int first, int count, float *table)
{
    const int half = c->qk_rope_head_dim / 2;
    double inv_freq[512], amplitude; /* dr <= 1024 is enforced by validation */
    clmla_rope_inv_freq(c, long_factors, inv_freq, &amplitude);
    for (int p = 0; p < count; p++)
        for (int i = 0; i < half; i++) {
            const double angle = (double)(first + p) * inv_freq[i];
            table[((size_t)p * half + i) * 2] = (float)(amplitude * cos(angle));
            table[((size_t)p * half + i) * 2 + 1] = (float)(amplitude * sin(angle));
        }
}

int clmla_rope_uses_long(const clmla_layer_config *c, long last)
{
    return c->rope_type == CLMLA_ROPE_TYPE_LONGROPE && last + 1 > (long)c->yarn_original_max_position;
}

double clmla_query_scale(const clmla_layer_config *c, long position)
{
    if (c->query_scale_beta == 0)
        return 1.0;
    return 1.0 + c->query_scale_beta * log(1.0 + floor((double)position / c->query_scale_interval));
}

double clmla_softmax_scale(const clmla_layer_config *config)
{
    const clmla_layer_config c = clmla_config_resolved(config);
    double scale = 1.0 / sqrt((double)(c.qk_nope_head_dim + c.qk_rope_head_dim));
    /* transformers' DeepSeek attention: any type but the default one, with mscale_all_dim set. */
    if (c.rope_type != CLMLA_ROPE_TYPE_DEFAULT && c.rope_type != CLMLA_ROPE_TYPE_NONE && c.yarn_mscale_all_dim != 0) {
        const double g = yarn_mscale(c.yarn_factor, c.yarn_mscale_all_dim);
        scale *= g * g;
    }
    return scale;
}

clmla_status clmla_layer_config_softmax_scale(const clmla_layer_config *config, double *scale)
{
    if (!config || !scale)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_config_softmax_scale: NULL argument");
    const clmla_status st = clmla_layer_config_validate(config);
    if (st != CLMLA_SUCCESS)
        return st;
    *scale = clmla_softmax_scale(config);
    return CLMLA_SUCCESS;
}
