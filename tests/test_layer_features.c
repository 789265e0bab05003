/* clmla_layer_forward with the model-family features of clmla_layer_config on, against the float64
 * reference's mla_ref_forward_ext (ref/, written from docs/MLA.md sections 2-4):
 *   rope types linear (with mscale_all_dim in tau), yarn with rope_attention_factor, yarn with
 *   yarn_no_truncate, LongRoPE with the whole sequence inside L and past it (a decode crossing L),
 *   llama3, none; the per-position query scale (an explicit interval, and interval 0 = L); the
 *   latent scales; the three biases, and the two a q_proj layer (rq = 0) can have.
 * Shapes are awkward on purpose: odd hidden sizes (29 to 53), 3/5/6/7 heads, rope dims 4/6/8/10,
 * both pairings, rq = 0 (q_proj) in three cases, T = 13 (cache blocks of 4 tokens: the last one ends
 * mid-block) or 8. tau (clmla_layer_config_softmax_scale) is compared too.
 *
 * Every case runs the same schedules on a fresh f32 cache each, on both attention paths:
 *   prefill   all T tokens in one step (absorbed; decompressed; and auto on an f16 cache);
 *   decode    a prefill of P tokens, then T - P one-token decode steps (all absorbed; all
 *             decompressed);
 *   chunks    steps of 6, 4, 3 tokens, the paths alternating;
 * and compares every step's output and the cache contents (c^KV, k^R) with the reference fed the
 * same steps. The steps matter to LongRoPE alone: a step whose last position p has p + 1 > L rotates
 * its tokens with the long factors, else the short ones, and keys keep the rotation of the step that
 * wrote them (docs/MLA.md section 3, include/clmla.h). So for LongRoPE past L the three schedules
 * have three different right answers (one prefill of 13: every token long; prefill 5 + decode:
 * tokens 0..7 short, 8..12 long; chunks 6/4/3: tokens 0..5 short, 6..12 long), each computed by the
 * reference with those steps; for every other feature the reference's steps change nothing (bitwise,
 * test_ref's steps_neutral_without_longrope).
 *
 * So that a feature the library ignored could not pass, each case also asserts that the reference
 * with the feature off (each component separately: e.g. the linear frequencies, and linear's factor
 * on tau) differs from the reference with it on by more than FEATURE_EFFECT_MIN (100 times the
 * tolerance); for LongRoPE past L, the two wrong readings of the step rule (short everywhere; the
 * step's long choice applied to the keys already cached) are asserted to differ as much.
 * `test_layer_features PART...` runs the named cases. */
#include "check.h"
#include "clmla.h"
#include "mla_ref.h"
#include "test_util.h"
#include "tolerance.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static clmla_context *ctx;

/* A feature counts as visible when switching it off moves the reference output by more than this
   (relative, as mla_ref_max_rel_err): 100 times the tolerance the library is held to. */
#define FEATURE_EFFECT_MIN (100.0 * TOL_F32_CACHE)

enum { MAX_OFF = 3, BLOCK_TOKENS = 4 };

/* ---- the reference's view of a clmla configuration ------------------------------------------- */

/* mla_ref_config + mla_ref_features for a clmla_layer_config, every 0-means-default field resolved
   as include/clmla.h documents it (tu_ref_config knows only the 0.1 fields). */
typedef struct ref_view {
    mla_ref_config cfg;
    mla_ref_features f;
    double short_factor[CLMLA_MAX_ROPE_PAIRS]; /* LongRoPE's lists, which f points to */
    double long_factor[CLMLA_MAX_ROPE_PAIRS];
} ref_view;

