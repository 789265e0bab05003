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
