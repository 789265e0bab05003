/*
 * indexer_ref: plain-C float64 reference of DeepSeek Sparse Attention's lightning indexer and its
 * top-k selection (DeepSeek-V3.2, GLM-5).
 *
 * Written for clarity, not speed; the tests hold the library's indexer kernels to it. The math
 * contract is shared/design/DSA.md (sections 3, 4 and 6); section numbers below refer to it. The
 * unquantised ("defining formula") indexer: no Hadamard rotation, no FP8.
 *
 * Conventions, as in mla_ref.h:
 *   - Weights are float32 in checkpoint layout, row-major [out, in]: y = W x.
 *   - Everything else is computed in double.
 *   - Shapes are written next to every array pointer, outermost index first.
 *   - Notation: D hidden, rq q_lora_rank, H_I indexer heads, d_I indexer head dim, dr rope dims,
 *     K index_topk.
 */
#ifndef INDEXER_REF_H
#define INDEXER_REF_H

#include "mla_ref.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct idx_ref_config {
    int hidden;          /* D */
    int q_lora_rank;     /* rq: length of c^Q */
    int heads;           /* H_I (index_n_heads) */
    int head_dim;        /* d_I (index_head_dim) */
    int rope_dim;        /* dr, even, <= d_I: the rotated dims come FIRST in every indexer vector */
    int rope_interleave; /* 0: half-split pairs (i, i + dr/2) (deepseek_v32); 1: interleaved pairs
                            (2i, 2i+1) (glm_moe_dsa): DSA.md 3.2 */
    double norm_eps;     /* the key LayerNorm's eps; 0 means 1e-6 */
} idx_ref_config;

/* ---- RoPE --------------------------------------------------------------------------------------- */

/* cos and sin of the angles of position pos, c[i] = A cos(pos inv_freq[i]), s[i] = A sin(...), for
   i < dr/2, from MLA's RoPE frequencies and amplitude (mla_ref_rope_tables_ext: YaRN, the other
   rope types; f may be NULL). The indexer uses MLA's tables and positions (DSA.md 3.2); the angle is
   computed in double. dr is cfg->rope_dim. */
void idx_ref_rope_row(const mla_ref_config *cfg, const mla_ref_features *f, long pos, double *c /* [dr/2] */,
                      double *s /* [dr/2] */);

/* Rotates x[0 .. dr) in place with the given cos/sin row (idx_ref_rope_row, or any table):
   half-split: x'[i] = x[i] c - x[i+dr/2] s, x'[i+dr/2] = x[i] s + x[i+dr/2] c;
   interleaved: x'[2i] = x[2i] c - x[2i+1] s, x'[2i+1] = x[2i] s + x[2i+1] c. */
void idx_ref_rope(double *x /* [dr] */, int dr, int interleave, const double *c /* [dr/2] */,
                  const double *s /* [dr/2] */);

/* ---- the indexer's projections (DSA.md section 3) ------------------------------------------------- */

/* The index key of one token: k = W_k x, LayerNorm (mean, population variance, (k - mean) /
   sqrt(var + eps) * weight + bias), then RoPE on k[0 .. dr) with the cos/sin row of its position.
   Returns 0, or -1 on a bad argument. */
int idx_ref_key(const idx_ref_config *cfg, const float *wk /* [d_I, D] */, const float *norm_weight /* [d_I] */,
                const float *norm_bias /* [d_I] */, const float *x /* [D] */, const double *c /* [dr/2] */,
                const double *s /* [dr/2] */, double *k /* [d_I] */);

/* The queries of one token: q = W_q c^Q viewed [H_I, d_I], then RoPE on q_h[0 .. dr) of every head
   (rope first: DSA.md section 2), the rest unchanged. Returns 0, or -1 on a bad argument. */
int idx_ref_queries(const idx_ref_config *cfg, const float *wq /* [H_I * d_I, rq] */, const double *cq /* [rq] */,
                    const double *c /* [dr/2] */, const double *s /* [dr/2] */, double *q /* [H_I, d_I] */);

/* The head weights of one token, w = W_w x (unscaled). Returns 0, or -1 on a bad argument. */
int idx_ref_head_weights(const idx_ref_config *cfg, const float *ww /* [H_I, D] */, const float *x /* [D] */,
                         double *w /* [H_I] */);

/* (H_I d_I)^(-1/2): the factor folded into the weights, w' = w (H_I d_I)^(-1/2) (DSA.md 3.6). */
double idx_ref_weight_scale(int heads, int head_dim);

/* ---- scores ------------------------------------------------------------------------------------- */

/* I(t, s) = scale * sum_h w_h ReLU(q_h . k_s) for the n_keys keys of one query token.
   With w the raw weights, scale = idx_ref_weight_scale(H_I, d_I) gives the defining formula; with
   w already scaled (the w' a device is given), scale = 1. */
void idx_ref_scores(int heads, int head_dim, const double *q /* [H_I, d_I] */, const double *w /* [H_I] */,
                    double scale, int n_keys, const double *keys /* [n_keys, d_I] */, double *scores /* [n_keys] */);

/* The score error bound of DSA.md 6.3 for one query token:
   eps_t = gamma_n * max_s B(t, s),  B(t, s) = sum_h |scale w_h| sum_d |q_{h,d} k_{s,d}|,
   gamma_n = n u / (1 - n u), n = d_I + H_I + 4, u = 2^-24 (float32 accumulation) or 2^-11 when
   half_precision (any stage in fp16). 0 when n_keys <= 0. */