static void ref_view_make(const clmla_layer_config *c, ref_view *v)
{
    memset(v, 0, sizeof(*v));
    mla_ref_config *r = &v->cfg;
    mla_ref_features *f = &v->f;
    tu_ref_config(c, r); /* the 0.1 fields; then yarn's as they are, whatever the factor */
    const double L = r->yarn_original_max_pos;
    r->yarn_factor = c->yarn_factor;
    r->yarn_mscale = c->yarn_mscale;
    r->yarn_mscale_all_dim = c->yarn_mscale_all_dim;

    /* yarn_factor is every type's s; yarn_original_max_position every type's L. */
    switch (c->rope_type) {
    case CLMLA_ROPE_TYPE_AUTO:
        f->rope_type = MLA_REF_ROPE_AUTO;
        break;
    case CLMLA_ROPE_TYPE_DEFAULT:
        f->rope_type = MLA_REF_ROPE_DEFAULT;
        break;
    case CLMLA_ROPE_TYPE_LINEAR:
        f->rope_type = MLA_REF_ROPE_LINEAR;
        f->linear_factor = c->yarn_factor;
        break;
    case CLMLA_ROPE_TYPE_YARN:
        f->rope_type = MLA_REF_ROPE_YARN;
        break;
    case CLMLA_ROPE_TYPE_LONGROPE:
        f->rope_type = MLA_REF_ROPE_LONGROPE;
        for (int i = 0; i < c->qk_rope_head_dim / 2 && i < CLMLA_MAX_ROPE_PAIRS; i++) {
            v->short_factor[i] = c->longrope_short_factor[i];
            v->long_factor[i] = c->longrope_long_factor[i];
        }
        f->longrope_short_factor = v->short_factor;
        f->longrope_long_factor = v->long_factor;
        f->longrope_factor = c->yarn_factor;
        f->longrope_original_max_pos = L;
        break;
    case CLMLA_ROPE_TYPE_LLAMA3:
        f->rope_type = MLA_REF_ROPE_LLAMA3;
        f->llama3_factor = c->yarn_factor;
        f->llama3_low_freq_factor = c->llama3_low_freq_factor;
        f->llama3_high_freq_factor = c->llama3_high_freq_factor;
        f->llama3_original_max_pos = L;
        break;
    case CLMLA_ROPE_TYPE_NONE:
        f->rope_type = MLA_REF_ROPE_NONE;
        break;
    }
    f->rope_attention_factor = c->rope_attention_factor;
    f->yarn_no_truncate = c->yarn_no_truncate;
    f->query_scale_beta = c->query_scale_beta;
    f->query_scale_interval = c->query_scale_interval == 0 ? (long)L : c->query_scale_interval;
    f->q_latent_scale = c->q_latent_scale;
    f->kv_latent_scale = c->kv_latent_scale;
}

/* ---- cases ------------------------------------------------------------------------------------ */

/* One way of switching (part of) a case's feature off in the reference. */
typedef struct feature_off {
    const char *what;
    void (*apply)(ref_view *v);
} feature_off;

typedef struct feature_case {
    const char *name;
    clmla_layer_config config;
    int biases;        /* 1: every bias the shape allows (q_a_proj's only with rq > 0) */
    int tokens;        /* T */
    int prefill;       /* P of the decode schedule */
    feature_off off[MAX_OFF];
    int longrope_past; /* 1: the LongRoPE step checks (T > L) */
} feature_case;

static void off_default_rope(ref_view *v)
{
    v->f.rope_type = MLA_REF_ROPE_DEFAULT;
}
static void off_mscale_all_dim(ref_view *v)
{
    v->cfg.yarn_mscale_all_dim = 0.0;
}
static void off_attention_factor(ref_view *v)
{
    v->f.rope_attention_factor = 0.0;
}
static void off_no_truncate(ref_view *v)
{
    v->f.yarn_no_truncate = 0;
}
static void off_short_factors(ref_view *v)
{
    memcpy(v->short_factor, v->long_factor, sizeof(v->short_factor)); /* the long ones everywhere */
}
static void off_long_factors(ref_view *v)
{
    memcpy(v->long_factor, v->short_factor, sizeof(v->long_factor)); /* the short ones everywhere */
}
static void off_longrope_amplitude(ref_view *v)
{
    v->f.rope_attention_factor = 1.0;
}
static void off_rotation(ref_view *v)
{
    v->f.rope_type = MLA_REF_ROPE_DEFAULT; /* rotate after all */
}
static void off_query_scale(ref_view *v)
{
    v->f.query_scale_beta = 0.0;
}
static void off_interval_4096(ref_view *v)
{
    v->f.query_scale_interval = 4096; /* interval 0 read as 4096 instead of L */
}
static void off_q_latent_scale(ref_view *v)
{
    v->f.q_latent_scale = 0.0;
}
static void off_kv_latent_scale(ref_view *v)
{
    v->f.kv_latent_scale = 0.0;
}
static void off_q_bias(ref_view *v)
{
    v->f.q_a_proj_bias = NULL;
}
static void off_kv_bias(ref_view *v)
{
    v->f.kv_a_proj_with_mqa_bias = NULL;
}
static void off_o_bias(ref_view *v)
{
    v->f.o_proj_bias = NULL;
}

enum {
    CASE_LINEAR,
    CASE_YARN_ATTENTION,
    CASE_YARN_NO_TRUNCATE,
    CASE_LONGROPE_INSIDE,
    CASE_LONGROPE_PAST,
    CASE_LLAMA3,
    CASE_NONE,
    CASE_QUERY_SCALE,
    CASE_QUERY_SCALE_L,
    CASE_LATENT_SCALES,
    CASE_BIASES,
    CASE_BIASES_Q_PROJ,
    NUM_CASES
};

