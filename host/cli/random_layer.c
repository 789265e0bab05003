/* Random DeepSeek-shaped layers for clmla demo and clmla tune --kernels (random_layer.h). */
#include "random_layer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

float *cli_random_floats(size_t n, float scale, float bias, uint64_t *state)
{
    float *p = malloc(n * sizeof(float));
    if (!p)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = bias + scale * (2.0f * (float)(*state >> 40) / (float)(1 << 24) - 1.0f);
    }
    return p;
}

/* A copy of W [rows, cols] holding the values a layer keeping it in `held` computes with; NULL
   when out of memory (or when the reference refuses, which finite random weights never give it
   cause to). */
static float *rounded_copy(const float *w, int rows, int cols, clmla_dtype held)
{
    float *p = malloc((size_t)rows * (size_t)cols * sizeof(float));
    if (p) {
        memcpy(p, w, (size_t)rows * (size_t)cols * sizeof(float));
        if (mla_ref_round_weight((int)held, p, rows, cols) != 0) { /* clmla_dtype's numbering */
            free(p);
            p = NULL;
        }
    }
    return p;
}

void cli_random_layer_free(cli_random_layer *r)
{
    free(r->q_a);
    free(r->q_a_norm);
    free(r->q_b);
    free(r->q_proj);
    free(r->kv_a);
    free(r->kv_norm);
    free(r->kv_b);
    free(r->o_proj);
    for (int i = 0; i < 5; i++)
        free(r->rounded[i]);
    memset(r, 0, sizeof(*r));
}

int cli_random_layer_make(cli_random_layer *r, clmla_preset preset, clmla_weights_dtype want, uint64_t *state)
{
    memset(r, 0, sizeof(*r));
    clmla_layer_config *cfg = &r->cfg;
    clmla_layer_config_preset(preset, cfg);
    if (want == CLMLA_WEIGHTS_AS_GIVEN)
        want = CLMLA_WEIGHTS_F32;
    cfg->weights_dtype = want;
    r->held = clmla_weights_dtype_held(want, CLMLA_DTYPE_F32);
    const int D = cfg->hidden_size, H = cfg->num_heads, rq = cfg->q_lora_rank, rkv = cfg->kv_lora_rank,
              dn = cfg->qk_nope_head_dim, dr = cfg->qk_rope_head_dim, dv = cfg->v_head_dim, dq = dn + dr;
    if (rq > 0) {
        r->q_a = cli_random_floats((size_t)rq * D, 1.0f / sqrtf((float)D), 0, state);
        r->q_a_norm = cli_random_floats((size_t)rq, 0.1f, 1.0f, state);
        r->q_b = cli_random_floats((size_t)H * dq * rq, 1.0f / sqrtf((float)rq), 0, state);
    } else {
        r->q_proj = cli_random_floats((size_t)H * dq * D, 1.0f / sqrtf((float)D), 0, state);
    }
    r->kv_a = cli_random_floats((size_t)(rkv + dr) * D, 1.0f / sqrtf((float)D), 0, state);
    r->kv_norm = cli_random_floats((size_t)rkv, 0.1f, 1.0f, state);
    r->kv_b = cli_random_floats((size_t)H * (dn + dv) * rkv, 1.0f / sqrtf((float)rkv), 0, state);
    r->o_proj = cli_random_floats((size_t)D * H * dv, 1.0f / sqrtf((float)(H * dv)), 0, state);
    if ((rq > 0 ? !r->q_a || !r->q_a_norm || !r->q_b : !r->q_proj) || !r->kv_a || !r->kv_norm || !r->kv_b ||
        !r->o_proj) {
        cli_random_layer_free(r);
        return -1;
    }
    clmla_layer_weights *w = &r->w;
    if (rq > 0) {
        w->q_a_proj = clmla_tensor_2d(r->q_a, rq, D);
        w->q_a_layernorm = clmla_tensor_1d(r->q_a_norm, rq);
        w->q_b_proj = clmla_tensor_2d(r->q_b, (int64_t)H * dq, rq);
    } else {
        w->q_proj = clmla_tensor_2d(r->q_proj, (int64_t)H * dq, D);
    }
    w->kv_a_proj_with_mqa = clmla_tensor_2d(r->kv_a, rkv + dr, D);
    w->kv_a_layernorm = clmla_tensor_1d(r->kv_norm, rkv);
    w->kv_b_proj = clmla_tensor_2d(r->kv_b, (int64_t)H * (dn + dv), rkv);
    w->o_proj = clmla_tensor_2d(r->o_proj, D, (int64_t)H * dv);

    const mla_ref_config rcfg = {D,
                                 H,
                                 rq,
                                 rkv,
                                 dn,
                                 dr,
                                 dv,
                                 cfg->rms_norm_eps,
                                 cfg->rope_theta,
                                 cfg->rope_pairing == CLMLA_ROPE_HALF_SPLIT,
                                 cfg->yarn_factor,
                                 cfg->yarn_original_max_position,
                                 cfg->yarn_beta_fast,
                                 cfg->yarn_beta_slow,
                                 cfg->yarn_mscale,
                                 cfg->yarn_mscale_all_dim};
    r->rcfg = rcfg;
    const mla_ref_weights rw = {r->q_a, r->q_a_norm, r->q_b, r->q_proj, r->kv_a, r->kv_norm, r->kv_b, r->o_proj};
    r->rw = rw;
    r->rw_held = rw;
    if (r->held != CLMLA_DTYPE_F32) { /* the norms are not rounded: a layer keeps them in float32 */
        r->rounded[0] = rq > 0 ? rounded_copy(r->q_a, rq, D, r->held) : rounded_copy(r->q_proj, H * dq, D, r->held);
        r->rounded[1] = rounded_copy(r->kv_a, rkv + dr, D, r->held);
        r->rounded[2] = rounded_copy(r->kv_b, H * (dn + dv), rkv, r->held);
        r->rounded[3] = rounded_copy(r->o_proj, D, H * dv, r->held);
        r->rounded[4] = rq > 0 ? rounded_copy(r->q_b, H * dq, rq, r->held) : NULL;
        if (!r->rounded[0] || !r->rounded[1] || !r->rounded[2] || !r->rounded[3] || (rq > 0 && !r->rounded[4])) {
            cli_random_layer_free(r);
            return -1;
        }
        if (rq > 0) {
            r->rw_held.q_a_proj = r->rounded[0];
            r->rw_held.q_b_proj = r->rounded[4];
        } else {
            r->rw_held.q_proj = r->rounded[0];
        }
        r->rw_held.kv_a_proj_with_mqa = r->rounded[1];
        r->rw_held.kv_b_proj = r->rounded[2];
        r->rw_held.o_proj = r->rounded[3];
    }
    return 0;
}