double idx_ref_score_bound(int heads, int head_dim, const double *q /* [H_I, d_I] */, const double *w /* [H_I] */,
                           double scale, int n_keys, const double *keys /* [n_keys, d_I] */, int half_precision);

/* ---- top-k selection (DSA.md section 4) ---------------------------------------------------------- */

/* The selection of one query token whose visible keys are positions 0 .. n_visible-1 with these
   scores: n_t = min(top_k, n_visible) positions ranked by (score descending, position ascending),
   in that rank order, then -1 in the remaining top_k - n_t entries. Scores must not be NaN.
   Returns n_t, or -1 on a bad argument (top_k < 1, n_visible < 0, a NULL array, allocation). */
int idx_ref_topk(const double *scores /* [n_visible] */, int n_visible, int top_k, int32_t *selected /* [top_k] */);

/* The acceptance rule of DSA.md 6.4 for a selection made by an implementation whose scores are
   within eps of these reference scores: the first n_t = min(top_k, n_visible) entries of selected
   must be distinct positions in [0, n_visible) (any order) and the rest -1. With v_K and v_{K+1} the
   K-th and (K+1)-th largest reference scores: if there is no (K+1)-th (n_visible <= K) or
   v_K - v_{K+1} > 2 eps, the set must equal the reference's (*strict = 1); otherwise (*strict = 0)
   every selected score must be >= v_K - 2 eps and every unselected visible one <= v_K + 2 eps.
   Returns 1 when accepted, 0 when not (why, when not NULL, then says which rule failed), -1 on a bad
   argument. strict may be NULL. */
int idx_ref_selection_ok(const double *scores /* [n_visible] */, int n_visible, int top_k, double eps,
                         const int32_t *selected /* [top_k] */, int *strict, char *why, size_t why_size);

/* ---- DeepSeek's FP8 index keys (DSA.md 3.4-3.5) ---------------------------------------------------- */

/* x <- H x / sqrt(n), H Sylvester's Hadamard matrix (H[i][j] = (-1)^popcount(i & j)); n a power of
   two. Returns 0, or -1 when n is not. */
int idx_ref_hadamard(double *x /* [n] */, int n);

/* DeepSeek-V3.2's act_quant with ue8m0 scales on one vector: s = 2^ceil(log2(max(max|x|, 1e-4) / 448)),
   x <- e4m3(x / s) * s (round to nearest even, saturating at 448): the values an fp8 key holds.
   Returns s. */
double idx_ref_quantize_fp8(double *x /* [n] */, int n);

/* ---- a whole sparse-attention layer (DeepSeek-V3.2, GLM-5) --------------------------------------- */

typedef struct idx_ref_weights {     /* checkpoint layout, float32, the self_attn.indexer.* tensors */
    const float *wq_b;               /* [H_I * d_I, rq] */
    const float *wk;                 /* [d_I, D] */
    const float *k_norm;             /* [d_I] */
    const float *k_norm_bias;        /* [d_I] */
    const float *weights_proj;       /* [H_I, D] */
} idx_ref_weights;

/* The attention output of T tokens at positions 0..T-1 of one sequence through a layer with an
   indexer (DSA.md sections 3 and 4): every token's index key (written before it is scored, so
   s = t is a candidate), rounded to key_type (MLA_REF_CACHE_F32: not rounded, F16 or BF16: to
   nearest even, as an index-key cache of that type holds it; FP8: rotated by idx_ref_hadamard and
   quantised by idx_ref_quantize_fp8, the queries rotated alike for the scores); for
   token t the defining-formula scores of keys 0..t, the selection of idx_ref_topk (all of them
   while t + 1 <= top_k), absorbed latent attention over the selected keys only
   (mla_ref_sparse_latent_attention, the cache's rounding from f->cache_type, f may be NULL), then
   W^UV and o_proj (and o_proj's bias). The rope tables are MLA's (mla_ref_rope_tables_ext, step
   choice as one step of T tokens). Optional outputs: selected [T, top_k] (rank order, -1 padded),
   *ambiguous the number of tokens whose selection DSA.md 6.4 does not fix (the K-th and (K+1)-th
   scores closer than twice the float32 bound of idx_ref_score_bound; rounded keys too, since an
   implementation scores the same rounded keys): an implementation may select otherwise there. Returns 0, or -1 on a bad
   argument or allocation failure. */
int idx_ref_dsa_forward(const mla_ref_config *cfg, const mla_ref_features *f, const mla_ref_weights *w,
                        const idx_ref_config *icfg, const idx_ref_weights *iw, int top_k, mla_ref_cache_type key_type, int T,
                        const float *x /* [T, D] */, double *out /* [T, D] */, int32_t *selected /* [T, top_k] */,
                        int *ambiguous);

/* A shared layer (glm_moe_dsa's indexer_types "shared", no indexer of its own): the attention output
   of T tokens at positions 0..T-1 of one sequence, token t attending to the keys of
   selected[t * top_k ..] (positions <= t, -1 padded: the selection its full layer made, as
   idx_ref_dsa_forward returns it, which holds every key 0..t while t + 1 <= top_k) through
   mla_ref_sparse_latent_attention (the cache's rounding from f->cache_type, f may be NULL), then
   W^UV and o_proj (and o_proj's bias). Returns 0, or -1 on a bad argument (a selected position
   past its token) or allocation failure. */
int idx_ref_shared_forward(const mla_ref_config *cfg, const mla_ref_features *f, const mla_ref_weights *w, int top_k,
                           int T, const float *x /* [T, D] */, const int32_t *selected /* [T, top_k] */,
                           double *out /* [T, D] */);

#ifdef __cplusplus
}
#endif

#endif /* INDEXER_REF_H */
