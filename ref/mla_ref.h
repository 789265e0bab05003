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
    double yarn_factor;  /* s; <= 1.0 means YaRN off (plain RoPE, amplitude 1, scale dq^-1/2), unless
                            mla_ref_features.rope_type (below) names another type */
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

/* ---- what the other model families add (docs/MLA.md sections 1-4) -------------------------------

   Kept in a struct of its own, next to mla_ref_config and mla_ref_weights rather than inside them,
   because callers initialise those two positionally (host/cli/cmd_demo.c): a new field there would
   be a missing-initializer warning, an error under CLMLA_WERROR. A zero-initialised
   mla_ref_features (or NULL wherever one is taken) adds nothing: every function then computes
   exactly what it computed with mla_ref_config alone. */

typedef enum mla_ref_rope_type {
    MLA_REF_ROPE_AUTO = 0,     /* as mla_ref_config alone: YARN when yarn_factor > 1, else DEFAULT */
    MLA_REF_ROPE_DEFAULT = 1,  /* f_i = f0_i = theta^(-2i/dr), A = 1 */
    MLA_REF_ROPE_LINEAR = 2,   /* f_i = f0_i / linear_factor, A = 1 */
    MLA_REF_ROPE_YARN = 3,     /* the yarn_* fields of mla_ref_config (section 3), for any s > 0 */
    MLA_REF_ROPE_LONGROPE = 4, /* f_i = f0_i / short_i or f0_i / long_i, chosen per step */
    MLA_REF_ROPE_LLAMA3 = 5,   /* wavelength split of f0_i */
    MLA_REF_ROPE_NONE = 6      /* no rotation: the rope dims are used as they are */
} mla_ref_rope_type;

typedef enum mla_ref_cache_type {
    MLA_REF_CACHE_F32 = 0,
    MLA_REF_CACHE_F16 = 1,
    MLA_REF_CACHE_BF16 = 2,
    MLA_REF_CACHE_FP8 = 3 /* FlashMLA's: c^KV in e4m3 with a power-of-two scale per 128 values, k^R in bf16 */
} mla_ref_cache_type;

typedef struct mla_ref_features {
    mla_ref_rope_type rope_type;
    /* A of YARN (AUTO with YaRN on included) and LONGROPE; 0 = the type's rule: YaRN
       g(s, mscale) / g(s, mscale_all_dim), LongRoPE sqrt(1 + ln s / ln L) (1 when s <= 1).
       The other types have A = 1 (transformers reads attention_factor only for those two). */
    double rope_attention_factor;
    double linear_factor;                 /* LINEAR: s > 0 */
    int yarn_no_truncate;                 /* YARN: low / high of the ramp are not floored / ceiled */
    /* LONGROPE. A step (see mla_ref_forward_ext) whose last position p has p + 1 > L rotates all of
       its tokens, queries and keys, with the long factors, else with the short ones; a key keeps
       the rotation of the step that wrote it. */
    const double *longrope_short_factor;  /* [dr/2], each > 0 */
    const double *longrope_long_factor;   /* [dr/2], each > 0 */
    double longrope_factor;               /* s, for A only */
    double longrope_original_max_pos;     /* L >= 1 */
    /* LLAMA3: with lambda_i = 2 pi / f0_i: f0_i when lambda_i < L/hi, f0_i / s when lambda_i > L/lo,
       else (1 - a) f0_i / s + a f0_i with a = (L / lambda_i - lo) / (hi - lo). */
    double llama3_factor;                 /* s > 0 */
    double llama3_low_freq_factor;        /* lo > 0 */
    double llama3_high_freq_factor;       /* hi > lo */
    double llama3_original_max_pos;       /* L > 0 */
    /* Query scale (Mistral 4, section 4): after RoPE, every value of the query of a token at position
       p (q^C and q^R of every head) is multiplied by m(p) = 1 + beta * ln(1 + floor(p / interval)).
       Keys are not scaled. beta 0 = off; otherwise interval >= 1. */
    double query_scale_beta;
    long query_scale_interval;
    /* Latent scales (LongCat-Flash, section 2): c^Q = RMSNorm(q_a_proj x) * sq and
       c^KV = RMSNorm(c) * skv. 0 or 1 = none. */
    double q_latent_scale;                /* sq (used only when rq > 0) */
    double kv_latent_scale;               /* skv */
    /* Biases ("attention_bias": true, section 1), float32, added right after their product:
       q_a_proj x + b before the query RMSNorm, kv_a_proj_with_mqa x + b before the KV RMSNorm and
       RoPE (its last dr values go to the rope key), o_proj o + b on the output. NULL = none.
       q_proj, q_b_proj and kv_b_proj have none; q_a_proj_bias needs rq > 0. */
    const float *q_a_proj_bias;           /* [rq] */
    const float *kv_a_proj_with_mqa_bias; /* [rkv+dr] */
    const float *o_proj_bias;             /* [D] */
    /* The cache's element type (section 6): c^KV and k^R are rounded to it, to nearest even, when
       written, and every later use (scores, values, ckv_out, kr_out) sees the rounded values, as
       a cache of that type holds them. */
    mla_ref_cache_type cache_type;
    /* A cache's contents as read back from a device ([T, rkv] and [T, dr], float32), used by the
       attention in place of the reference's own (rounded) c^KV and k^R; NULL = none. For checking
       the attention given what a device stored, where a value within float32 error of a rounding
       boundary may have been rounded the other way (the stored values are checked separately). */
    const float *stored_ckv;
    const float *stored_kr;
} mla_ref_features;

