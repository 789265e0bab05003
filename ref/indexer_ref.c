/*
 * indexer_ref.c: float64 reference of the lightning indexer and its top-k selection.
 * See indexer_ref.h for the API and shared/design/DSA.md for the math.
 */
#include "indexer_ref.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------------------------ */

/* sum_j W[j] x[j] of a float32 row and a double vector, in double. */
static double dot_fd(const float *w /* [n] */, const double *x /* [n] */, int n)
{
    double s = 0.0;
    for (int j = 0; j < n; j++)
        s += (double)w[j] * x[j];
    return s;
}

/* The same for a float32 row and a float32 vector. */
static double dot_ff(const float *w /* [n] */, const float *x /* [n] */, int n)
{
    double s = 0.0;
    for (int j = 0; j < n; j++)
        s += (double)w[j] * (double)x[j];
    return s;
}

static int config_ok(const idx_ref_config *cfg)
{
    return cfg && cfg->heads >= 1 && cfg->head_dim >= 1 && cfg->rope_dim >= 0 && cfg->rope_dim % 2 == 0 &&
           cfg->rope_dim <= cfg->head_dim;
}

/* ---- RoPE --------------------------------------------------------------------------------------- */

void idx_ref_rope_row(const mla_ref_config *cfg, const mla_ref_features *f, long pos, double *c, double *s)
{
    const int half = cfg->rope_dim / 2;
    double *inv_freq = malloc(((size_t)half + 1) * sizeof(double));
    double amplitude = 1.0;
    if (!inv_freq)
        return;
    mla_ref_rope_tables_ext(cfg, f, pos, inv_freq, &amplitude);
    for (int i = 0; i < half; i++) {
        const double angle = (double)pos * inv_freq[i];
        c[i] = amplitude * cos(angle);
        s[i] = amplitude * sin(angle);
    }
    free(inv_freq);
}

void idx_ref_rope(double *x, int dr, int interleave, const double *c, const double *s)
{
    for (int i = 0; i < dr / 2; i++) {
        const int a = interleave ? 2 * i : i;             /* the pair (x[a], x[b]) */
        const int b = interleave ? 2 * i + 1 : i + dr / 2;
        const double x0 = x[a], x1 = x[b];
        x[a] = x0 * c[i] - x1 * s[i];
        x[b] = x0 * s[i] + x1 * c[i];
    }
}

/* ---- projections -------------------------------------------------------------------------------- */

int idx_ref_key(const idx_ref_config *cfg, const float *wk, const float *norm_weight, const float *norm_bias,
                const float *x, const double *c, const double *s, double *k)
{
    if (!config_ok(cfg) || cfg->hidden < 1 || !wk || !norm_weight || !norm_bias || !x || !k ||
        (cfg->rope_dim > 0 && (!c || !s)))
        return -1;
    const int dI = cfg->head_dim, D = cfg->hidden;
    const double eps = cfg->norm_eps > 0.0 ? cfg->norm_eps : 1e-6;

    /* k = W_k x */
    for (int i = 0; i < dI; i++)
        k[i] = dot_ff(wk + (size_t)i * D, x, D);

    /* LayerNorm with the population variance */
    double mean = 0.0;
    for (int i = 0; i < dI; i++)
        mean += k[i];
    mean /= dI;
    double var = 0.0;
    for (int i = 0; i < dI; i++)
        var += (k[i] - mean) * (k[i] - mean);
    var /= dI;
    const double inv = 1.0 / sqrt(var + eps);
    for (int i = 0; i < dI; i++)
        k[i] = (k[i] - mean) * inv * (double)norm_weight[i] + (double)norm_bias[i];

    /* RoPE on the first dr dims */
    idx_ref_rope(k, cfg->rope_dim, cfg->rope_interleave, c, s);
    return 0;
}

int idx_ref_queries(const idx_ref_config *cfg, const float *wq, const double *cq, const double *c, const double *s,
                    double *q)
{
    if (!config_ok(cfg) || cfg->q_lora_rank < 1 || !wq || !cq || !q || (cfg->rope_dim > 0 && (!c || !s)))
        return -1;
    const int H = cfg->heads, dI = cfg->head_dim, rq = cfg->q_lora_rank;
    for (int h = 0; h < H; h++) {
        double *qh = q + (size_t)h * dI; /* [d_I]: rope part first, then the rest */
        for (int i = 0; i < dI; i++)
            qh[i] = dot_fd(wq + ((size_t)h * dI + i) * rq, cq, rq);
        idx_ref_rope(qh, cfg->rope_dim, cfg->rope_interleave, c, s);
    }
    return 0;
}