static feature_case make_case(int which)
{
    feature_case k;
    memset(&k, 0, sizeof(k));
    k.tokens = 13;
    k.prefill = 4;
    clmla_layer_config *c = &k.config;
    switch (which) {
    case CASE_LINEAR: /* s 4, and mscale_all_dim 0.9 so that tau carries g(4, 0.9)^2 */
        k.name = "linear";
        *c = tu_small_config(37, 3, 11, 19, 5, 8, 7);
        c->rope_theta = 100;
        c->rope_type = CLMLA_ROPE_TYPE_LINEAR;
        c->yarn_factor = 4;
        c->yarn_mscale_all_dim = 0.9;
        k.off[0] = (feature_off){"frequencies and tau (default rope)", off_default_rope};
        k.off[1] = (feature_off){"g(s, mscale_all_dim)^2 in tau", off_mscale_all_dim};
        break;
    case CASE_YARN_ATTENTION: /* A = 1.35 instead of g(8, 1) / g(8, 0.5) = 1.0865 */
        k.name = "yarn-attention-factor";
        *c = tu_small_config(45, 5, 17, 23, 9, 6, 11);
        c->rope_pairing = CLMLA_ROPE_HALF_SPLIT;
        c->rope_theta = 500;
        c->rope_type = CLMLA_ROPE_TYPE_YARN;
        c->yarn_factor = 8;
        c->yarn_original_max_position = 64;
        c->yarn_mscale = 1.0;
        c->yarn_mscale_all_dim = 0.5;
        c->rope_attention_factor = 1.35;
        k.off[0] = (feature_off){"attention_factor (the mscale rule instead)", off_attention_factor};
        break;
    case CASE_YARN_NO_TRUNCATE:
        /* dr 10, theta 100, L 64, beta 16/1: cd(16) = 10 ln(64 / 32 pi) / (2 ln 100) = -0.49 and
           cd(1) = 10 ln(64 / 2 pi) / (2 ln 100) = 2.52: the ramp runs over [0, 2.52] instead of
           [0, 3], which moves pairs 1 and 2. */
        k.name = "yarn-no-truncate";
        *c = tu_small_config(29, 6, 13, 31, 3, 10, 5);
        c->rope_theta = 100;
        c->rope_type = CLMLA_ROPE_TYPE_YARN;
        c->yarn_factor = 16;
        c->yarn_original_max_position = 64;
        c->yarn_beta_fast = 16;
        c->yarn_beta_slow = 1;
        c->yarn_mscale = 1.0;
        c->yarn_mscale_all_dim = 1.0;
        c->yarn_no_truncate = 1;
        k.off[0] = (feature_off){"no-truncate (the rounded bounds instead)", off_no_truncate};
        break;
    case CASE_LONGROPE_INSIDE:
    case CASE_LONGROPE_PAST:
        /* MiniCPM3-like: half-split pairs, s 4, L 8: A = sqrt(1 + ln 4 / ln 8) = 1.291. */
        *c = tu_small_config(41, 3, 15, 21, 6, 8, 9);
        c->rope_pairing = CLMLA_ROPE_HALF_SPLIT;
        c->rope_type = CLMLA_ROPE_TYPE_LONGROPE;
        c->yarn_factor = 4;
        c->yarn_original_max_position = 8;
        for (int i = 0; i < 4; i++) {
            c->longrope_short_factor[i] = 1.0 + 0.6 * i * i;
            c->longrope_long_factor[i] = 2.5 + 4.0 * i * i;
        }
        if (which == CASE_LONGROPE_INSIDE) {
            /* T = L = 8: every step ends at p <= 7, p + 1 <= 8: short factors throughout. */
            k.name = "longrope-inside";
            k.tokens = 8;
            k.prefill = 3;
            k.off[0] = (feature_off){"rope (default instead)", off_rotation};
            k.off[1] = (feature_off){"the short factors (long instead)", off_short_factors};
            k.off[2] = (feature_off){"the amplitude sqrt(1 + ln s / ln L)", off_longrope_amplitude};
        } else {
            /* T = 13 > L: the decode schedule (P 5) crosses L at position 8. */
            k.name = "longrope-past";
            k.prefill = 5;
            k.off[0] = (feature_off){"rope (default instead)", off_rotation};
            k.off[1] = (feature_off){"the long factors (short instead)", off_long_factors};
            k.longrope_past = 1;
        }
        break;
    case CASE_LLAMA3:
        /* dr 8, theta 1e4, s 8, lo 1, hi 8, L 256: pair 0 kept, pair 1 blended, pairs 2 and 3 / 8
           (test_ref's llama3_freqs works these out). q_proj (rq 0). */
        k.name = "llama3";
        *c = tu_small_config(53, 7, 0, 27, 11, 8, 6);
        c->rope_type = CLMLA_ROPE_TYPE_LLAMA3;
        c->yarn_factor = 8;
        c->yarn_original_max_position = 256;
        c->llama3_low_freq_factor = 1;
        c->llama3_high_freq_factor = 8;
        k.off[0] = (feature_off){"the llama3 frequencies (default instead)", off_default_rope};
        break;
    case CASE_NONE:
        k.name = "none";
        *c = tu_small_config(33, 3, 9, 17, 7, 4, 5);
        c->rope_type = CLMLA_ROPE_TYPE_NONE;
        k.off[0] = (feature_off){"no rotation (default rope instead)", off_rotation};
        break;
    case CASE_QUERY_SCALE:
        /* beta 0.7, interval 4: m = 1, 1.485, 1.769, 1.970 over positions 0-3, 4-7, 8-11, 12. */
        k.name = "query-scale";
        *c = tu_small_config(39, 5, 12, 25, 8, 6, 10);
        c->query_scale_beta = 0.7;
        c->query_scale_interval = 4;
        k.off[0] = (feature_off){"the query scale", off_query_scale};
        break;
    case CASE_QUERY_SCALE_L:
        /* Mistral 4 style: YaRN and the query scale with interval 0 = L = 5. */
        k.name = "query-scale-interval-L";
        *c = tu_small_config(43, 6, 0, 20, 6, 8, 8);
        c->rope_type = CLMLA_ROPE_TYPE_YARN;
        c->yarn_factor = 8;
        c->yarn_original_max_position = 5;
        c->yarn_mscale = 1.0;
        c->yarn_mscale_all_dim = 1.0;
        c->query_scale_beta = 0.9;
        c->query_scale_interval = 0;
        k.off[0] = (feature_off){"the query scale", off_query_scale};
        k.off[1] = (feature_off){"interval L (4096 instead)", off_interval_4096};
        break;
    case CASE_LATENT_SCALES: /* LongCat-Flash: sqrt(D / rq), sqrt(D / rkv) */
        k.name = "latent-scales";
        *c = tu_small_config(47, 3, 14, 22, 7, 8, 9);
        c->q_latent_scale = sqrt(47.0 / 14.0);
        c->kv_latent_scale = sqrt(47.0 / 22.0);
        k.off[0] = (feature_off){"q_latent_scale", off_q_latent_scale};
        k.off[1] = (feature_off){"kv_latent_scale", off_kv_latent_scale};
        break;
    case CASE_BIASES:
        k.name = "biases";
        *c = tu_small_config(35, 3, 13, 128, 5, 8, 7); /* rkv 128: an fp8 cache runs too */
        c->yarn_factor = 40; /* AUTO: YaRN */
        c->yarn_mscale = 1.0;
        c->yarn_mscale_all_dim = 0.8;
        k.biases = 1;
        k.off[0] = (feature_off){"q_a_proj bias", off_q_bias};
        k.off[1] = (feature_off){"kv_a_proj_with_mqa bias", off_kv_bias};
        k.off[2] = (feature_off){"o_proj bias", off_o_bias};
        break;
    default: /* CASE_BIASES_Q_PROJ: q_proj has no bias; kv_a and o_proj do */
        k.name = "biases-q-proj";
        *c = tu_small_config(31, 5, 0, 18, 4, 6, 9);
        c->rope_pairing = CLMLA_ROPE_HALF_SPLIT;
        k.biases = 1;
        k.off[0] = (feature_off){"kv_a_proj_with_mqa bias", off_kv_bias};
        k.off[1] = (feature_off){"o_proj bias", off_o_bias};
        break;
    }
    return k;
}