/* x rounded to the nearest value of binary16 (11 significant bits, subnormals below 2^-14;
   |x| past 65504 is not handled) or of bfloat16 (8 significant bits, subnormals below 2^-126;
   |x| past the largest bfloat16 is not handled), ties to even. Exact in double. */
double mla_ref_round_f16(double x);
double mla_ref_round_bf16(double x);
/* x rounded to float8 e4m3 (4 significant bits, subnormals below 2^-6 on a grid of 2^-9), ties to
   even; magnitudes past 448 saturate to 448. */
double mla_ref_round_e4m3(double x);
/* One cache row [c^KV (rkv) ; k^R (dr)] replaced by what a cache of this type holds: each value
   rounded (f16, bf16), or for FP8, following FlashMLA's tests/quant.py: per tile of 128 values of
   c^KV the scale s = 2^ceil(log2(max(max|x| / 448, 1e-4))) and the values e4m3(x / s) * s (a tile
   with a NaN: all NaN), and k^R rounded to bf16 (rkv a multiple of 128). */
void mla_ref_round_cache_row(mla_ref_cache_type type, double *ckv, int rkv, double *kr, int dr);
/* The float denoted by a 16-bit binary16 code, a 16-bit bfloat16 code, an 8-bit float8 e4m3
   ("fn": bias 7, no infinities, S.1111.111 is NaN) code: from the formats' definitions. */
double mla_ref_decode_f16(unsigned bits);
double mla_ref_decode_bf16(unsigned bits);
double mla_ref_decode_e4m3(unsigned bits);
/* The inverse: the code of a value that the format holds exactly (one that mla_ref_round_f16,
   mla_ref_round_bf16 or mla_ref_round_e4m3 returns; infinities for f16 and bf16; -0 has the sign
   bit), or -1 for a value it does not hold, or NaN. */
int mla_ref_encode_f16(double x);
int mla_ref_encode_bf16(double x);
int mla_ref_encode_e4m3(double x);

/* ---- weights kept in another element type (clmla_layer_config.weights_dtype) -------------------

   A layer told to keep its weights in f16, bf16 or fp8 computes with the weights that type holds,
   each decoded to float32. The reference is fed those same values as float32 weights (the float32
   round trip of every value of the three types is exact, fp8's scaled product aside: below). */

enum { MLA_REF_WEIGHT_F32 = 0, MLA_REF_WEIGHT_F16 = 1, MLA_REF_WEIGHT_BF16 = 2, MLA_REF_WEIGHT_FP8 = 3 };