int idx_ref_head_weights(const idx_ref_config *cfg, const float *ww, const float *x, double *w)
{
    if (!config_ok(cfg) || cfg->hidden < 1 || !ww || !x || !w)
        return -1;
    for (int h = 0; h < cfg->heads; h++)
        w[h] = dot_ff(ww + (size_t)h * cfg->hidden, x, cfg->hidden);
    return 0;
}

double idx_ref_weight_scale(int heads, int head_dim)
{
    return 1.0 / sqrt((double)heads * (double)head_dim);
}

/* ---- scores ------------------------------------------------------------------------------------- */

void idx_ref_scores(int heads, int head_dim, const double *q, const double *w, double scale, int n_keys,
                    const double *keys, double *scores)
{
    for (int j = 0; j < n_keys; j++) {
        const double *kj = keys + (size_t)j * head_dim; /* [d_I] */
        double sum = 0.0;
        for (int h = 0; h < heads; h++) {
            const double *qh = q + (size_t)h * head_dim;
            double l = 0.0;
            for (int d = 0; d < head_dim; d++)
                l += qh[d] * kj[d];
            sum += w[h] * (l > 0.0 ? l : 0.0);
        }
        scores[j] = scale * sum;
    }
}

double idx_ref_score_bound(int heads, int head_dim, const double *q, const double *w, double scale, int n_keys,
                           const double *keys, int half_precision)
{
    const double u = half_precision ? ldexp(1.0, -11) : ldexp(1.0, -24);
    const double n = (double)head_dim + (double)heads + 4.0;
    const double gamma = n * u / (1.0 - n * u);
    double most = 0.0;
    for (int j = 0; j < n_keys; j++) {
        const double *kj = keys + (size_t)j * head_dim;
        double b = 0.0;
        for (int h = 0; h < heads; h++) {
            const double *qh = q + (size_t)h * head_dim;
            double a = 0.0;
            for (int d = 0; d < head_dim; d++)
                a += fabs(qh[d] * kj[d]);
            b += fabs(scale * w[h]) * a;
        }
        if (b > most)
            most = b;
    }
    return gamma * most;
}

/* ---- top-k -------------------------------------------------------------------------------------- */

/* The ranking of DSA.md section 4 as a qsort order over positions: score descending, then position
   ascending (the earlier position wins a tie). */
static const double *rank_scores;

static int rank_order(const void *pa, const void *pb)
{
    const int a = *(const int *)pa, b = *(const int *)pb;
    if (rank_scores[a] != rank_scores[b])
        return rank_scores[a] > rank_scores[b] ? -1 : 1;
    return a < b ? -1 : a > b ? 1 : 0;
}

/* Positions 0 .. n-1 sorted by rank; NULL when out of memory. Not thread-safe (rank_scores). */
static int *ranked_positions(const double *scores, int n)
{
    int *order = malloc(((size_t)n + 1) * sizeof(int));
    if (!order)
        return NULL;
    for (int i = 0; i < n; i++)
        order[i] = i;
    rank_scores = scores;
    qsort(order, (size_t)n, sizeof(int), rank_order);
    rank_scores = NULL;
    return order;
}

