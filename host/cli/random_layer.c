/* Random DeepSeek-shaped layers for clmla demo, with the float64 reference's view of them (random_layer.h). */
#include "random_layer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    clmla_tuner_random_layer_free(&r->made);
    for (int i = 0; i < 5; i++)
        free(r->rounded[i]);
    memset(r, 0, sizeof(*r));
}

int cli_random_layer_make(cli_random_layer *r, clmla_preset preset, clmla_weights_dtype want, uint64_t *state)
{
    memset(r, 0, sizeof(*r));
    if (want == CLMLA_WEIGHTS_AS_GIVEN)
        want = CLMLA_WEIGHTS_F32;
    if (clmla_tuner_random_layer_make(NULL, &r->made, preset, want, state) != CLMLA_SUCCESS)
        return -1;
    const clmla_layer_config *cfg = &r->made.cfg;
    r->cfg = *cfg;
    r->w = r->made.w;
    r->held = clmla_weights_dtype_held(want, CLMLA_DTYPE_F32);
    const int D = cfg->hidden_size, H = cfg->num_heads, rq = cfg->q_lora_rank, rkv = cfg->kv_lora_rank,
              dn = cfg->qk_nope_head_dim, dr = cfg->qk_rope_head_dim, dv = cfg->v_head_dim, dq = dn + dr;
    float *const *d = r->made.data; /* q_a, q_a_norm, q_b, q_proj, kv_a, kv_norm, kv_b, o_proj */
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
    const mla_ref_weights rw = {d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]};
    r->rw = rw;
    r->rw_held = rw;
    if (r->held != CLMLA_DTYPE_F32) { /* the norms are not rounded: a layer keeps them in float32 */
        r->rounded[0] = rq > 0 ? rounded_copy(d[0], rq, D, r->held) : rounded_copy(d[3], H * dq, D, r->held);
        r->rounded[1] = rounded_copy(d[4], rkv + dr, D, r->held);
        r->rounded[2] = rounded_copy(d[6], H * (dn + dv), rkv, r->held);
        r->rounded[3] = rounded_copy(d[7], D, H * dv, r->held);
        r->rounded[4] = rq > 0 ? rounded_copy(d[2], H * dq, rq, r->held) : NULL;
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
