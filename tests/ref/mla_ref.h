/*
 * mla_ref: plain-C float64 reference implementation of DeepSeek Multi-head Latent Attention.
 *
 * Written for clarity, not speed; used by the clmla test suite as the numerical ground truth.
 * The math contract is docs/MLA.md; section numbers below refer to it.
 *
 * Conventions:
 *   - Weights are float32 in checkpoint layout (docs/MLA.md section 1), row-major [out, in];
 *     a linear layer computes y = W x (y[i] = sum_j W[i*in + j] * x[j]).
 *   - Everything else (activations, norms, RoPE angles, softmax) is computed in double.
 *   - Shapes are written in comments next to every array pointer, outermost index first.
 *   - Notation: D hidden, H heads, rq q_lora_rank, rkv kv_lora_rank, dn nope dim, dr rope dim,
 *     dv value dim, dq = dn + dr.
 */
#ifndef MLA_REF_H
#define MLA_REF_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mla_ref_config {
    int hidden;          /* D */
    int heads;           /* H */
    int q_lora_rank;     /* rq; 0 = absent (q_proj used) */
    int kv_lora_rank;    /* rkv */
    int nope_dim;        /* dn */
    int rope_dim;        /* dr, even */
    int v_dim;           /* dv */
    double rms_eps;      /* used for both latent norms */
    double rope_theta;
    int rope_half_split; /* 0 = interleaved pairs (2i,2i+1) (DeepSeek default); 1 = (i, i+dr/2) */
    double yarn_factor;  /* s; <= 1.0 means YaRN off (plain RoPE, amplitude 1, scale dq^-1/2) */
    double yarn_original_max_pos; /* L */
    double yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
} mla_ref_config;

typedef struct mla_ref_weights {      /* checkpoint layout of docs/MLA.md section 1, row-major [out, in] */
    const float *q_a_proj;        /* [rq, D]       (NULL when rq == 0) */
    const float *q_a_layernorm;   /* [rq] */
    const float *q_b_proj;        /* [H*(dn+dr), rq] */
    const float *q_proj;          /* [H*(dn+dr), D] (used when rq == 0) */
    const float *kv_a_proj_with_mqa; /* [rkv+dr, D] */
    const float *kv_a_layernorm;  /* [rkv] */
    const float *kv_b_proj;       /* [H*(dn+dv), rkv] */
    const float *o_proj;          /* [D, H*dv] */
} mla_ref_weights;

enum { MLA_REF_ABSORBED = 0, MLA_REF_DECOMPRESSED = 1 };

/* YaRN ramp bounds of docs/MLA.md section 3, computed from theta, dr, L, beta_fast and beta_slow
   (regardless of whether YaRN is on):
     cd(r) = dr * ln(L / (2 pi r)) / (2 ln theta)
     low   = max(floor(cd(beta_fast)), 0);  high = min(ceil(cd(beta_slow)), dr - 1);
     if low == high: high += 0.001
   For DeepSeek-V2/V3 (dr=64, theta=1e4, L=4096, bf=32, bs=1): low = 10, high = 23. */
void mla_ref_yarn_bounds(const mla_ref_config *cfg, double *low, double *high);

/* inv_freq[i] (YaRN-corrected when on) for i < dr/2, and the cos/sin amplitude A. */
void mla_ref_rope_tables(const mla_ref_config *cfg, double *inv_freq /* [dr/2] */, double *amplitude);
double mla_ref_softmax_scale(const mla_ref_config *cfg);  /* tau of docs/MLA.md section 4 */
/* Rotate x (dr values) in place for absolute position pos, with the configured pairing and amplitude. Angle computed in double. */
void mla_ref_rope_apply(const mla_ref_config *cfg, double *x /* [dr] */, long pos);

/* One sequence of T tokens at positions 0..T-1, causal, through one attention layer.
   out: [T, D] attention output after o_proj. Optional (may be NULL): ckv_out [T, rkv] (c^KV after
   RMSNorm), kr_out [T, dr] (k^R after RoPE), q_tilde_out [T, H, rkv] (absorbed queries),
   q_rope_out [T, H, dr] (q^R after RoPE), latent_out [T, H, rkv] (o-bar of the absorbed path),
   lse_out [T, H] (natural-log log-sum-exp of the scaled scores).
   path selects absorbed or decompressed math (section 5). Returns 0, or -1 on bad arguments/alloc failure.

   With path == MLA_REF_DECOMPRESSED the scores and out come from the up-projected keys/values;
   q_tilde_out is still filled with (W^UK_h)^T q^C_h (not used for the scores), and latent_out
   with sum_j p_j c^KV_j using that path's softmax weights p_j, so both paths fill every output. */
int mla_ref_forward(const mla_ref_config *cfg, const mla_ref_weights *w, int T,
                    const float *x /* [T, D] */, int path, double *out /* [T, D] */,
                    double *ckv_out, double *kr_out, double *q_tilde_out, double *q_rope_out,
                    double *latent_out, double *lse_out);

/* Latent (absorbed) attention alone, as FlashMLA computes it, for one query token:
   scores_j = scale*(q_tilde_h . ckv_j + q_rope_h . kr_j) over keys j < n_keys;
   latent_out_h = softmax-weighted sum of ckv_j; lse_h = log(sum_j exp(scores_j)).
   With n_keys <= 0, latent_out is all zeros and lse_out is -INFINITY. */
void mla_ref_latent_attention(int heads, int kv_lora_rank, int rope_dim, double scale, int n_keys,
                              const double *q_tilde /* [H, rkv] */, const double *q_rope /* [H, dr] */,
                              const double *ckv /* [n_keys, rkv] */, const double *kr /* [n_keys, dr] */,
                              double *latent_out /* [H, rkv] */, double *lse_out /* [H] */);

/* Relative error max|a-b| / max|b| over n values, with the index of the worst element.
   worst_index may be NULL. If max|b| == 0 the absolute error max|a-b| is returned.
   A non-finite difference (NaN/Inf in either input) returns INFINITY with that index.
   n == 0 returns 0 with index 0. */
double mla_ref_max_rel_err(const float *got, const double *want, size_t n, size_t *worst_index);

#ifdef __cplusplus
}
#endif

#endif /* MLA_REF_H */