/* ---- the library side ---------------------------------------------------------------------------- */

static const char *path_name(clmla_attention_path p)
{
    return p == CLMLA_PATH_ABSORBED ? "absorbed" : p == CLMLA_PATH_DECOMPRESSED ? "decompressed" : "auto";
}

/* The reference's outputs for one schedule. */
typedef struct ref_result {
    int rounded; /* the reference rounded the cache as the cache's dtype does: the output is held to
                    TOL_F32_CACHE, the cache to TOL_ROUNDED_ELEMENT */
    double *out; /* [T, D] */
    double *ckv; /* [T, rkv] */
    double *kr;  /* [T, dr] */
} ref_result;

static void ref_result_free(ref_result *r)
{
    free(r->out);
    free(r->ckv);
    free(r->kr);
    memset(r, 0, sizeof(*r));
}

/* The reference (decompressed math, as test_layer uses) for tokens fed as these steps. */
static int ref_run(const ref_view *v, const mla_ref_weights *w, int T, const float *x, const int *steps, int nsteps,
                   ref_result *r)
{
    const size_t n = (size_t)T;
    r->out = malloc(n * (size_t)v->cfg.hidden * sizeof(double));
    r->ckv = malloc(n * (size_t)v->cfg.kv_lora_rank * sizeof(double));
    r->kr = malloc((n * (size_t)v->cfg.rope_dim + 1) * sizeof(double));
    if (!r->out || !r->ckv || !r->kr ||
        mla_ref_forward_ext(&v->cfg, &v->f, w, T, x, steps, nsteps, MLA_REF_DECOMPRESSED, r->out, r->ckv, r->kr,
                            NULL, NULL, NULL, NULL) != 0) {
        ref_result_free(r);
        return -1;
    }
    return 0;
}