/* Side of an FP8 weight's scale block, along both dimensions. */
#define MLA_REF_FP8_BLOCK 128

/* DeepSeek-V3's FP8 weight quantisation of W [rows, cols]: for each block of 128 x 128 values (the
   last along each dimension partial: it keeps its own scale), the float32 scale
   s = max|W| / 448, a float32 division (a block of zeros: s = 1; a quotient that underflows to 0:
   s = 2^-149, the smallest float32 above 0), and for each value the code of e4m3(W / s), the
   quotient taken in double and rounded to e4m3 to nearest even, saturating at 448.
   codes [rows, cols] (mla_ref_decode_e4m3 reads them), scale [ceil(rows / 128), ceil(cols / 128)].
   Returns 0, or -1 (nothing written) when a value of W is not finite or an argument is bad. */
int mla_ref_quantize_fp8(const float *w /* [rows, cols] */, int rows, int cols, unsigned char *codes,
                         float *scale);

/* Replaces W [rows, cols] in place by the values a layer keeping it in `dtype` (MLA_REF_WEIGHT_*,
   clmla_dtype's numbering) computes with:
     F32   unchanged;
     F16   each value rounded to binary16 (mla_ref_round_f16), past 65504 to an infinity as IEEE
           rounding gives; BF16 likewise (mla_ref_round_bf16); NaN and infinities stay as they are;
     FP8   mla_ref_quantize_fp8, then each value e4m3(code) * s, that product rounded to float32
           (it can need 28 significant bits: 4 of the code times 24 of the scale).
   Returns 0, or -1 with W unchanged for an unknown dtype, negative sizes, or FP8 given a value
   that is not finite (clmla refuses such a tensor). */
int mla_ref_round_weight(int dtype, float *w /* [rows, cols] */, int rows, int cols);

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

/* The same with features (NULL = none; then each equals the function above). */

/* The rope type in effect: AUTO resolved to YARN or DEFAULT. */
mla_ref_rope_type mla_ref_rope_type_of(const mla_ref_config *cfg, const mla_ref_features *f);
/* mla_ref_yarn_bounds, with the ramp bounds left unrounded when f->yarn_no_truncate:
   low = max(cd(beta_fast), 0), high = min(cd(beta_slow), dr - 1), then the same low == high rule. */
void mla_ref_yarn_bounds_ext(const mla_ref_config *cfg, const mla_ref_features *f, double *low, double *high);
/* 1 when a step whose last position is step_last_pos uses LongRoPE's long factors
   (type LONGROPE and step_last_pos + 1 > L), else 0. */
int mla_ref_longrope_long(const mla_ref_config *cfg, const mla_ref_features *f, long step_last_pos);
/* inv_freq[i] and A for the tokens of a step whose last position is step_last_pos (which matters only
   to LONGROPE). Type NONE gives inv_freq 0 and A 1 (no rotation). */
void mla_ref_rope_tables_ext(const mla_ref_config *cfg, const mla_ref_features *f, long step_last_pos,
                             double *inv_freq /* [dr/2] */, double *amplitude);
/* Rotates x for position pos, a token of a step whose last position is step_last_pos (a decode step
   of one token: step_last_pos = pos). */
void mla_ref_rope_apply_ext(const mla_ref_config *cfg, const mla_ref_features *f, double *x /* [dr] */, long pos,
                            long step_last_pos);
/* tau = dq^(-1/2), times g(s, mscale_all_dim)^2 (mscale_all_dim of mla_ref_config) for the types
   that scale frequencies by a factor s: LINEAR, YARN, LONGROPE, LLAMA3, each with its own s
   (g(s, m) = 0.1 m ln s + 1, 1 for s <= 1; g(s, 0) = 1). DEFAULT and NONE: dq^(-1/2). */
double mla_ref_softmax_scale_ext(const mla_ref_config *cfg, const mla_ref_features *f);
/* m(pos) of the query scale; 1 when it is off. */
double mla_ref_query_scale(const mla_ref_features *f, long pos);

