/* Byte and FLOP counts, as docs/BENCHMARKS.md defines them ("Definitions"). A multiply-add is
   2 FLOPs. RMSNorm, RoPE, softmax exponentials and the split combine are not counted (they are
   O(tokens * H) against O(tokens * ctx * H) for the attention). bench/torch_baseline.py has the
   same formulas. */
#include "bench.h"

#include <math.h>

void bench_shape_from_config(bench_shape *s, const char *preset, const clmla_layer_config *config)
{
    s->config = *config;
    int i = 0;
    for (; preset[i] && i < (int)sizeof(s->preset) - 1; i++)
        s->preset[i] = preset[i];
    s->preset[i] = 0;
    s->D = config->hidden_size;
    s->H = config->num_heads;
    s->rq = config->q_lora_rank;
    s->rkv = config->kv_lora_rank;
    s->dn = config->qk_nope_head_dim;
    s->dr = config->qk_rope_head_dim;
    s->dv = config->v_head_dim;
    s->dq = s->dn + s->dr;
    s->row = s->rkv + s->dr;
    double tau = 0;
    clmla_layer_config_softmax_scale(config, &tau); /* the shapes clmla-bench runs are valid presets */
    s->scale = (float)tau;
}

/* All weights of one layer, float32 (docs/MLA.md section 1). */
double bench_weight_bytes(const bench_shape *s)
{
    const double D = s->D, H = s->H, rq = s->rq, rkv = s->rkv, dn = s->dn, dr = s->dr, dv = s->dv, dq = dn + dr;
    const double q = rq > 0 ? rq * D + rq + H * dq * rq : H * dq * D;
    return 4.0 * (q + (rkv + dr) * D + rkv + H * (dn + dv) * rkv + D * H * dv);
}

double bench_projection_flops(const bench_shape *s, int absorbed)
{
    const double D = s->D, H = s->H, rq = s->rq, rkv = s->rkv, dn = s->dn, dr = s->dr, dv = s->dv, dq = dn + dr;
    double f = (rq > 0 ? 2 * (D * rq + rq * H * dq) : 2 * D * H * dq) /* q */
               + 2 * D * (rkv + dr)                                    /* kv_a_proj_with_mqa */
               + 2 * H * dv * D;                                       /* o_proj */
    if (absorbed)
        f += 2 * H * dn * rkv   /* q~_h = W^UK_h^T q^C_h */
             + 2 * H * rkv * dv; /* o_h = W^UV_h o-bar_h */
    return f;
}

double bench_pair_flops(const bench_shape *s, int absorbed)
{
    const double H = s->H;
    return absorbed ? 2 * H * (2.0 * s->rkv + s->dr) : 2 * H * ((double)s->dq + s->dv);
}

double bench_upproject_flops(const bench_shape *s)
{
    return 2.0 * s->rkv * s->H * ((double)s->dn + s->dv);
}

double bench_mla_cache_bytes(const bench_shape *s, int batch, int ctx, clmla_cache_dtype dtype)
{
    /* a row as the library stores it (include/clmla.h): fp8 is rkv codes, a float32 scale per 128
       of them and dr bf16 values */
    const double row = dtype == CLMLA_CACHE_F32   ? 4.0 * s->row
                       : dtype == CLMLA_CACHE_FP8 ? s->rkv + 4.0 * (s->rkv / 128) + 2.0 * s->dr
                                                  : 2.0 * s->row;
    return (double)batch * ctx * row;
}

double bench_mha_cache_bytes(const bench_shape *s, int batch, int ctx, size_t elem)
{
    return (double)batch * ctx * s->H * ((double)s->dq + s->dv) * (double)elem;
}