/* max|a - b| / max|b|, both double. */
static double rel_diff(const double *a, const double *b, size_t n)
{
    double d = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs(a[i] - b[i]));
        m = fmax(m, fabs(b[i]));
    }
    return m > 0.0 ? d / m : d;
}

/* One CHECK of got against want within tol; returns the error. */
static double check_close(const float *got, const double *want, size_t n, size_t cols, double tol, const char *what)
{
    size_t worst = 0;
    const double err = mla_ref_max_rel_err(got, want, n, &worst);
    CHECK(err <= tol, "%s: max rel err %.3g > %.3g, worst at [%zu, %zu]: got %.8g, want %.8g", what, err, tol,
          worst / cols, worst % cols, n ? (double)got[worst] : 0.0, n ? want[worst] : 0.0);
    return err;
}

/* Runs tokens 0..T-1 through a fresh cache as `steps` (step k on paths[k % npaths]), checks every
   step's status, then the output and the cache against want. Returns the larger of the two errors
   (INFINITY when a step failed). */
static double run_steps(clmla_layer *layer, const clmla_layer_config *c, int T, const float *x, const int *steps,
                        int nsteps, const clmla_attention_path *paths, int npaths, clmla_cache_dtype dt,
                        const ref_result *want, const char *what)
{
    const int D = c->hidden_size, rkv = c->kv_lora_rank, dr = c->qk_rope_head_dim;
    clmla_cache_config cc = {1, rkv, dr, BLOCK_TOKENS, (T + BLOCK_TOKENS - 1) / BLOCK_TOKENS + 1, dt, 0, CLMLA_CACHE_F32};
    clmla_cache *cache = NULL;
    clmla_status st = clmla_cache_create(ctx, &cc, &cache);
    CHECK(st == CLMLA_SUCCESS, "%s: cache_create: %s: %s", what, clmla_status_string(st), clmla_last_error(ctx));
    if (st != CLMLA_SUCCESS)
        return INFINITY;
    int32_t seq = -1;
    CHECK_STATUS(clmla_cache_seq_add(cache, &seq), CLMLA_SUCCESS, ctx);
    float *out = malloc((size_t)T * D * sizeof(float));
    float *ckv = malloc(((size_t)T * rkv + 1) * sizeof(float)), *kr = malloc(((size_t)T * dr + 1) * sizeof(float));
    double err = INFINITY;
    int ok = out && ckv && kr, done = 0;
    for (int k = 0; ok && k < nsteps; k++) {
        clmla_forward_args a;
        memset(&a, 0, sizeof(a));
        clmla_batch_entry e = {seq, steps[k]};
        a.entries = &e;
        a.num_entries = 1;
        a.path = paths[k % npaths];
        st = clmla_layer_forward(layer, cache, &a, x + (size_t)done * D, out + (size_t)done * D);
        CHECK(st == CLMLA_SUCCESS, "%s: step %d (tokens %d..%d, %s): %s: %s", what, k, done, done + steps[k] - 1,
              path_name(a.path), clmla_status_string(st), clmla_last_error(ctx));
        ok = st == CLMLA_SUCCESS;
        done += steps[k];
    }
    if (ok) {
        const double tol = want->rounded ? TOL_F32_CACHE : TOL_FOR_DTYPE(dt);
        char w[400];
        snprintf(w, sizeof(w), "%s: out [token, i]", what);
        err = check_close(out, want->out, (size_t)T * D, (size_t)D, tol, w);
        const double tol_cache = want->rounded ? TOL_ROUNDED_ELEMENT(dt) : tol;
        st = clmla_cache_read(cache, 0, seq, 0, T, ckv, kr);
        CHECK(st == CLMLA_SUCCESS, "%s: cache_read: %s: %s", what, clmla_status_string(st), clmla_last_error(ctx));
        if (st == CLMLA_SUCCESS) {
            snprintf(w, sizeof(w), "%s: cached c^KV [token, i]", what);
            err = fmax(err, check_close(ckv, want->ckv, (size_t)T * rkv, (size_t)rkv, tol_cache, w));
            if (dr > 0) {
                snprintf(w, sizeof(w), "%s: cached k^R [token, i]", what);
                err = fmax(err, check_close(kr, want->kr, (size_t)T * dr, (size_t)dr, tol_cache, w));
            }
        } else {
            err = INFINITY;
        }
    }
    free(out);
    free(ckv);
    free(kr);
    clmla_cache_destroy(cache);
    return err;
}

