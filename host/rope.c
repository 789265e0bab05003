#include "rope.h"

#include <math.h>

#define PI 3.14159265358979323846

clmla_layer_config clmla_config_resolved(const clmla_layer_config *c)
{
    clmla_layer_config r = *c;
    if (r.rms_norm_eps == 0)
        r.rms_norm_eps = 1e-6;
    if (r.rope_theta == 0)
        r.rope_theta = 10000.0;
    if (r.yarn_original_max_position == 0)
        r.yarn_original_max_position = 4096;
    if (r.yarn_beta_fast == 0)
        r.yarn_beta_fast = 32.0;
    if (r.yarn_beta_slow == 0)
        r.yarn_beta_slow = 1.0;
    return r;
}

static double yarn_mscale(double s, double m)
{
    return s <= 1.0 ? 1.0 : 0.1 * m * log(s) + 1.0;
}

/* The dimension index whose wavelength makes `rotations` turns over the original context. */
static double correction_dim(const clmla_layer_config *c, double rotations)
{
    return c->qk_rope_head_dim * log(c->yarn_original_max_position / (2.0 * PI * rotations)) / (2.0 * log(c->rope_theta));
}

void clmla_rope_inv_freq(const clmla_layer_config *c, double *inv_freq, double *amplitude)
{
    const int half = c->qk_rope_head_dim / 2;
    const int yarn = c->yarn_factor > 1.0;
    double low = 0, high = 0;
    if (yarn) {
        low = floor(correction_dim(c, c->yarn_beta_fast));
        if (low < 0)
            low = 0;
        high = ceil(correction_dim(c, c->yarn_beta_slow));
        if (high > c->qk_rope_head_dim - 1)
            high = c->qk_rope_head_dim - 1;
        if (low == high)
            high += 0.001;
    }
    for (int i = 0; i < half; i++) {
        double f = pow(c->rope_theta, -2.0 * i / c->qk_rope_head_dim);
        if (yarn) {
            double ramp = (i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            f *= 1.0 - ramp + ramp / c->yarn_factor;
        }
        inv_freq[i] = f;
    }
    *amplitude = yarn ? yarn_mscale(c->yarn_factor, c->yarn_mscale) / yarn_mscale(c->yarn_factor, c->yarn_mscale_all_dim) : 1.0;
}

void clmla_rope_fill_table(const clmla_layer_config *c, int first, int count, float *table)
{
    const int half = c->qk_rope_head_dim / 2;
    double inv_freq[512], amplitude; /* dr <= 1024 is enforced by validation */
    clmla_rope_inv_freq(c, inv_freq, &amplitude);
    for (int p = 0; p < count; p++)
        for (int i = 0; i < half; i++) {
            const double angle = (double)(first + p) * inv_freq[i];
            table[((size_t)p * half + i) * 2] = (float)(amplitude * cos(angle));
            table[((size_t)p * half + i) * 2 + 1] = (float)(amplitude * sin(angle));
        }
}

double clmla_layer_config_softmax_scale(const clmla_layer_config *config)
{
    if (!config)
        return 0.0;
    const clmla_layer_config c = clmla_config_resolved(config);
    double scale = 1.0 / sqrt((double)(c.qk_nope_head_dim + c.qk_rope_head_dim));
    if (c.yarn_factor > 1.0) {
        const double g = yarn_mscale(c.yarn_factor, c.yarn_mscale_all_dim);
        scale *= g * g;
    }
    return scale;
}