/* One sequence of T tokens at positions 0..T-1, causal, through one attention layer.
   out: [T, D] attention output after o_proj. Optional (may be NULL): ckv_out [T, rkv] (c^KV after
   RMSNorm), kr_out [T, dr] (k^R after RoPE), q_tilde_out [T, H, rkv] (absorbed queries),
   q_rope_out [T, H, dr] (q^R after RoPE), latent_out [T, H, rkv] (o-bar of the absorbed path),
   lse_out [T, H] (natural-log log-sum-exp of the scaled scores).
   path selects absorbed or decompressed math (section 5). Returns 0, or -1 on bad arguments/alloc failure.
   The T tokens form one step, with no features: mla_ref_forward_ext(cfg, NULL, w, T, x, NULL, 0, ...).

   With path == MLA_REF_DECOMPRESSED the scores and out come from the up-projected keys/values;
   q_tilde_out is still filled with (W^UK_h)^T q^C_h (not used for the scores), and latent_out
   with sum_j p_j c^KV_j using that path's softmax weights p_j, so both paths fill every output. */
int mla_ref_forward(const mla_ref_config *cfg, const mla_ref_weights *w, int T,
                    const float *x /* [T, D] */, int path, double *out /* [T, D] */,
                    double *ckv_out, double *kr_out, double *q_tilde_out, double *q_rope_out,
                    double *latent_out, double *lse_out);

/* mla_ref_forward with features (NULL = none) and steps. The T tokens, at positions 0..T-1, are
   fed as num_steps consecutive steps of step_tokens[k] tokens each (they must add up to T; NULL or
   num_steps 0 = one step of all T tokens, which is what mla_ref_forward does). Steps change nothing
   but LongRoPE's choice of factors: each step's tokens are rotated with the factors chosen by the
   step's last position (mla_ref_longrope_long), and every key keeps that rotation for the later
   steps, as a cache would hold it. So, for one step of T tokens: long factors when T > L. Every
   output is as in mla_ref_forward, with the features applied: q_tilde_out and q_rope_out include
   the query scale m(p), ckv_out the latent scale, kr_out the bias, out the o_proj bias. Returns 0,
   or -1 on bad arguments (features included) or allocation failure. */
int mla_ref_forward_ext(const mla_ref_config *cfg, const mla_ref_features *f, const mla_ref_weights *w, int T,
                        const float *x /* [T, D] */, const int *step_tokens /* [num_steps] */, int num_steps,
                        int path, double *out /* [T, D] */, double *ckv_out, double *kr_out, double *q_tilde_out,
                        double *q_rope_out, double *latent_out, double *lse_out);

/* Latent (absorbed) attention alone, as FlashMLA computes it, for one query token:
   scores_j = scale*(q_tilde_h . ckv_j + q_rope_h . kr_j) over keys j < n_keys;
   latent_out_h = softmax-weighted sum of ckv_j; lse_h = log(sum_j exp(scores_j)).
   With n_keys <= 0, latent_out is all zeros and lse_out is -INFINITY. */
void mla_ref_latent_attention(int heads, int kv_lora_rank, int rope_dim, double scale, int n_keys,
                              const double *q_tilde /* [H, rkv] */, const double *q_rope /* [H, dr] */,
                              const double *ckv /* [n_keys, rkv] */, const double *kr /* [n_keys, dr] */,
                              double *latent_out /* [H, rkv] */, double *lse_out /* [H] */);

/* Sparse latent attention (DeepSeek Sparse Attention) for one query token: as
   mla_ref_latent_attention, but over the keys the index list names instead of all n_keys of them.
   Entry i (i < topk) names key indices[i] of the sequence whose keys, in position order, are
   ckv/kr [n_keys, .]; an entry < 0 or >= n_keys names no key and is skipped. The order of the
   entries does not matter; a key named twice is counted twice. No valid entry: latent_out all
   zeros and lse_out -INFINITY. Returns how many entries named a key. */
int mla_ref_sparse_latent_attention(int heads, int kv_lora_rank, int rope_dim, double scale, int n_keys,
                                    const int *indices /* [topk] */, int topk,
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