/* Random biases (uniform +-0.5, as large as the projections' outputs) for the layer and the
   reference: the three of docs/MLA.md section 1 that the shape allows. */
typedef struct biases {
    float *q_a, *kv_a, *o;
} biases;

static int biases_make(biases *b, const clmla_layer_config *c, uint64_t seed, clmla_layer_weights *lw,
                       mla_ref_features *f)
{
    memset(b, 0, sizeof(*b));
    tu_rng rng = tu_rng_seed(seed);
    const size_t rq = (size_t)c->q_lora_rank, nkv = (size_t)(c->kv_lora_rank + c->qk_rope_head_dim);
    const size_t D = (size_t)c->hidden_size;
    if (rq > 0 && !(b->q_a = malloc(rq * sizeof(float))))
        return -1;
    b->kv_a = malloc(nkv * sizeof(float));
    b->o = malloc(D * sizeof(float));
    if (!b->kv_a || !b->o)
        return -1;
    if (rq > 0) {
        tu_fill_uniform(b->q_a, rq, 0.0f, 0.5f, &rng);
        lw->q_a_proj_bias = clmla_tensor_1d(b->q_a, (int64_t)rq);
        f->q_a_proj_bias = b->q_a;
    }
    tu_fill_uniform(b->kv_a, nkv, 0.0f, 0.5f, &rng);
    tu_fill_uniform(b->o, D, 0.0f, 0.5f, &rng);
    lw->kv_a_proj_with_mqa_bias = clmla_tensor_1d(b->kv_a, (int64_t)nkv);
    lw->o_proj_bias = clmla_tensor_1d(b->o, (int64_t)D);
    f->kv_a_proj_with_mqa_bias = b->kv_a;
    f->o_proj_bias = b->o;
    return 0;
}

static void biases_free(biases *b)
{
    free(b->q_a);
    free(b->kv_a);
    free(b->o);
    memset(b, 0, sizeof(*b));
}

/* ---- one case ------------------------------------------------------------------------------------ */

/* 1: run_case runs its schedules on f32 caches only (a cache dtype is a program of its own for the
   cache and attention kernels, built for a shape of its own). */
static int f32_cache_only;