int idx_ref_topk(const double *scores, int n_visible, int top_k, int32_t *selected)
{
    if (top_k < 1 || n_visible < 0 || !selected || (n_visible > 0 && !scores))
        return -1;
    int *order = ranked_positions(scores, n_visible);
    if (!order)
        return -1;
    const int n = n_visible < top_k ? n_visible : top_k;
    for (int i = 0; i < top_k; i++)
        selected[i] = i < n ? order[i] : -1;
    free(order);
    return n;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void say(char *why, size_t size, const char *fmt, ...)
{
    if (!why || !size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, size, fmt, ap);
    va_end(ap);
}

int idx_ref_selection_ok(const double *scores, int n_visible, int top_k, double eps, const int32_t *selected,
                         int *strict, char *why, size_t why_size)
{
    if (strict)
        *strict = 0;
    if (why && why_size)
        why[0] = '\0';
    if (top_k < 1 || n_visible < 0 || !selected || (n_visible > 0 && !scores) || !(eps >= 0.0))
        return -1;
    const int n = n_visible < top_k ? n_visible : top_k;

    /* shape: n distinct visible positions, then -1 */
    unsigned char *taken = calloc((size_t)n_visible + 1, 1);
    if (!taken)
        return -1;
    int ok = 1;
    for (int i = 0; i < top_k && ok; i++) {
        const int32_t p = selected[i];
        if (i >= n) {
            if (p != -1) {
                say(why, why_size, "entry %d is %d, expected the padding -1 past the n_t = %d selected", i, p, n);
                ok = 0;
            }
        } else if (p < 0 || p >= n_visible) {
            say(why, why_size, "entry %d is %d, not a visible position (0 .. %d)", i, p, n_visible - 1);
            ok = 0;
        } else if (taken[p]) {
            say(why, why_size, "entry %d repeats position %d", i, (int)p);
            ok = 0;
        } else {
            taken[p] = 1;
        }
    }
    if (!ok || n == 0) {
        if (ok && strict)
            *strict = 1;
        free(taken);
        return ok;
    }

    int *order = ranked_positions(scores, n_visible);
    if (!order) {
        free(taken);
        return -1;
    }
    const double vk = scores[order[n - 1]];
    const int separated = n_visible <= top_k || vk - scores[order[n]] > 2.0 * eps;
    if (strict)
        *strict = separated;
    if (separated) {
        /* the reference's own set (ties at the boundary are impossible here) */
        for (int i = 0; i < n && ok; i++)
            if (!taken[order[i]]) {
                say(why, why_size, "position %d (rank %d, score %.9g) is not selected; the boundary gap %.3g exceeds "
                    "2 eps",
                    order[i], i, scores[order[i]], n_visible > top_k ? vk - scores[order[n]] : INFINITY);
                ok = 0;
            }
    } else {
        for (int p = 0; p < n_visible && ok; p++) {
            if (taken[p] && scores[p] < vk - 2.0 * eps) {
                say(why, why_size, "selected position %d (of %d visible) scores %.9g, below v_K - 2 eps = %.9g", p,
                    n_visible, scores[p], vk - 2.0 * eps);
                ok = 0;
            } else if (!taken[p] && scores[p] > vk + 2.0 * eps) {
                say(why, why_size, "unselected position %d (of %d visible) scores %.9g, above v_K + 2 eps = %.9g", p,
                    n_visible, scores[p], vk + 2.0 * eps);
                ok = 0;
            }
        }
    }
    free(order);
    free(taken);
    return ok;
}

/* ---- DeepSeek's FP8 index keys --------------------------------------------------------------------- */

int idx_ref_hadamard(double *x, int n)
{
    if (n < 1 || (n & (n - 1)) != 0)
        return -1;
    /* H x by its definition, one output at a time (O(n^2): clarity over speed) */
    double *y = malloc((size_t)n * sizeof(double));
    if (!y)
        return -1;
    for (int i = 0; i < n; i++) {
        double sum = 0.0;
        for (int j = 0; j < n; j++)
            sum += (__builtin_popcount((unsigned)(i & j)) & 1) ? -x[j] : x[j];
        y[i] = sum / sqrt((double)n);
    }
    memcpy(x, y, (size_t)n * sizeof(double));
    free(y);
    return 0;
}

double idx_ref_quantize_fp8(double *x, int n)
{
    double amax = 0.0;
    for (int i = 0; i < n; i++)
        amax = fabs(x[i]) > amax ? fabs(x[i]) : amax;
    const double s = pow(2.0, ceil(log2((amax > 1e-4 ? amax : 1e-4) / 448.0)));
    for (int i = 0; i < n; i++)
        x[i] = mla_ref_round_e4m3(x[i] / s) * s;
    return s;
}

/* ---- a whole sparse-attention layer -------------------------------------------------------------- */

/* One token's output from its latent attention output: o_h = W^UV_h o-bar_h, then o_proj (and its
   bias). o: [H, dv] room. */
static void output_row(const mla_ref_config *cfg, const mla_ref_features *f, const mla_ref_weights *w,
                       const double *latent /* [H, rkv] */, double *o, double *out /* [D] */)
{
    const int D = cfg->hidden, H = cfg->heads, rkv = cfg->kv_lora_rank, dn = cfg->nope_dim, dv = cfg->v_dim;
    for (int h = 0; h < H; h++)
        for (int j = 0; j < dv; j++) {
            const float *row = w->kv_b_proj + ((size_t)h * (dn + dv) + dn + j) * rkv;
            o[(size_t)h * dv + j] = dot_fd(row, latent + (size_t)h * rkv, rkv);
        }
    for (int i = 0; i < D; i++)
        out[i] = dot_fd(w->o_proj + (size_t)i * H * dv, o, H * dv) + (f && f->o_proj_bias ? f->o_proj_bias[i] : 0.0);
}

int idx_ref_shared_forward(const mla_ref_config *cfg, const mla_ref_features *f, const mla_ref_weights *w, int top_k,
                           int T, const float *x, const int32_t *selected, double *out)
{
    if (!cfg || !w || !x || !selected || !out || top_k < 1 || T < 1)
        return -1;
    const int D = cfg->hidden, H = cfg->heads, rkv = cfg->kv_lora_rank, dr = cfg->rope_dim, dv = cfg->v_dim;
    const size_t n = (size_t)T;
    double *dense = malloc(n * D * sizeof(double)), *ckv = malloc(n * rkv * sizeof(double));
    double *kr = malloc(n * dr * sizeof(double)), *qt = malloc(n * H * rkv * sizeof(double));
    double *qr = malloc(n * H * dr * sizeof(double)), *latent = malloc((size_t)H * rkv * sizeof(double));
    double *lse = malloc((size_t)H * sizeof(double)), *o = malloc((size_t)H * dv * sizeof(double));
    int *sel = malloc((size_t)top_k * sizeof(int));
    int rc = -1;
    if (!dense || !ckv || !kr || !qt || !qr || !latent || !lse || !o || !sel)
        goto done;
    if (mla_ref_forward_ext(cfg, f, w, T, x, NULL, 0, MLA_REF_ABSORBED, dense, ckv, kr, qt, qr, NULL, NULL) != 0)
        goto done;
    const double tau = mla_ref_softmax_scale_ext(cfg, f);
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < top_k; k++) {
            const int32_t s = selected[(size_t)t * top_k + k];
            if (s > t) /* a key the token cannot see: the selection is not a causal one */
                goto done;
            sel[k] = s;
        }
        mla_ref_sparse_latent_attention(H, rkv, dr, tau, t + 1, sel, top_k, qt + (size_t)t * H * rkv,
                                        qr + (size_t)t * H * dr, ckv, kr, latent, lse);
        output_row(cfg, f, w, latent, o, out + (size_t)t * D);
    }
    rc = 0;