static void run_case(int which)
{
    const feature_case k = make_case(which);
    const clmla_layer_config *c = &k.config;
    const int T = k.tokens, D = c->hidden_size, P = k.prefill;
    char desc[200];
    tu_config_describe(c, desc, sizeof(desc));
    printf("  %-24s %s\n", k.name, desc);

    tu_weights w;
    if (tu_weights_make(&w, c, 7000 + (uint64_t)which) != 0) {
        CHECK(0, "%s: out of host memory", k.name);
        return;
    }
    ref_view v;
    ref_view_make(c, &v);
    clmla_layer_weights lw = w.layer;
    biases b;
    memset(&b, 0, sizeof(b));
    if (k.biases && biases_make(&b, c, 7100 + (uint64_t)which, &lw, &v.f) != 0) {
        CHECK(0, "%s: out of host memory", k.name);
        biases_free(&b);
        tu_weights_free(&w);
        return;
    }
    float *x = tu_random_inputs(T, D, 7200 + (uint64_t)which);

    /* tau of section 4 (the rope type's factor on it included). */
    double tau = 0.0;
    const double tau_ref = mla_ref_softmax_scale_ext(&v.cfg, &v.f);
    CHECK_STATUS(clmla_layer_config_softmax_scale(c, &tau), CLMLA_SUCCESS, NULL);
    CHECK(fabs(tau - tau_ref) <= TOL_SOFTMAX_SCALE_REL * tau_ref, "%s: softmax scale %.15g, reference %.15g", k.name,
          tau, tau_ref);

    /* The schedules, and the reference for each. */
    int one[1] = {T}, decode[64], chunks[3] = {6, 4, 3};
    decode[0] = P;
    for (int i = 1; i <= T - P; i++)
        decode[i] = 1;
    const int ndecode = T - P + 1;
    int nchunks = 0;
    for (int left = T; left > 0; nchunks++) {
        if (chunks[nchunks] > left)
            chunks[nchunks] = left;
        left -= chunks[nchunks];
    }
    ref_result r_one, r_decode, r_chunks;
    memset(&r_one, 0, sizeof(r_one));
    memset(&r_decode, 0, sizeof(r_decode));
    memset(&r_chunks, 0, sizeof(r_chunks));
    const int ref_ok = x && ref_run(&v, &w.ref, T, x, one, 1, &r_one) == 0 &&
                       ref_run(&v, &w.ref, T, x, decode, ndecode, &r_decode) == 0 &&
                       ref_run(&v, &w.ref, T, x, chunks, nchunks, &r_chunks) == 0;
    CHECK(ref_ok, "%s: the reference failed", k.name);

    /* The feature is visible: off, each component moves the reference output by far more than the
       tolerance (so a library that ignored it would fail below). */
    double effect_min = INFINITY;
    for (int i = 0; ref_ok && i < MAX_OFF && k.off[i].apply; i++) {
        ref_view off = v;
        off.f.longrope_short_factor = off.short_factor; /* the copy's own lists */
        off.f.longrope_long_factor = off.long_factor;
        k.off[i].apply(&off);
        ref_result r;
        const int rc = ref_run(&off, &w.ref, T, x, decode, ndecode, &r);
        const double d = rc == 0 ? rel_diff(r.out, r_decode.out, (size_t)T * D) : 0.0;
        CHECK(rc == 0 && d > FEATURE_EFFECT_MIN, "%s: without %s the reference moves by only %.3g (need > %.3g)",
              k.name, k.off[i].what, d, FEATURE_EFFECT_MIN);
        printf("    without %-44s reference moves by %.3g\n", k.off[i].what, d);
        effect_min = fmin(effect_min, d);
        ref_result_free(&r);
    }
    if (ref_ok && k.longrope_past) {
        /* The step rule itself: the decode schedule's right answer differs from one prefill's (the
           long choice of the last step applied to every key) and from short factors everywhere. */
        const double d_one = rel_diff(r_one.out, r_decode.out, (size_t)T * D);
        const double d_chunks = rel_diff(r_chunks.out, r_decode.out, (size_t)T * D);
        CHECK(d_one > FEATURE_EFFECT_MIN && d_chunks > FEATURE_EFFECT_MIN,
              "%s: the schedules' references differ by only %.3g (one prefill) / %.3g (chunks)", k.name, d_one,
              d_chunks);
        printf("    prefill+decode vs one prefill (keys re-rotated long): reference moves by %.3g; vs chunks 6/4/3: %.3g\n",
               d_one, d_chunks);
    }

    clmla_layer *layer = NULL;
    clmla_status st = clmla_layer_create(ctx, c, &lw, &layer);
    CHECK(st == CLMLA_SUCCESS, "%s: layer_create: %s: %s", k.name, clmla_status_string(st), clmla_last_error(ctx));
    if (layer && ref_ok) {
        static const clmla_attention_path ABS = CLMLA_PATH_ABSORBED, DEC = CLMLA_PATH_DECOMPRESSED,
                                          AUTO = CLMLA_PATH_AUTO;
        static const clmla_attention_path alternate[2] = {CLMLA_PATH_ABSORBED, CLMLA_PATH_DECOMPRESSED};
        char what[300];
        double e[6];
        snprintf(what, sizeof(what), "%s: absorbed prefill of %d", k.name, T);
        e[0] = run_steps(layer, c, T, x, one, 1, &ABS, 1, CLMLA_CACHE_F32, &r_one, what);
        snprintf(what, sizeof(what), "%s: decompressed prefill of %d", k.name, T);
        e[1] = run_steps(layer, c, T, x, one, 1, &DEC, 1, CLMLA_CACHE_F32, &r_one, what);
        snprintf(what, sizeof(what), "%s: absorbed prefill %d + %d absorbed decode steps", k.name, P, T - P);
        e[2] = run_steps(layer, c, T, x, decode, ndecode, &ABS, 1, CLMLA_CACHE_F32, &r_decode, what);
        snprintf(what, sizeof(what), "%s: decompressed prefill %d + %d decompressed decode steps", k.name, P, T - P);
        e[3] = run_steps(layer, c, T, x, decode, ndecode, &DEC, 1, CLMLA_CACHE_F32, &r_decode, what);
        snprintf(what, sizeof(what), "%s: chunks 6/4/3, paths alternating", k.name);
        e[4] = run_steps(layer, c, T, x, chunks, nchunks, alternate, 2, CLMLA_CACHE_F32, &r_chunks, what);
        snprintf(what, sizeof(what), "%s: f16 cache, auto prefill of %d", k.name, T);
        e[5] = f32_cache_only ? 0.0 : run_steps(layer, c, T, x, one, 1, &AUTO, 1, CLMLA_CACHE_F16, &r_one, what);
        printf("    max rel err: prefill abs %.2e dec %.2e | decode abs %.2e dec %.2e | chunks %.2e | f16 %.2e"
               " (tol %.0e / %.0e); smallest feature effect %.3g\n",
               e[0], e[1], e[2], e[3], e[4], e[5], TOL_F32_CACHE, TOL_F16_CACHE, effect_min);
        /* 16-bit caches (and fp8, where rkv is a multiple of 128) against the reference that rounds
           its cache the same way: the output as tight as f32. */
        static const clmla_cache_dtype dts[3] = {CLMLA_CACHE_F16, CLMLA_CACHE_BF16, CLMLA_CACHE_FP8};
        static const mla_ref_cache_type rts[3] = {MLA_REF_CACHE_F16, MLA_REF_CACHE_BF16, MLA_REF_CACHE_FP8};
        static const char *const dt_names[3] = {"f16", "bf16", "fp8"};
        for (int i = 0; !f32_cache_only && i < (c->kv_lora_rank % 128 == 0 ? 3 : 2); i++) {
            ref_view vr = v;
            vr.f.cache_type = rts[i];
            ref_result r_round;
            memset(&r_round, 0, sizeof(r_round));
            CHECK(ref_run(&vr, &w.ref, T, x, decode, ndecode, &r_round) == 0, "%s: rounded reference", k.name);
            r_round.rounded = 1;
            snprintf(what, sizeof(what), "%s: %s cache against the reference rounding its cache alike, prefill %d + "
                     "decode, paths alternating", k.name, dt_names[i], P);
            const double er = r_round.out ? run_steps(layer, c, T, x, decode, ndecode, alternate, 2, dts[i], &r_round, what)
                                          : INFINITY;
            printf("    %s cache vs rounded reference: max rel err %.2e (output tol %.0e, cache one ulp)\n",
                   dt_names[i], er, TOL_F32_CACHE);
            ref_result_free(&r_round);
        }
    }
    clmla_layer_destroy(layer);
    ref_result_free(&r_one);
    ref_result_free(&r_decode);
    ref_result_free(&r_chunks);
    free(x);
    biases_free(&b);
    tu_weights_free(&w);
}

#define CASE_PART(fn, id)                                                                                          \
    static void fn(void)                                                                                           \
    {                                                                                                              \
        run_case(id);                                                                                              \
    }
CASE_PART(part_linear, CASE_LINEAR)
CASE_PART(part_yarn_attention, CASE_YARN_ATTENTION)
CASE_PART(part_yarn_no_truncate, CASE_YARN_NO_TRUNCATE)
CASE_PART(part_longrope_inside, CASE_LONGROPE_INSIDE)
CASE_PART(part_longrope_past, CASE_LONGROPE_PAST)
CASE_PART(part_llama3, CASE_LLAMA3)
CASE_PART(part_none, CASE_NONE)
CASE_PART(part_query_scale, CASE_QUERY_SCALE)
CASE_PART(part_query_scale_l, CASE_QUERY_SCALE_L)
CASE_PART(part_latent_scales, CASE_LATENT_SCALES)
/* The biases case; then its schedules on f32 caches again, in a context of its own that traces
   (CLMLA_TRACE): add_bias, and every other kernel of the steps, runs in one work-group shape the
   library gives, whatever the step's token count (13, 5, 1, 6, 4, 3). */
static void part_biases(void)
{
    run_case(CASE_BIASES);
    char path[64];
    clmla_context *outer = ctx, *traced = tu_traced_context("test_layer_features", path, sizeof(path));
    CHECK(traced != NULL, "biases: no context that traces");
    if (!traced)
        return;
    ctx = traced;
    f32_cache_only = 1;
    run_case(CASE_BIASES);
    f32_cache_only = 0;
    ctx = outer;
    const int bad = tu_traced_context_shapes(traced, path);
    CHECK(bad == 0, "biases: %d kernel(s) ran in more than one work-group shape or in the driver's", bad);
}
CASE_PART(part_biases_q_proj, CASE_BIASES_Q_PROJ)

static const tu_part parts[] = {
    {"linear", part_linear},
    {"yarn-attention-factor", part_yarn_attention},
    {"yarn-no-truncate", part_yarn_no_truncate},
    {"longrope-inside", part_longrope_inside},
    {"longrope-past", part_longrope_past},
    {"llama3", part_llama3},
    {"none", part_none},
    {"query-scale", part_query_scale},
    {"query-scale-interval-L", part_query_scale_l},
    {"latent-scales", part_latent_scales},
    {"biases", part_biases},
    {"biases-q-proj", part_biases_q_proj},
};

int main(int argc, char **argv)
{
    _Static_assert(sizeof(parts) / sizeof(parts[0]) == NUM_CASES, "one part per case");
    return tu_parts_exit(
        tu_run_parts(argc, argv, parts, (int)(sizeof(parts) / sizeof(parts[0])), NULL, &ctx, &check_failed));
}