done:
    free(dense), free(ckv), free(kr), free(qt), free(qr), free(latent), free(lse), free(o), free(sel);
    return rc;
}

int idx_ref_dsa_forward(const mla_ref_config *cfg, const mla_ref_features *f, const mla_ref_weights *w,
                        const idx_ref_config *icfg, const idx_ref_weights *iw, int top_k, mla_ref_cache_type key_type, int T,
                        const float *x, double *out, int32_t *selected, int *ambiguous)
{
    if (!cfg || !w || !config_ok(icfg) || !iw || !x || !out || top_k < 1 || T < 1 || cfg->q_lora_rank < 1 ||
        (key_type != MLA_REF_CACHE_F32 && key_type != MLA_REF_CACHE_F16 && key_type != MLA_REF_CACHE_BF16 &&
         key_type != MLA_REF_CACHE_FP8) ||
        (key_type == MLA_REF_CACHE_FP8 && (icfg->head_dim & (icfg->head_dim - 1)) != 0) ||
        icfg->rope_dim != cfg->rope_dim || !w->q_a_proj || !w->q_a_layernorm || !iw->wq_b || !iw->wk || !iw->k_norm ||
        !iw->k_norm_bias || !iw->weights_proj)
        return -1;
    const int D = cfg->hidden, H = cfg->heads, rq = cfg->q_lora_rank, rkv = cfg->kv_lora_rank, dr = cfg->rope_dim;
    const int dv = cfg->v_dim, HI = icfg->heads, dI = icfg->head_dim;
    const size_t n = (size_t)T;
    double *dense = malloc(n * D * sizeof(double)), *ckv = malloc(n * rkv * sizeof(double));
    double *kr = malloc(n * dr * sizeof(double)), *qt = malloc(n * H * rkv * sizeof(double));
    double *qr = malloc(n * H * dr * sizeof(double)), *keys = malloc(n * dI * sizeof(double));
    double *q = malloc((size_t)HI * dI * sizeof(double)), *wt = malloc((size_t)HI * sizeof(double));
    double *cq = malloc((size_t)rq * sizeof(double)), *c = malloc(((size_t)dr / 2 + 1) * sizeof(double));
    double *sn = malloc(((size_t)dr / 2 + 1) * sizeof(double)), *scores = malloc(n * sizeof(double));
    double *latent = malloc((size_t)H * rkv * sizeof(double)), *lse = malloc((size_t)H * sizeof(double));
    double *o = malloc((size_t)H * dv * sizeof(double));
    int32_t *sel = malloc((size_t)top_k * sizeof(int32_t));
    int rc = -1;
    if (!dense || !ckv || !kr || !qt || !qr || !keys || !q || !wt || !cq || !c || !sn || !scores || !latent || !lse ||
        !o || !sel)
        goto done;
    /* MLA's per-token quantities (the cache's rounding applied to c^KV and k^R) */
    if (mla_ref_forward_ext(cfg, f, w, T, x, NULL, 0, MLA_REF_ABSORBED, dense, ckv, kr, qt, qr, NULL, NULL) != 0)
        goto done;
    for (int t = 0; t < T; t++) {
        idx_ref_rope_row(cfg, f, t, c, sn);
        if (idx_ref_key(icfg, iw->wk, iw->k_norm, iw->k_norm_bias, x + (size_t)t * D, c, sn, keys + (size_t)t * dI) != 0)
            goto done;
        if (key_type == MLA_REF_CACHE_FP8) {
            idx_ref_hadamard(keys + (size_t)t * dI, dI);
            idx_ref_quantize_fp8(keys + (size_t)t * dI, dI);
        }
        for (int d = 0; (key_type == MLA_REF_CACHE_F16 || key_type == MLA_REF_CACHE_BF16) && d < dI; d++)
            keys[(size_t)t * dI + d] = key_type == MLA_REF_CACHE_BF16 ? mla_ref_round_bf16(keys[(size_t)t * dI + d])
                                                                      : mla_ref_round_f16(keys[(size_t)t * dI + d]);
    }
    const double wscale = idx_ref_weight_scale(HI, dI), tau = mla_ref_softmax_scale_ext(cfg, f);
    const double q_scale = f && f->q_latent_scale > 0 ? f->q_latent_scale : 1.0;
    int unclear = 0;
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * D;
        /* c^Q = RMSNorm(q_a_proj x) (its bias, latent scale as MLA's) */
        double ss = 0.0;
        for (int i = 0; i < rq; i++) {
            cq[i] = dot_ff(w->q_a_proj + (size_t)i * D, xt, D) + (f && f->q_a_proj_bias ? f->q_a_proj_bias[i] : 0.0);
            ss += cq[i] * cq[i];
        }
        const double inv = 1.0 / sqrt(ss / rq + cfg->rms_eps);
        for (int i = 0; i < rq; i++)
            cq[i] = cq[i] * inv * (double)w->q_a_layernorm[i] * q_scale;
        idx_ref_rope_row(cfg, f, t, c, sn);
        if (idx_ref_queries(icfg, iw->wq_b, cq, c, sn, q) != 0 || idx_ref_head_weights(icfg, iw->weights_proj, xt, wt) != 0)
            goto done;
        for (int h = 0; key_type == MLA_REF_CACHE_FP8 && h < HI; h++) /* the keys' rotation */
            idx_ref_hadamard(q + (size_t)h * dI, dI);
        const int visible = t + 1;
        idx_ref_scores(HI, dI, q, wt, wscale, visible, keys, scores);
        const int chosen = idx_ref_topk(scores, visible, top_k, sel);
        if (chosen < 0)
            goto done;
        if (visible > top_k) {
            const double eps = idx_ref_score_bound(HI, dI, q, wt, wscale, visible, keys, 0);
            int strict = 0;
            if (idx_ref_selection_ok(scores, visible, top_k, eps, sel, &strict, NULL, 0) != 1 || !strict)
                unclear++;
        }
        if (selected)
            memcpy(selected + (size_t)t * top_k, sel, (size_t)top_k * sizeof(int32_t));
        mla_ref_sparse_latent_attention(H, rkv, dr, tau, visible, sel, top_k, qt + (size_t)t * H * rkv,
                                        qr + (size_t)t * H * dr, ckv, kr, latent, lse);
        output_row(cfg, f, w, latent, o, out + (size_t)t * D);
    }
    if (ambiguous)
        *ambiguous = unclear;
    rc = 0;
done:
    free(dense), free(ckv), free(kr), free(qt), free(qr), free(keys), free(q), free(wt), free(cq), free(c), free(sn);
    free(scores), free(latent), free(lse), free(o), free(sel);
    return rc;
}
