/*
 * test_ref.c: self-test of the float64 MLA reference (mla_ref.c).
 *
 * Prints one line per check ("PASS name: detail" or "FAIL name: detail") and a final line
 * "N passed, N failed". Exit status 0 only when every check passes.
 */
#include "indexer_ref.h"
#include "mla_ref.h"
#include "free_all.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

static int g_passed, g_failed;

static void check(int ok, const char *name, const char *fmt, ...)
{
    va_list ap;
    printf("%s %s: ", ok ? "PASS" : "FAIL", name);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (ok)
        g_passed++;
    else
        g_failed++;
}

/* ------------------------------------------------------------------------------------------ */
/* Deterministic random numbers (splitmix64)                                                   */
/* ------------------------------------------------------------------------------------------ */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static void rng_seed(uint64_t s)
{
    g_rng = s;
}

static uint64_t rng_next(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-0.5, 0.5). */
static double rng_unif(void)
{
    return (double)(rng_next() >> 11) * (1.0 / 9007199254740992.0) - 0.5;
}

/* ------------------------------------------------------------------------------------------ */
/* Random layers                                                                               */
/* ------------------------------------------------------------------------------------------ */

typedef struct layer {
    mla_ref_config cfg;
    mla_ref_weights w;
    float *q_a_proj;      /* [rq, D] or NULL */
    float *q_a_layernorm; /* [rq] or NULL */
    float *q_b_proj;      /* [H*dq, rq] or NULL */
    float *q_proj;        /* [H*dq, D] or NULL */
    float *kv_a;          /* [rkv+dr, D] */
    float *kv_a_ln;       /* [rkv] */
    float *kv_b;          /* [H*(dn+dv), rkv] */
    float *o_proj;        /* [D, H*dv] */
} layer;

/* rows x cols matrix with entries U(-0.5, 0.5) / sqrt(cols). */
static float *rand_matrix(size_t rows, size_t cols)
{
    float *m = malloc(rows * cols * sizeof *m);
    if (!m) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    const double k = 1.0 / sqrt((double)cols);
    for (size_t i = 0; i < rows * cols; i++)
        m[i] = (float)(rng_unif() * k);
    return m;
}

/* Norm weights around 1: 1 + U(-0.25, 0.25). */
static float *rand_norm(size_t n)
{
    float *v = malloc(n * sizeof *v);
    if (!v) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(1.0 + 0.5 * rng_unif());
    return v;
}

static layer make_layer(const mla_ref_config *cfg, uint64_t seed)
{
    layer L;
    memset(&L, 0, sizeof L);
    L.cfg = *cfg;
    rng_seed(seed);
    const size_t D = (size_t)cfg->hidden, H = (size_t)cfg->heads, rq = (size_t)cfg->q_lora_rank;
    const size_t rkv = (size_t)cfg->kv_lora_rank, dn = (size_t)cfg->nope_dim;
    const size_t dr = (size_t)cfg->rope_dim, dv = (size_t)cfg->v_dim, dq = dn + dr;
    if (rq > 0) {
        L.q_a_proj = rand_matrix(rq, D);
        L.q_a_layernorm = rand_norm(rq);
        L.q_b_proj = rand_matrix(H * dq, rq);
    } else {
        L.q_proj = rand_matrix(H * dq, D);
    }
    L.kv_a = rand_matrix(rkv + dr, D);
    L.kv_a_ln = rand_norm(rkv);
    L.kv_b = rand_matrix(H * (dn + dv), rkv);
    L.o_proj = rand_matrix(D, H * dv);
    L.w.q_a_proj = L.q_a_proj;
    L.w.q_a_layernorm = L.q_a_layernorm;
    L.w.q_b_proj = L.q_b_proj;
    L.w.q_proj = L.q_proj;
    L.w.kv_a_proj_with_mqa = L.kv_a;
    L.w.kv_a_layernorm = L.kv_a_ln;
    L.w.kv_b_proj = L.kv_b;
    L.w.o_proj = L.o_proj;
    return L;
}

static void free_layer(layer *L)
{
    FREE_ALL(L->q_a_proj, L->q_a_layernorm, L->q_b_proj, L->q_proj, L->kv_a, L->kv_a_ln, L->kv_b, L->o_proj);
}

/* T x D input tokens, U(-1, 1). */
static float *rand_input(int T, int D, uint64_t seed)
{
    rng_seed(seed);
    float *x = malloc((size_t)T * (size_t)D * sizeof *x);
    if (!x) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < (size_t)T * (size_t)D; i++)
        x[i] = (float)(2.0 * rng_unif());
    return x;
}

static double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* max|a-b| / max|b| in double (inf if anything is non-finite). */
static double rel_err_dd(const double *a, const double *b, size_t n)
{
    double md = 0.0, mb = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs(a[i] - b[i]);
        if (!isfinite(d))
            return INFINITY;
        if (d > md)
            md = d;
        if (fabs(b[i]) > mb)
            mb = fabs(b[i]);
    }
    return mb > 0.0 ? md / mb : md;
}

/* ------------------------------------------------------------------------------------------ */
/* Configurations                                                                              */
/* ------------------------------------------------------------------------------------------ */

static mla_ref_config base_config(int D, int H, int rq, int rkv, int dn, int dr, int dv)
{
    mla_ref_config c;
    memset(&c, 0, sizeof c);
    c.hidden = D;
    c.heads = H;
    c.q_lora_rank = rq;
    c.kv_lora_rank = rkv;
    c.nope_dim = dn;
    c.rope_dim = dr;
    c.v_dim = dv;
    c.rms_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.rope_half_split = 0;
    c.yarn_factor = 1.0; /* off */
    c.yarn_original_max_pos = 4096.0;
    c.yarn_beta_fast = 32.0;
    c.yarn_beta_slow = 1.0;
    c.yarn_mscale = 1.0;
    c.yarn_mscale_all_dim = 1.0;
    return c;
}

static void set_yarn(mla_ref_config *c, double s, double mscale, double mscale_all_dim)
{
    c->yarn_factor = s;
    c->yarn_mscale = mscale;
    c->yarn_mscale_all_dim = mscale_all_dim;
}

/* DeepSeek-V2/V3 style RoPE dims (dr = 64, dn = 128). */
static mla_ref_config deepseek_rope_config(double s, double mscale, double mscale_all_dim)
{
    mla_ref_config c = base_config(64, 1, 0, 16, 128, 64, 16);
    set_yarn(&c, s, mscale, mscale_all_dim);
    return c;
}

/* ------------------------------------------------------------------------------------------ */
/* Checks                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static void test_yarn_bounds_and_freqs(void)
{
    mla_ref_config c = deepseek_rope_config(40.0, 0.707, 0.707);
    double low = -1.0, high = -1.0;
    mla_ref_yarn_bounds(&c, &low, &high);
    check(low == 10.0 && high == 23.0, "yarn_bounds_v2", "low=%g high=%g (want 10, 23)", low, high);

    /* inv_freq: unchanged below low, divided by s from high on, linear blend in between. */
    double inv[32], A = 0.0;
    mla_ref_rope_tables(&c, inv, &A);
    double worst = 0.0;
    for (int i = 0; i < 32; i++) {
        const double base = pow(1e4, -2.0 * i / 64.0);
        double ramp = (i - 10.0) / 13.0;
        ramp = ramp < 0.0 ? 0.0 : (ramp > 1.0 ? 1.0 : ramp);
        const double want = base * (1.0 - ramp) + base * ramp / 40.0;
        const double e = fabs(inv[i] - want) / want;
        if (e > worst)
            worst = e;
    }
    const int regions_ok = inv[0] == 1.0 && fabs(inv[31] - pow(1e4, -62.0 / 64.0) / 40.0) <
                                                1e-15 * inv[31];
    check(worst < 1e-14 && regions_ok && A == 1.0, "yarn_inv_freq_v2",
          "max rel err %.3g, inv_freq[0]=%g, inv_freq[31]*40/base=%.15g, A=%g", worst, inv[0],
          inv[31] * 40.0 / pow(1e4, -62.0 / 64.0), A);

    /* YaRN off: plain theta^(-2i/dr), amplitude 1. */
    mla_ref_config off = deepseek_rope_config(1.0, 0.707, 0.707);
    mla_ref_rope_tables(&off, inv, &A);
    worst = 0.0;
    for (int i = 0; i < 32; i++) {
        const double want = pow(1e4, -2.0 * i / 64.0);
        const double e = fabs(inv[i] - want) / want;
        if (e > worst)
            worst = e;
    }
    check(worst < 1e-15 && A == 1.0, "rope_tables_plain", "max rel err %.3g, A=%g", worst, A);
}

static void test_softmax_scales(void)
{
    /* Published values (docs/MLA.md section 4) carry 6 decimals, so the check is that the exact
       formula rounds to them: |tau - published| <= 0.5e-6. */
    struct {
        const char *name;
        double s, mscale_all_dim, published;
    } cases[] = {
        { "scale_v2", 40.0, 0.707, 0.114721 },
        { "scale_v3", 40.0, 1.0, 0.135234 },
        { "scale_kimi_k2", 32.0, 1.0, 0.130861 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        mla_ref_config c = deepseek_rope_config(cases[k].s, cases[k].mscale_all_dim,
                                                 cases[k].mscale_all_dim);
        const double tau = mla_ref_softmax_scale(&c);
        const double d = fabs(tau - cases[k].published);
        check(d <= 0.5e-6, cases[k].name, "tau=%.10f published=%.6f |diff|=%.2g (rel %.2g)", tau,
              cases[k].published, d, d / cases[k].published);
    }
    mla_ref_config off = deepseek_rope_config(1.0, 1.0, 1.0);
    const double tau = mla_ref_softmax_scale(&off);
    check(tau == 1.0 / sqrt(192.0), "scale_yarn_off", "tau=%.17g want 1/sqrt(192)=%.17g", tau,
          1.0 / sqrt(192.0));
}

static void test_rope(void)
{
    /* mscale != mscale_all_dim so that the amplitude A differs from 1. */
    mla_ref_config c = deepseek_rope_config(40.0, 1.0, 0.707);
    double inv[32], A = 0.0;
    mla_ref_rope_tables(&c, inv, &A);
    const double A_want = (0.1 * 1.0 * log(40.0) + 1.0) / (0.1 * 0.707 * log(40.0) + 1.0);
    check(fabs(A - A_want) < 1e-15 && fabs(A - 1.0) > 0.05, "rope_amplitude", "A=%.15g want %.15g",
          A, A_want);

    double x0[64];
    rng_seed(1234);
    for (int i = 0; i < 64; i++)
        x0[i] = rng_unif();

    for (int hs = 0; hs <= 1; hs++) {
        c.rope_half_split = hs;
        const int half = 32;
        /* Norm of every pair is multiplied by exactly A. */
        double x[64];
        memcpy(x, x0, sizeof x);
        mla_ref_rope_apply(&c, x, 1000);
        double worst = 0.0;
        for (int i = 0; i < half; i++) {
            const int ia = hs ? i : 2 * i, ib = hs ? i + half : 2 * i + 1;
            const double n0 = hypot(x0[ia], x0[ib]);
            const double n1 = hypot(x[ia], x[ib]);
            const double e = fabs(n1 - A * n0) / (A * n0);
            if (e > worst)
                worst = e;
        }
        double moved = 0.0;
        for (int i = 0; i < 64; i++)
            moved = fmax(moved, fabs(x[i] - A * x0[i]));
        char name[64];
        snprintf(name, sizeof name, "rope_pair_norm_%s", hs ? "half" : "interleaved");
        check(worst < 1e-13 && moved > 1e-3, name,
              "max rel err of |pair'| vs A|pair| = %.3g, max|x'-Ax| = %.3g", worst, moved);

        /* Position 0: identity times A. */
        memcpy(x, x0, sizeof x);
        mla_ref_rope_apply(&c, x, 0);
        double e0 = 0.0;
        for (int i = 0; i < 64; i++)
            e0 = fmax(e0, fabs(x[i] - A * x0[i]));
        snprintf(name, sizeof name, "rope_pos0_%s", hs ? "half" : "interleaved");
        check(e0 < 1e-15, name, "max|x' - A x| = %.3g", e0);

        /* Unit vector in the first slot of pair 0 (inv_freq[0] = 1) at position 3. */
        memset(x, 0, sizeof x);
        x[0] = 1.0;
        mla_ref_rope_apply(&c, x, 3);
        const int ib = hs ? half : 1;
        double other = 0.0;
        for (int i = 0; i < 64; i++)
            if (i != 0 && i != ib)
                other = fmax(other, fabs(x[i]));
        snprintf(name, sizeof name, "rope_pair0_value_%s", hs ? "half" : "interleaved");
        check(fabs(x[0] - A * cos(3.0)) < 1e-15 && fabs(x[ib] - A * sin(3.0)) < 1e-15 &&
                  other == 0.0,
              name, "x'[0]=%.15g (want %.15g), x'[%d]=%.15g (want %.15g), others max %.3g", x[0],
              A * cos(3.0), ib, x[ib], A * sin(3.0), other);

        /* Relative position: <R(q,m), R(k,n)> depends on m - n only. */
        double q[64], k[64], q2[64], k2[64];
        rng_seed(99);
        for (int i = 0; i < 64; i++) {
            q[i] = rng_unif();
            k[i] = rng_unif();
        }
        memcpy(q2, q, sizeof q);
        memcpy(k2, k, sizeof k);
        mla_ref_rope_apply(&c, q, 17);
        mla_ref_rope_apply(&c, k, 5);
        mla_ref_rope_apply(&c, q2, 17 + 300);
        mla_ref_rope_apply(&c, k2, 5 + 300);
        double d1 = 0.0, d2 = 0.0;
        for (int i = 0; i < 64; i++) {
            d1 += q[i] * k[i];
            d2 += q2[i] * k2[i];
        }
        snprintf(name, sizeof name, "rope_relative_%s", hs ? "half" : "interleaved");
        check(fabs(d1 - d2) <= 1e-12 * fabs(d1), name, "<q17,k5>=%.15g <q317,k305>=%.15g", d1, d2);
    }

    /* The two pairings give different results on the same input. */
    double xi[64], xh[64];
    memcpy(xi, x0, sizeof xi);
    memcpy(xh, x0, sizeof xh);
    c.rope_half_split = 0;
    mla_ref_rope_apply(&c, xi, 7);
    c.rope_half_split = 1;
    mla_ref_rope_apply(&c, xh, 7);
    double diff = 0.0;
    for (int i = 0; i < 64; i++)
        diff = fmax(diff, fabs(xi[i] - xh[i]));
    check(diff > 1e-3, "rope_pairings_differ", "max|interleaved - half| = %.3g at pos 7", diff);
}

/* Both paths on the same layer and input; compares every output. */
static void test_paths_agree(const char *shape, mla_ref_config cfg, uint64_t seed)
{
    static const int Ts[] = { 1, 7, 33 };
    for (int hs = 0; hs <= 1; hs++) {
        cfg.rope_half_split = hs;
        layer L = make_layer(&cfg, seed);
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            const int T = Ts[k];
            const size_t D = (size_t)cfg.hidden, H = (size_t)cfg.heads;
            const size_t rkv = (size_t)cfg.kv_lora_rank;
            float *x = rand_input(T, cfg.hidden, seed + 1000 + (uint64_t)T);
            double *out[2], *lat[2], *lse[2], *qt[2];
            int rc[2];
            for (int p = 0; p < 2; p++) {
                out[p] = dalloc((size_t)T * D);
                lat[p] = dalloc((size_t)T * H * rkv);
                lse[p] = dalloc((size_t)T * H);
                qt[p] = dalloc((size_t)T * H * rkv);
                rc[p] = mla_ref_forward(&L.cfg, &L.w, T, x, p, out[p], NULL, NULL, qt[p], NULL,
                                        lat[p], lse[p]);
            }
            const double e_out = rel_err_dd(out[1], out[0], (size_t)T * D);
            const double e_lat = rel_err_dd(lat[1], lat[0], (size_t)T * H * rkv);
            const double e_lse = rel_err_dd(lse[1], lse[0], (size_t)T * H);
            const double e_qt = rel_err_dd(qt[1], qt[0], (size_t)T * H * rkv);
            double out_mag = 0.0;
            for (size_t i = 0; i < (size_t)T * D; i++)
                out_mag = fmax(out_mag, fabs(out[0][i]));
            char name[96];
            snprintf(name, sizeof name, "paths_agree_%s_%s_T%d", shape, hs ? "half" : "interleaved",
                     T);
            check(rc[0] == 0 && rc[1] == 0 && e_out <= 1e-10 && e_lat <= 1e-10 && e_lse <= 1e-10 &&
                      e_qt == 0.0 && out_mag > 1e-3,
                  name, "rc=%d/%d rel err out %.2g latent %.2g lse %.2g (max|out|=%.3g)", rc[0],
                  rc[1], e_out, e_lat, e_lse, out_mag);
            for (int p = 0; p < 2; p++) {
                free(out[p]);
                free(lat[p]);
                free(lse[p]);
                free(qt[p]);
            }
            free(x);
        }
        free_layer(&L);
    }
}

static mla_ref_config small_v2lite_config(void)
{
    mla_ref_config c = base_config(64, 4, 0, 32, 16, 8, 16);
    set_yarn(&c, 40.0, 0.707, 0.707);
    return c;
}

static mla_ref_config odd_config(int yarn)
{
    mla_ref_config c = base_config(37, 3, 24, 40, 12, 8, 10);
    if (yarn)
        set_yarn(&c, 40.0, 1.0, 0.707); /* amplitude != 1 */
    return c;
}

static void test_causality(void)
{
    mla_ref_config cfg = odd_config(1);
    layer L = make_layer(&cfg, 77);
    const int T = 7;
    const size_t D = (size_t)cfg.hidden;
    for (int p = 0; p < 2; p++) {
        float *x = rand_input(T, cfg.hidden, 555);
        double *a = dalloc((size_t)T * D), *b = dalloc((size_t)T * D), *c = dalloc((size_t)T * D);
        int rc = mla_ref_forward(&L.cfg, &L.w, T, x, p, a, NULL, NULL, NULL, NULL, NULL, NULL);
        /* Change the last token. */
        for (size_t i = 0; i < D; i++)
            x[(size_t)(T - 1) * D + i] += 0.75f;
        rc |= mla_ref_forward(&L.cfg, &L.w, T, x, p, b, NULL, NULL, NULL, NULL, NULL, NULL);
        const int prefix_same = memcmp(a, b, (size_t)(T - 1) * D * sizeof(double)) == 0;
        const double last_change = rel_err_dd(b + (size_t)(T - 1) * D, a + (size_t)(T - 1) * D, D);
        char name[64];
        snprintf(name, sizeof name, "causal_%s", p ? "decompressed" : "absorbed");
        check(rc == 0 && prefix_same && last_change > 1e-3, name,
              "tokens 0..%d bitwise unchanged: %s; token %d changed by rel %.3g", T - 2,
              prefix_same ? "yes" : "no", T - 1, last_change);

        /* The converse: the last token does attend to the past (changing token 0 moves it). */
        for (size_t i = 0; i < D; i++)
            x[i] -= 0.75f;
        rc |= mla_ref_forward(&L.cfg, &L.w, T, x, p, c, NULL, NULL, NULL, NULL, NULL, NULL);
        const double moved = rel_err_dd(c + (size_t)(T - 1) * D, b + (size_t)(T - 1) * D, D);
        snprintf(name, sizeof name, "attends_past_%s", p ? "decompressed" : "absorbed");
        check(rc == 0 && moved > 1e-4, name, "changing token 0 moves token %d by rel %.3g", T - 1,
              moved);
        free(a);
        free(b);
        free(c);
        free(x);
    }
    free_layer(&L);
}

static void test_latent_attention(void)
{
    static const int Ts[] = { 7, 33 };
    mla_ref_config cfg = odd_config(1);
    layer L = make_layer(&cfg, 31);
    const size_t H = (size_t)cfg.heads, rkv = (size_t)cfg.kv_lora_rank, dr = (size_t)cfg.rope_dim;
    const size_t D = (size_t)cfg.hidden;
    const double scale = mla_ref_softmax_scale(&cfg);
    for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
        const int T = Ts[k];
        for (int p = 0; p < 2; p++) {
            float *x = rand_input(T, cfg.hidden, 4242 + (uint64_t)T);
            double *out = dalloc((size_t)T * D), *ckv = dalloc((size_t)T * rkv);
            double *kr = dalloc((size_t)T * dr), *qt = dalloc((size_t)T * H * rkv);
            double *qr = dalloc((size_t)T * H * dr), *lat = dalloc((size_t)T * H * rkv);
            double *lse = dalloc((size_t)T * H);
            double *lat2 = dalloc(H * rkv), *lse2 = dalloc(H);
            const int rc = mla_ref_forward(&L.cfg, &L.w, T, x, p, out, ckv, kr, qt, qr, lat, lse);
            const size_t t = (size_t)T - 1;
            mla_ref_latent_attention((int)H, (int)rkv, (int)dr, scale, T, qt + t * H * rkv,
                                     qr + t * H * dr, ckv, kr, lat2, lse2);
            const double e_lat = rel_err_dd(lat2, lat + t * H * rkv, H * rkv);
            const double e_lse = rel_err_dd(lse2, lse + t * H, H);
            /* Absorbed path calls the same function, so it must match to the last bit-ish. */
            const double tol = p == MLA_REF_ABSORBED ? 1e-14 : 1e-10;
            char name[96];
            snprintf(name, sizeof name, "latent_attention_matches_%s_T%d",
                     p ? "decompressed" : "absorbed", T);
            check(rc == 0 && e_lat <= tol && e_lse <= tol, name, "rel err latent %.2g lse %.2g",
                  e_lat, e_lse);
            free(x);
            free(out);
            free(ckv);
            free(kr);
            free(qt);
            free(qr);
            free(lat);
            free(lse);
            free(lat2);
            free(lse2);
        }
    }
    free_layer(&L);
}

/* mla_ref_sparse_latent_attention against mla_ref_latent_attention: every position listed (in
   reverse, with -1 padding and out-of-range entries) is the dense attention; a subset is the dense
   attention over those keys gathered; a key listed twice keeps out and adds log 2 to lse; a list
   without a key gives zeros and -inf. */
static void test_sparse_latent_attention(void)
{
    enum { H = 3, RKV = 10, DR = 4, N = 23, LIST = N + 5 };
    const double scale = 0.4;
    double qt[H * RKV], qr[H * DR], ckv[N * RKV], kr[N * DR];
    double want[H * RKV], want_lse[H], got[H * RKV], got_lse[H];
    double sub_c[N * RKV], sub_r[N * DR];
    int list[LIST];
    rng_seed(777);
    for (int i = 0; i < H * RKV; i++)
        qt[i] = 2.0 * rng_unif();
    for (int i = 0; i < H * DR; i++)
        qr[i] = 2.0 * rng_unif();
    for (int i = 0; i < N * RKV; i++)
        ckv[i] = 2.0 * rng_unif();
    for (int i = 0; i < N * DR; i++)
        kr[i] = 2.0 * rng_unif();

    /* all N positions, reversed, among entries that name no key */
    int n = 0;
    list[n++] = -1;
    for (int j = N - 1; j >= 0; j--) {
        list[n++] = j;
        if (j == N / 2) {
            list[n++] = N;      /* one past the end */
            list[n++] = -7;
        }
    }
    list[n++] = 1 << 30;
    list[n++] = -1;
    mla_ref_latent_attention(H, RKV, DR, scale, N, qt, qr, ckv, kr, want, want_lse);
    int valid = mla_ref_sparse_latent_attention(H, RKV, DR, scale, N, list, n, qt, qr, ckv, kr, got, got_lse);
    double e = rel_err_dd(got, want, H * RKV), el = rel_err_dd(got_lse, want_lse, H);
    check(n == LIST && valid == N && e <= 1e-14 && el <= 1e-14, "sparse_latent_all_positions",
          "%d of %d entries valid, rel err %.2g lse %.2g", valid, n, e, el);

    /* a subset: positions 3, 17, 0, 9 */
    static const int subset[] = {3, 17, 0, 9};
    const int ns = (int)(sizeof subset / sizeof subset[0]);
    for (int i = 0; i < ns; i++) {
        memcpy(sub_c + (size_t)i * RKV, ckv + (size_t)subset[i] * RKV, RKV * sizeof(double));
        memcpy(sub_r + (size_t)i * DR, kr + (size_t)subset[i] * DR, DR * sizeof(double));
    }
    mla_ref_latent_attention(H, RKV, DR, scale, ns, qt, qr, sub_c, sub_r, want, want_lse);
    valid = mla_ref_sparse_latent_attention(H, RKV, DR, scale, N, subset, ns, qt, qr, ckv, kr, got, got_lse);
    e = rel_err_dd(got, want, H * RKV);
    el = rel_err_dd(got_lse, want_lse, H);
    check(valid == ns && e <= 1e-14 && el <= 1e-14, "sparse_latent_subset", "rel err %.2g lse %.2g", e, el);

    /* position 5 twice: its attention alone, with lse + log 2 */
    static const int twice[] = {5, 5}, once[] = {5};
    mla_ref_sparse_latent_attention(H, RKV, DR, scale, N, once, 1, qt, qr, ckv, kr, want, want_lse);
    valid = mla_ref_sparse_latent_attention(H, RKV, DR, scale, N, twice, 2, qt, qr, ckv, kr, got, got_lse);
    double lse_gap = 0.0;
    for (int h = 0; h < H; h++)
        lse_gap = fmax(lse_gap, fabs(got_lse[h] - want_lse[h] - log(2.0)));
    e = rel_err_dd(got, want, H * RKV);
    check(valid == 2 && e <= 1e-14 && lse_gap <= 1e-13, "sparse_latent_duplicate", "rel err %.2g, lse - log 2 off by %.2g",
          e, lse_gap);

    /* nothing valid */
    static const int none[] = {-1, N, -1};
    valid = mla_ref_sparse_latent_attention(H, RKV, DR, scale, N, none, 3, qt, qr, ckv, kr, got, got_lse);
    int zeros = 1;
    for (int i = 0; i < H * RKV; i++)
        zeros &= got[i] == 0.0;
    for (int h = 0; h < H; h++)
        zeros &= isinf(got_lse[h]) && got_lse[h] < 0;
    check(valid == 0 && zeros, "sparse_latent_no_key", "out 0 and lse -inf");
}

/* naive_last_token's products of a float32 input: out[r] = W[r, :] . h, plus bias[r] when bias is
   not NULL, for r < rows (W row-major [rows, D]). */
static void naive_rows(const float *W, const float *bias, const float *h, int rows, int D, double *out)
{
    for (int r = 0; r < rows; r++) {
        double a = 0.0;
        for (int i = 0; i < D; i++)
            a += (double)W[(size_t)r * D + i] * h[i];
        if (bias)
            a += bias[r];
        out[r] = a;
    }
}

/* RMSNorm of v[0..n) in place with weight w and epsilon eps, then times scale. */
static void naive_rms_norm(double *v, const float *w, int n, double eps, double scale)
{
    double ss = 0.0;
    for (int r = 0; r < n; r++)
        ss += v[r] * v[r];
    for (int r = 0; r < n; r++)
        v[r] *= w[r] / sqrt(ss / n + eps) * scale;
}

/* An independent, deliberately naive evaluation of the last token of a sequence straight from
   docs/MLA.md section 2 and the weight layout of section 1 (index arithmetic written out again).
   With features f (NULL = none): biases added after their products, the latent scales after the
   norms, m(p) written out from section 4, and token j's rope key rotated for a step whose last
   position is step_last[j] (NULL: one step of T tokens). RoPE itself is mla_ref_rope_apply_ext,
   one pair at a time, which test_rope and the test_*_freqs checks test on their own. */
static void naive_last_token(const layer *L, const mla_ref_features *f, const long *step_last /* [T] */, int T,
                             const float *x /* [T, D] */, double *u /* [D] */, double *lse /* [H] */)
{
    static const mla_ref_features none;
    if (!f)
        f = &none;
    const mla_ref_config *c = &L->cfg;
    const int D = c->hidden, H = c->heads, rq = c->q_lora_rank, rkv = c->kv_lora_rank;
    const int dn = c->nope_dim, dr = c->rope_dim, dv = c->v_dim, dq = dn + dr;
    const double tau = mla_ref_softmax_scale_ext(c, f);
    const double sq = f->q_latent_scale == 0.0 ? 1.0 : f->q_latent_scale;
    const double skv = f->kv_latent_scale == 0.0 ? 1.0 : f->kv_latent_scale;
    const long last = (long)T - 1;
    double *ckv = dalloc((size_t)T * rkv), *kr = dalloc((size_t)T * dr);
    double *q = dalloc((size_t)H * dq), *cq = dalloc((size_t)(rq > 0 ? rq : 1));
    double *o = dalloc((size_t)H * dv), *s = dalloc((size_t)T);

    for (int j = 0; j < T; j++) {
        const float *h = x + (size_t)j * D;
        const float *kv_bias = f->kv_a_proj_with_mqa_bias;
        naive_rows(L->kv_a, kv_bias, h, rkv, D, ckv + (size_t)j * rkv);
        naive_rms_norm(ckv + (size_t)j * rkv, L->kv_a_ln, rkv, c->rms_eps, skv);
        naive_rows(L->kv_a + (size_t)rkv * D, kv_bias ? kv_bias + rkv : NULL, h, dr, D, kr + (size_t)j * dr);
        mla_ref_rope_apply_ext(c, f, kr + (size_t)j * dr, j, step_last ? step_last[j] : last);
    }

    const float *h = x + (size_t)(T - 1) * D;
    if (rq > 0) {
        naive_rows(L->q_a_proj, f->q_a_proj_bias, h, rq, D, cq);
        naive_rms_norm(cq, L->q_a_layernorm, rq, c->rms_eps, sq);
        for (int r = 0; r < H * dq; r++) {
            double a = 0.0;
            for (int i = 0; i < rq; i++)
                a += (double)L->q_b_proj[(size_t)r * rq + i] * cq[i];
            q[r] = a;
        }
    } else {
        naive_rows(L->q_proj, NULL, h, H * dq, D, q);
    }

    for (int hd = 0; hd < H; hd++) {
        double *qc = q + (size_t)hd * dq, *qrope = q + (size_t)hd * dq + dn;
        mla_ref_rope_apply_ext(c, f, qrope, last, step_last ? step_last[T - 1] : last);
        /* m(p) = 1 + beta ln(1 + floor(p / interval)) on the whole query (section 4) */
        if (f->query_scale_beta != 0.0) {
            const double m_p = 1.0 + f->query_scale_beta * log(1.0 + (double)(last / f->query_scale_interval));
            for (int a = 0; a < dq; a++)
                q[(size_t)hd * dq + a] *= m_p;
        }
        double m = -INFINITY;
        for (int j = 0; j < T; j++) {
            double sc = 0.0;
            for (int a = 0; a < dn; a++) {
                double k = 0.0; /* (W^UK_h c^KV_j)[a] */
                for (int r = 0; r < rkv; r++)
                    k += (double)L->kv_b[((size_t)hd * (dn + dv) + a) * rkv + r] *
                         ckv[(size_t)j * rkv + r];
                sc += qc[a] * k;
            }
            for (int a = 0; a < dr; a++)
                sc += qrope[a] * kr[(size_t)j * dr + a];
            s[j] = tau * sc;
            m = fmax(m, s[j]);
        }
        double sum = 0.0;
        for (int j = 0; j < T; j++)
            sum += exp(s[j] - m);
        lse[hd] = m + log(sum);
        for (int a = 0; a < dv; a++) {
            double acc = 0.0;
            for (int j = 0; j < T; j++) {
                double v = 0.0; /* (W^UV_h c^KV_j)[a] */
                for (int r = 0; r < rkv; r++)
                    v += (double)L->kv_b[((size_t)hd * (dn + dv) + dn + a) * rkv + r] *
                         ckv[(size_t)j * rkv + r];
                acc += exp(s[j] - m) / sum * v;
            }
            o[(size_t)hd * dv + a] = acc;
        }
    }
    for (int i = 0; i < D; i++) {
        double a = 0.0;
        for (int k = 0; k < H * dv; k++)
            a += (double)L->o_proj[(size_t)i * H * dv + k] * o[k];
        u[i] = a + (f->o_proj_bias ? (double)f->o_proj_bias[i] : 0.0);
    }
    free(ckv);
    free(kr);
    free(q);
    free(cq);
    free(o);
    free(s);
}

static void test_naive(const char *shape, mla_ref_config cfg, uint64_t seed)
{
    static const int Ts[] = { 1, 5 };
    layer L = make_layer(&cfg, seed);
    const size_t D = (size_t)cfg.hidden, H = (size_t)cfg.heads;
    for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
        const int T = Ts[k];
        float *x = rand_input(T, cfg.hidden, seed * 3 + (uint64_t)T);
        double *u = dalloc(D), *lse_n = dalloc(H);
        naive_last_token(&L, NULL, NULL, T, x, u, lse_n);
        for (int p = 0; p < 2; p++) {
            double *out = dalloc((size_t)T * D), *lse = dalloc((size_t)T * H);
            const int rc =
                mla_ref_forward(&L.cfg, &L.w, T, x, p, out, NULL, NULL, NULL, NULL, NULL, lse);
            const double e_out = rel_err_dd(out + (size_t)(T - 1) * D, u, D);
            const double e_lse = rel_err_dd(lse + (size_t)(T - 1) * H, lse_n, H);
            char name[96];
            snprintf(name, sizeof name, "naive_%s_%s_T%d", shape, p ? "decompressed" : "absorbed",
                     T);
            check(rc == 0 && e_out <= 1e-10 && e_lse <= 1e-10, name,
                  "last token rel err out %.2g lse %.2g", e_out, e_lse);
            free(out);
            free(lse);
        }
        free(u);
        free(lse_n);
        free(x);
    }
    free_layer(&L);
}

/* ------------------------------------------------------------------------------------------ */
/* Features of the other model families (mla_ref_features)                                     */
/* ------------------------------------------------------------------------------------------ */

/* Relative error of a against a hand-computed value. */
static double rel(double a, double want)
{
    return fabs(a - want) / fabs(want);
}

static void test_linear_freqs(void)
{
    /* linear, s = 4: f_i = theta^(-2i/dr) / 4 exactly, A = 1; tau = 192^(-1/2) g(4, 0.707)^2. */
    mla_ref_config c = deepseek_rope_config(1.0, 1.0, 0.707);
    mla_ref_features f = { 0 };
    f.rope_type = MLA_REF_ROPE_LINEAR;
    f.linear_factor = 4.0;
    double inv[32], A = 0.0, worst = 0.0;
    mla_ref_rope_tables_ext(&c, &f, 0, inv, &A);
    for (int i = 0; i < 32; i++)
        worst = fmax(worst, rel(inv[i], pow(1e4, -2.0 * i / 64.0) / 4.0));
    const double g = 0.1 * 0.707 * log(4.0) + 1.0;
    const double tau = mla_ref_softmax_scale_ext(&c, &f);
    check(worst < 1e-15 && inv[0] == 0.25 && A == 1.0 && rel(tau, g * g / sqrt(192.0)) < 1e-15,
          "linear_freqs", "max rel err %.3g, inv_freq[0]=%g (want 0.25), A=%g, tau=%.15g (want %.15g)", worst,
          inv[0], A, tau, g * g / sqrt(192.0));
}

static void test_yarn_features(void)
{
    /* No truncation, DeepSeek's dr 64, theta 1e4, L 4096, beta 32/1:
         low  = 64 ln(4096 / (2 pi 32)) / (2 ln 1e4) = 10.47224081...
         high = 64 ln(4096 / (2 pi))    / (2 ln 1e4) = 22.51344064...
       (truncated: 10 and 23, yarn_bounds_v2). */
    mla_ref_config c = deepseek_rope_config(40.0, 1.0, 0.707);
    mla_ref_features f = { 0 };
    f.rope_type = MLA_REF_ROPE_YARN;
    f.yarn_no_truncate = 1;
    double low = 0.0, high = 0.0;
    mla_ref_yarn_bounds_ext(&c, &f, &low, &high);
    check(fabs(low - 10.47224081) < 1e-8 && fabs(high - 22.51344064) < 1e-8, "yarn_no_truncate_bounds",
          "low=%.10f (want 10.47224081) high=%.10f (want 22.51344064)", low, high);

    /* Pair 16: ramp = (16 - low) / (high - low) = 5.52775919 / 12.04119983 = 0.45907... */
    double inv[32], A = 0.0;
    mla_ref_rope_tables_ext(&c, &f, 0, inv, &A);
    const double ramp = (16.0 - 10.472240810318025) / (22.513440636877274 - 10.472240810318025);
    const double want16 = pow(1e4, -0.5) * (1.0 - ramp + ramp / 40.0);
    check(rel(inv[16], want16) < 1e-14 && fabs(ramp - 0.45907) < 1e-5, "yarn_no_truncate_freq",
          "inv_freq[16]=%.15g want %.15g (ramp %.6f)", inv[16], want16, ramp);

    /* attention_factor replaces g(s, mscale) / g(s, mscale_all_dim), leaves f_i and tau alone. */
    mla_ref_features fa = { 0 };
    fa.rope_type = MLA_REF_ROPE_YARN;
    fa.rope_attention_factor = 1.3;
    double inv_a[32], inv_auto[32], A_a = 0.0, A_auto = 0.0;
    mla_ref_rope_tables_ext(&c, &fa, 0, inv_a, &A_a);
    mla_ref_rope_tables(&c, inv_auto, &A_auto);
    check(A_a == 1.3 && memcmp(inv_a, inv_auto, sizeof inv_a) == 0 &&
              mla_ref_softmax_scale_ext(&c, &fa) == mla_ref_softmax_scale(&c) && fabs(A_auto - 1.3) > 0.05,
          "yarn_attention_factor", "A=%g (want 1.3; the mscale rule gives %.6f), frequencies and tau unchanged",
          A_a, A_auto);
}

/* LongRoPE features with these factor lists, factor 4 and original length 8. */
static mla_ref_features longrope_features(const double *short_f, const double *long_f)
{
    mla_ref_features f = { 0 };
    f.rope_type = MLA_REF_ROPE_LONGROPE;
    f.longrope_short_factor = short_f;
    f.longrope_long_factor = long_f;
    f.longrope_factor = 4.0;
    f.longrope_original_max_pos = 8.0;
    return f;
}

static void test_longrope_freqs(void)
{
    /* dr 8, theta 1e4: f0 = 1, 0.1, 0.01, 0.001. s 4, L 8: A = sqrt(1 + ln 4 / ln 8)
       = sqrt(1 + 2/3) = sqrt(5/3) = 1.29099444873... for both factor lists. */
    static const double short_f[4] = { 1.0, 2.0, 4.0, 8.0 }, long_f[4] = { 1.5, 3.0, 10.0, 40.0 };
    mla_ref_config c = base_config(37, 3, 24, 40, 12, 8, 10);
    mla_ref_features f = longrope_features(short_f, long_f);
    double is[4], il[4], As = 0.0, Al = 0.0;
    mla_ref_rope_tables_ext(&c, &f, 7, is, &As); /* last position 7: 7 + 1 > 8 is false: short */
    mla_ref_rope_tables_ext(&c, &f, 8, il, &Al); /* last position 8: long */
    const double want_s[4] = { 1.0, 0.05, 0.0025, 0.000125 }, want_l[4] = { 1.0 / 1.5, 0.1 / 3.0, 0.001, 0.000025 };
    double worst = 0.0;
    for (int i = 0; i < 4; i++)
        worst = fmax(worst, fmax(rel(is[i], want_s[i]), rel(il[i], want_l[i])));
    check(worst < 1e-14 && fabs(As - 1.2909944487358056) < 1e-15 && As == Al, "longrope_freqs",
          "max rel err %.3g, A short %.16g long %.16g (want sqrt(5/3) = 1.2909944487358056)", worst, As, Al);
    check(mla_ref_longrope_long(&c, &f, 7) == 0 && mla_ref_longrope_long(&c, &f, 8) == 1 &&
              mla_ref_longrope_long(&c, NULL, 100) == 0,
          "longrope_choice", "step ending at 7: %d, at 8: %d (want 0, 1); without features: %d",
          mla_ref_longrope_long(&c, &f, 7), mla_ref_longrope_long(&c, &f, 8), mla_ref_longrope_long(&c, NULL, 100));
    /* s <= 1: A = 1; an attention factor wins. */
    f.longrope_factor = 1.0;
    mla_ref_rope_tables_ext(&c, &f, 0, is, &As);
    f.rope_attention_factor = 0.9;
    mla_ref_rope_tables_ext(&c, &f, 0, is, &Al);
    check(As == 1.0 && Al == 0.9, "longrope_amplitude_rules", "A with s 1: %g (want 1), with attention 0.9: %g",
          As, Al);
}

static void test_llama3_freqs(void)
{
    /* dr 8, theta 1e4: f0 = 1, 0.1, 0.01, 0.001, wavelengths 2 pi / f0 = 6.28, 62.83, 628.3, 6283.
       s 8, lo 1, hi 8, L 256: L/hi = 32, L/lo = 256.
         pair 0: 6.28 < 32: kept, 1;
         pair 1: 32 <= 62.83 <= 256: a = (256 / (20 pi) - 1) / 7, and
                 f = (1 - a) 0.1/8 + a 0.1 = (0.1/8)(1 + 7a) = (0.1/8)(256 / (20 pi)) = 0.16 / pi
                   = 0.0509295817894...;
         pair 2: 628.3 > 256: 0.01 / 8 = 0.00125;  pair 3: 0.000125.
       A = 1; tau = 20^(-1/2) (0.1 ln 8 + 1)^2 = 0.326271180990... with mscale_all_dim 1, dq 12 + 8. */
    mla_ref_config c = base_config(37, 3, 24, 40, 12, 8, 10);
    c.yarn_mscale_all_dim = 1.0;
    mla_ref_features f = { 0 };
    f.rope_type = MLA_REF_ROPE_LLAMA3;
    f.llama3_factor = 8.0;
    f.llama3_low_freq_factor = 1.0;
    f.llama3_high_freq_factor = 8.0;
    f.llama3_original_max_pos = 256.0;
    double inv[4], A = 0.0;
    mla_ref_rope_tables_ext(&c, &f, 0, inv, &A);
    const double want[4] = { 1.0, 0.16 / M_PI, 0.00125, 0.000125 };
    double worst = 0.0;
    for (int i = 0; i < 4; i++)
        worst = fmax(worst, rel(inv[i], want[i]));
    const double tau = mla_ref_softmax_scale_ext(&c, &f);
    check(worst < 1e-14 && fabs(inv[1] - 0.0509295817894065) < 1e-16 && A == 1.0 &&
              fabs(tau - 0.32627118099068) < 1e-13,
          "llama3_freqs", "max rel err %.3g, inv_freq[1]=%.16g (want 0.16/pi), A=%g, tau=%.14f (want 0.32627118099068)",
          worst, inv[1], A, tau);
}

static void test_none_and_query_scale(void)
{
    mla_ref_config c = base_config(37, 3, 24, 40, 12, 8, 10);
    c.yarn_mscale_all_dim = 1.0;
    mla_ref_features f = { 0 };
    f.rope_type = MLA_REF_ROPE_NONE;
    double x[8], x0[8];
    for (int i = 0; i < 8; i++)
        x[i] = x0[i] = 0.1 * i - 0.3;
    mla_ref_rope_apply_ext(&c, &f, x, 1234, 1234);
    check(memcmp(x, x0, sizeof x) == 0 && mla_ref_softmax_scale_ext(&c, &f) == 1.0 / sqrt(20.0), "rope_none",
          "values unchanged at position 1234; tau = 20^(-1/2)");

    /* m(p) = 1 + 0.5 ln(1 + floor(p / 4)): 1 for p 0..3, 1 + 0.5 ln 2 = 1.34657359028 for 4..7,
       1 + 0.5 ln 3 = 1.54930614433 at 8, 1 + 0.5 ln 4 = 1 + ln 2 = 1.69314718056 at 12. */
    mla_ref_features q = { 0 };
    q.query_scale_beta = 0.5;
    q.query_scale_interval = 4;
    const long pos[7] = { 0, 3, 4, 7, 8, 12, 15 };
    const double want[7] = { 1.0, 1.0, 1.3465735902799727, 1.3465735902799727, 1.549306144334055,
                             1.6931471805599454, 1.6931471805599454 };
    double worst = 0.0;
    for (int k = 0; k < 7; k++)
        worst = fmax(worst, rel(mla_ref_query_scale(&q, pos[k]), want[k]));
    check(worst < 1e-15 && mla_ref_query_scale(NULL, 1000) == 1.0, "query_scale_values",
          "max rel err %.3g over p = 0, 3, 4, 7, 8, 12, 15", worst);
}

/* Random biases for the layer: sets f's three pointers to arrays it allocates (free_biases). */
static void make_biases(const layer *L, mla_ref_features *f, int with_q)
{
    const mla_ref_config *c = &L->cfg;
    f->q_a_proj_bias = with_q && c->q_lora_rank > 0 ? rand_matrix(1, (size_t)c->q_lora_rank) : NULL;
    f->kv_a_proj_with_mqa_bias = rand_matrix(1, (size_t)(c->kv_lora_rank + c->rope_dim));
    f->o_proj_bias = rand_matrix(1, (size_t)c->hidden);
}

static void free_biases(mla_ref_features *f)
{
    free((void *)f->q_a_proj_bias);
    free((void *)f->kv_a_proj_with_mqa_bias);
    free((void *)f->o_proj_bias);
    f->q_a_proj_bias = f->kv_a_proj_with_mqa_bias = f->o_proj_bias = NULL;
}

/* What each feature does to the outputs, in isolation, on one layer and input. */
static void test_feature_effects(void)
{
    mla_ref_config cfg = odd_config(0);
    layer L = make_layer(&cfg, 61);
    enum { T = 9 };
    const size_t D = (size_t)cfg.hidden, H = (size_t)cfg.heads, rkv = (size_t)cfg.kv_lora_rank;
    const size_t dr = (size_t)cfg.rope_dim;
    float *x = rand_input(T, cfg.hidden, 62);
    double *out0 = dalloc(T * D), *ckv0 = dalloc(T * rkv), *kr0 = dalloc(T * dr), *qt0 = dalloc(T * H * rkv);
    double *qr0 = dalloc(T * H * dr);
    double *out1 = dalloc(T * D), *ckv1 = dalloc(T * rkv), *kr1 = dalloc(T * dr), *qt1 = dalloc(T * H * rkv);
    double *qr1 = dalloc(T * H * dr);
    int rc = mla_ref_forward(&L.cfg, &L.w, T, x, 0, out0, ckv0, kr0, qt0, qr0, NULL, NULL);

    /* The query scale multiplies q~ and q^R of token t by exactly m(t); keys are unchanged. */
    mla_ref_features q = { 0 };
    q.query_scale_beta = 0.5;
    q.query_scale_interval = 4;
    rc |= mla_ref_forward_ext(&L.cfg, &q, &L.w, T, x, NULL, 0, 0, out1, ckv1, kr1, qt1, qr1, NULL, NULL);
    double worst = 0.0;
    for (size_t t = 0; t < T; t++) {
        const double m = mla_ref_query_scale(&q, (long)t);
        for (size_t i = 0; i < H * rkv; i++)
            worst = fmax(worst, fabs(qt1[t * H * rkv + i] - m * qt0[t * H * rkv + i]));
        for (size_t i = 0; i < H * dr; i++)
            worst = fmax(worst, fabs(qr1[t * H * dr + i] - m * qr0[t * H * dr + i]));
    }
    check(rc == 0 && worst < 1e-13 && memcmp(ckv0, ckv1, T * rkv * sizeof(double)) == 0 &&
              memcmp(kr0, kr1, T * dr * sizeof(double)) == 0 && rel_err_dd(out1, out0, T * D) > 1e-3,
          "query_scale_effect", "max |q(m) - m q| = %.3g, keys bitwise unchanged, out moved by rel %.3g", worst,
          rel_err_dd(out1, out0, T * D));

    /* Latent scales: c^KV times skv exactly; q~ (linear in c^Q) times sq. */
    mla_ref_features ls = { 0 };
    ls.q_latent_scale = 1.7;
    ls.kv_latent_scale = 0.6;
    rc |= mla_ref_forward_ext(&L.cfg, &ls, &L.w, T, x, NULL, 0, 0, out1, ckv1, kr1, qt1, qr1, NULL, NULL);
    double e_kv = 0.0, e_q = 0.0;
    for (size_t i = 0; i < T * rkv; i++)
        e_kv = fmax(e_kv, fabs(ckv1[i] - 0.6 * ckv0[i]));
    for (size_t i = 0; i < T * H * rkv; i++)
        e_q = fmax(e_q, fabs(qt1[i] - 1.7 * qt0[i]));
    check(rc == 0 && e_kv < 1e-14 && e_q < 1e-13 && memcmp(kr0, kr1, T * dr * sizeof(double)) == 0,
          "latent_scales_effect", "max |ckv - 0.6 ckv0| = %.3g, max |q~ - 1.7 q~0| = %.3g, k^R unchanged", e_kv,
          e_q);

    /* Biases: the o_proj bias adds to the output; the rope part of the kv_a bias adds to k^R before
       RoPE, so at position 0 (no rotation, A = 1) k^R = (kv_a x)_rope + b_rope. */
    mla_ref_features b = { 0 };
    make_biases(&L, &b, 0);
    mla_ref_features ob = { 0 };
    ob.o_proj_bias = b.o_proj_bias;
    rc |= mla_ref_forward_ext(&L.cfg, &ob, &L.w, T, x, NULL, 0, 0, out1, NULL, NULL, NULL, NULL, NULL, NULL);
    double e_o = 0.0;
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < D; i++)
            e_o = fmax(e_o, fabs(out1[t * D + i] - out0[t * D + i] - (double)b.o_proj_bias[i]));
    mla_ref_features kb = { 0 };
    kb.kv_a_proj_with_mqa_bias = b.kv_a_proj_with_mqa_bias;
    rc |= mla_ref_forward_ext(&L.cfg, &kb, &L.w, T, x, NULL, 0, 0, out1, ckv1, kr1, NULL, NULL, NULL, NULL);
    double e_k = 0.0;
    for (size_t r = 0; r < dr; r++) {
        double a = 0.0;
        for (size_t i = 0; i < D; i++)
            a += (double)L.kv_a[(rkv + r) * D + i] * x[i];
        e_k = fmax(e_k, fabs(kr1[r] - (a + (double)b.kv_a_proj_with_mqa_bias[rkv + r])));
    }
    check(rc == 0 && e_o < 1e-14 && e_k < 1e-14 && rel_err_dd(ckv1, ckv0, T * rkv) > 1e-3, "bias_effect",
          "max |out_b - out - b| = %.3g, max |k^R_0 - (kv_a x + b)_rope| = %.3g, c^KV moved by rel %.3g", e_o, e_k,
          rel_err_dd(ckv1, ckv0, T * rkv));
    free_biases(&b);

    /* Steps change nothing but LongRoPE's choice: the same features (no LongRoPE), fed as 4 + 1 + 3 + 1,
       give bitwise the same result. */
    static const int steps[4] = { 4, 1, 3, 1 };
    rc |= mla_ref_forward_ext(&L.cfg, &q, &L.w, T, x, steps, 4, 1, out1, NULL, NULL, NULL, NULL, NULL, NULL);
    rc |= mla_ref_forward_ext(&L.cfg, &q, &L.w, T, x, NULL, 0, 1, out0, NULL, NULL, NULL, NULL, NULL, NULL);
    check(rc == 0 && memcmp(out0, out1, T * D * sizeof(double)) == 0, "steps_neutral_without_longrope",
          "4+1+3+1 steps == one step, bitwise");

    free(out0);
    free(ckv0);
    free(kr0);
    free(qt0);
    free(qr0);
    free(out1);
    free(ckv1);
    free(kr1);
    free(qt1);
    free(qr1);
    free(x);
    free_layer(&L);
}

/* LongRoPE in a forward pass: each step's tokens rotated by the step's choice, keys keeping theirs. */
static void test_longrope_steps(void)
{
    static const double short_f[4] = { 1.0, 1.7, 2.9, 4.3 }, long_f[4] = { 2.0, 5.0, 9.0, 30.0 };
    mla_ref_config cfg = odd_config(0);
    layer L = make_layer(&cfg, 71);
    mla_ref_features f = longrope_features(short_f, long_f);
    enum { T = 11 };
    const size_t D = (size_t)cfg.hidden, rkv = (size_t)cfg.kv_lora_rank, dr = (size_t)cfg.rope_dim;
    float *x = rand_input(T, cfg.hidden, 72);
    static const int steps[5] = { 6, 1, 1, 1, 2 }; /* steps end at 5, 6, 7, 8, 10: long from 8 on */
    const long step_last[T] = { 5, 5, 5, 5, 5, 5, 6, 7, 8, 10, 10 };
    double *kr_steps = dalloc(T * dr), *kr_one = dalloc(T * dr), *out = dalloc(T * D), *ckv = dalloc(T * rkv);
    int rc = mla_ref_forward_ext(&L.cfg, &f, &L.w, T, x, steps, 5, 0, out, ckv, kr_steps, NULL, NULL, NULL, NULL);
    rc |= mla_ref_forward_ext(&L.cfg, &f, &L.w, T, x, NULL, 0, 0, out, ckv, kr_one, NULL, NULL, NULL, NULL);
    /* Each k^R against the raw projection rotated one pair at a time for its step. */
    double e_steps = 0.0, e_one = 0.0;
    for (size_t t = 0; t < T; t++) {
        double k[8], k1[8];
        for (size_t r = 0; r < dr; r++) {
            double a = 0.0;
            for (size_t i = 0; i < D; i++)
                a += (double)L.kv_a[(rkv + r) * D + i] * x[t * D + i];
            k[r] = k1[r] = a;
        }
        mla_ref_rope_apply_ext(&L.cfg, &f, k, (long)t, step_last[t]);
        mla_ref_rope_apply_ext(&L.cfg, &f, k1, (long)t, T - 1); /* one step of 11 > 8: all long */
        for (size_t r = 0; r < dr; r++) {
            e_steps = fmax(e_steps, fabs(kr_steps[t * dr + r] - k[r]));
            e_one = fmax(e_one, fabs(kr_one[t * dr + r] - k1[r]));
        }
    }
    /* Short and long rotations differ where the steps differ (token 3: short in 6+..., long in one step). */
    const double moved = rel_err_dd(kr_steps + 3 * dr, kr_one + 3 * dr, dr);
    const double same8 = rel_err_dd(kr_steps + 8 * dr, kr_one + 8 * dr, dr);
    check(rc == 0 && e_steps < 1e-14 && e_one < 1e-14 && moved > 1e-2 && same8 < 1e-15, "longrope_steps_keys",
          "k^R vs rope_apply_ext per step: %.3g, one step: %.3g; token 3 short vs long: rel %.3g; token 8 long in "
          "both: %.3g",
          e_steps, e_one, moved, same8);

    /* The last token against the naive evaluation, both as steps and as one step. */
    double *u = dalloc(D), *lse_n = dalloc((size_t)cfg.heads), *lse = dalloc(T * (size_t)cfg.heads);
    for (int p = 0; p < 2; p++) {
        for (int stepped = 0; stepped < 2; stepped++) {
            naive_last_token(&L, &f, stepped ? step_last : NULL, T, x, u, lse_n);
            rc = mla_ref_forward_ext(&L.cfg, &f, &L.w, T, x, stepped ? steps : NULL, stepped ? 5 : 0, p, out, NULL,
                                     NULL, NULL, NULL, NULL, lse);
            char name[96];
            snprintf(name, sizeof name, "naive_longrope_%s_%s", stepped ? "steps" : "one_step",
                     p ? "decompressed" : "absorbed");
            const double e_out = rel_err_dd(out + (T - 1) * D, u, D);
            const double e_lse = rel_err_dd(lse + (T - 1) * (size_t)cfg.heads, lse_n, (size_t)cfg.heads);
            check(rc == 0 && e_out <= 1e-10 && e_lse <= 1e-10, name, "last token rel err out %.2g lse %.2g", e_out,
                  e_lse);
        }
    }
    free(u);
    free(lse_n);
    free(lse);
    free(kr_steps);
    free(kr_one);
    free(out);
    free(ckv);
    free(x);
    free_layer(&L);
}

/* Every feature at once against the naive evaluation, q_lora present and absent. */
static void test_naive_features(void)
{
    static const double short_f[4] = { 1.0, 1.3, 2.2, 3.1 }, long_f[4] = { 1.1, 4.0, 7.0, 19.0 };
    /* each variant's RoPE (YaRN's also sets the config's factor and original length, below) */
    static const struct {
        const char *what;
        mla_ref_features f;
    } variants[] = {
        { "yarn", { .rope_type = MLA_REF_ROPE_YARN, .yarn_no_truncate = 1, .rope_attention_factor = 1.2 } },
        { "llama3",
          { .rope_type = MLA_REF_ROPE_LLAMA3,
            .llama3_factor = 8.0,
            .llama3_low_freq_factor = 1.0,
            .llama3_high_freq_factor = 8.0,
            .llama3_original_max_pos = 256.0 } },
        { "longrope",
          { .rope_type = MLA_REF_ROPE_LONGROPE,
            .longrope_short_factor = short_f,
            .longrope_long_factor = long_f,
            .longrope_factor = 3.0,
            .longrope_original_max_pos = 4.0 } },
        { "none", { .rope_type = MLA_REF_ROPE_NONE } },
        { "linear", { .rope_type = MLA_REF_ROPE_LINEAR, .linear_factor = 3.0 } },
    };
    for (int variant = 0; variant < 5; variant++) {
        mla_ref_config cfg = variant % 2 ? base_config(29, 5, 0, 23, 7, 8, 9) : odd_config(0);
        cfg.rope_half_split = variant % 2;
        cfg.yarn_mscale_all_dim = 0.8;
        layer L = make_layer(&cfg, 81 + (uint64_t)variant);
        mla_ref_features f = variants[variant].f;
        const char *what = variants[variant].what;
        if (f.rope_type == MLA_REF_ROPE_YARN) {
            cfg.yarn_factor = 8.0;
            cfg.yarn_original_max_pos = 64.0;
        }
        L.cfg = cfg;
        f.query_scale_beta = 0.4;
        f.query_scale_interval = 2;
        f.q_latent_scale = 1.4;
        f.kv_latent_scale = 0.7;
        make_biases(&L, &f, 1);
        char shape[64];
        snprintf(shape, sizeof shape, "features_%s_%s", what, cfg.q_lora_rank ? "q_lora" : "q_proj");
        static const int Ts[] = { 1, 7 };
        const size_t D = (size_t)cfg.hidden, H = (size_t)cfg.heads;
        for (size_t k = 0; k < 2; k++) {
            const int T = Ts[k];
            float *x = rand_input(T, cfg.hidden, 90 + (uint64_t)variant * 7 + (uint64_t)T);
            double *u = dalloc(D), *lse_n = dalloc(H);
            naive_last_token(&L, &f, NULL, T, x, u, lse_n);
            for (int p = 0; p < 2; p++) {
                double *out = dalloc((size_t)T * D), *lse = dalloc((size_t)T * H);
                const int rc = mla_ref_forward_ext(&L.cfg, &f, &L.w, T, x, NULL, 0, p, out, NULL, NULL, NULL, NULL,
                                                   NULL, lse);
                const double e_out = rel_err_dd(out + (size_t)(T - 1) * D, u, D);
                const double e_lse = rel_err_dd(lse + (size_t)(T - 1) * H, lse_n, H);
                char name[128];
                snprintf(name, sizeof name, "naive_%s_%s_T%d", shape, p ? "decompressed" : "absorbed", T);
                check(rc == 0 && e_out <= 1e-10 && e_lse <= 1e-10, name, "last token rel err out %.2g lse %.2g",
                      e_out, e_lse);
                free(out);
                free(lse);
            }
            free(u);
            free(lse_n);
            free(x);
        }
        free_biases(&f);
        free_layer(&L);
    }
}

/* What the refusal tests call the reference with: the odd configuration's layer (seed 5) and an
   input of `tokens` tokens (seed 6) with room for its output. */
typedef struct refusal_setup {
    layer L;
    float *x;
    double *out;
} refusal_setup;

static refusal_setup refusal_setup_make(int tokens)
{
    const mla_ref_config cfg = odd_config(0);
    refusal_setup r;
    r.L = make_layer(&cfg, 5);
    r.x = rand_input(tokens, cfg.hidden, 6);
    r.out = dalloc((size_t)tokens * cfg.hidden);
    return r;
}

static void refusal_setup_free(refusal_setup *r)
{
    free(r->out);
    free(r->x);
    free_layer(&r->L);
}

/* One check: every one of the n bad calls was rejected (bad == n) and the valid call went through. */
static void check_refusals(const char *name, int bad, int n, int good)
{
    check(bad == n && good, name, "%d of %d bad calls rejected, valid call ok: %s", bad, n, good ? "yes" : "no");
}

static void test_bad_features(void)
{
    refusal_setup r = refusal_setup_make(3);
    layer L = r.L;
    float *x = r.x;
    double *out = r.out;
    static const double ok_f[4] = { 1, 1, 1, 1 }, zero_f[4] = { 1, 0, 1, 1 };
    int bad = 0, n = 0;
    mla_ref_features f = { 0 };
#define REJECTS(steps_, nsteps_)                                                                                   \
    (n++, bad += mla_ref_forward_ext(&L.cfg, &f, &L.w, 3, x, steps_, nsteps_, 0, out, NULL, NULL, NULL, NULL, NULL, \
                                     NULL) == -1)
    f.rope_type = (mla_ref_rope_type)7;
    REJECTS(NULL, 0);
    f.rope_type = MLA_REF_ROPE_LINEAR; /* linear_factor 0 */
    REJECTS(NULL, 0);
    f.rope_type = MLA_REF_ROPE_LONGROPE; /* no factor lists */
    f.longrope_original_max_pos = 8;
    REJECTS(NULL, 0);
    f.longrope_short_factor = ok_f;
    f.longrope_long_factor = zero_f;
    REJECTS(NULL, 0);
    f.rope_type = MLA_REF_ROPE_LLAMA3; /* hi <= lo */
    f.llama3_factor = 8;
    f.llama3_original_max_pos = 64;
    f.llama3_low_freq_factor = f.llama3_high_freq_factor = 2;
    REJECTS(NULL, 0);
    memset(&f, 0, sizeof f);
    f.query_scale_beta = 0.1; /* interval 0 */
    REJECTS(NULL, 0);
    memset(&f, 0, sizeof f);
    static const int short_steps[2] = { 1, 1 }, zero_step[3] = { 2, 0, 1 };
    REJECTS(short_steps, 2); /* 2 tokens of 3 */
    REJECTS(zero_step, 3);
    mla_ref_config q_proj_cfg = base_config(37, 3, 0, 40, 12, 8, 10);
    layer Q = make_layer(&q_proj_cfg, 7);
    const float qb[1] = { 0.5f };
    f.q_a_proj_bias = qb; /* q_proj has no bias */
    n++;
    bad += mla_ref_forward_ext(&Q.cfg, &f, &Q.w, 3, x, NULL, 0, 0, out, NULL, NULL, NULL, NULL, NULL, NULL) == -1;
#undef REJECTS
    memset(&f, 0, sizeof f);
    const int good = mla_ref_forward_ext(&L.cfg, &f, &L.w, 3, x, short_steps, 0, 0, out, NULL, NULL, NULL, NULL,
                                         NULL, NULL) == 0;
    check_refusals("bad_features", bad, n, good);
    free_layer(&Q);
    refusal_setup_free(&r);
}

static void test_bad_arguments(void)
{
    refusal_setup r = refusal_setup_make(2);
    layer L = r.L;
    float *x = r.x;
    double *out = r.out;
    int bad = 0;
    bad += mla_ref_forward(&L.cfg, &L.w, 2, x, 2, out, NULL, NULL, NULL, NULL, NULL, NULL) == -1;
    bad += mla_ref_forward(&L.cfg, &L.w, 2, NULL, 0, out, NULL, NULL, NULL, NULL, NULL, NULL) == -1;
    bad += mla_ref_forward(&L.cfg, &L.w, 0, x, 0, out, NULL, NULL, NULL, NULL, NULL, NULL) == -1;
    mla_ref_config odd_dr = L.cfg;
    odd_dr.rope_dim = 7;
    bad += mla_ref_forward(&odd_dr, &L.w, 2, x, 0, out, NULL, NULL, NULL, NULL, NULL, NULL) == -1;
    mla_ref_weights nw = L.w;
    nw.q_a_proj = NULL; /* rq > 0 needs it */
    bad += mla_ref_forward(&L.cfg, &nw, 2, x, 0, out, NULL, NULL, NULL, NULL, NULL, NULL) == -1;
    const int good = mla_ref_forward(&L.cfg, &L.w, 2, x, 0, out, NULL, NULL, NULL, NULL, NULL,
                                     NULL) == 0;
    check_refusals("bad_arguments", bad, 5, good);
    refusal_setup_free(&r);
}

static void test_max_rel_err(void)
{
    const float got[4] = { 1.0f, 2.0f, 3.0f, -4.0f };
    const double want[4] = { 1.0, 2.5, 3.0, -4.0 };
    size_t idx = 99;
    const double e = mla_ref_max_rel_err(got, want, 4, &idx);
    const float gnan[3] = { 1.0f, NAN, 3.0f };
    size_t idx2 = 99;
    const double e2 = mla_ref_max_rel_err(gnan, want, 3, &idx2);
    check(fabs(e - 0.125) < 1e-15 && idx == 1 && isinf(e2) && idx2 == 1, "max_rel_err",
          "err=%.17g idx=%zu (want 0.125, 1); with NaN: %g idx=%zu", e, idx, e2, idx2);
}

/* Stored cache values: an FP8 run's rounded c^KV and k^R, handed back as float32 to a run with no
   rounding of its own, give that run's output exactly (the rounded values are floats); the same
   values with one changed give another output. */
static void test_stored_cache(void)
{
    mla_ref_config cfg = base_config(40, 3, 0, 128, 16, 8, 12);
    layer L = make_layer(&cfg, 131);
    const int T = 9;
    const size_t D = 40, rkv = 128, dr = 8;
    float *x = rand_input(T, cfg.hidden, 132);
    double *want = dalloc((size_t)T * D), *got = dalloc((size_t)T * D);
    double *ckv = dalloc((size_t)T * rkv), *kr = dalloc((size_t)T * dr);
    float *sc = malloc((size_t)T * rkv * sizeof(float)), *sk = malloc((size_t)T * dr * sizeof(float));
    mla_ref_features f = { 0 };
    f.cache_type = MLA_REF_CACHE_FP8;
    int rc = mla_ref_forward_ext(&cfg, &f, &L.w, T, x, NULL, 0, MLA_REF_ABSORBED, want, ckv, kr, NULL, NULL, NULL, NULL);
    for (size_t i = 0; i < (size_t)T * rkv; i++)
        sc[i] = (float)ckv[i];
    for (size_t i = 0; i < (size_t)T * dr; i++)
        sk[i] = (float)kr[i];
    mla_ref_features g = { 0 };
    g.stored_ckv = sc;
    g.stored_kr = sk;
    rc |= mla_ref_forward_ext(&cfg, &g, &L.w, T, x, NULL, 0, MLA_REF_ABSORBED, got, NULL, NULL, NULL, NULL, NULL, NULL);
    const double same = rel_err_dd(got, want, (size_t)T * D);
    sc[3 * rkv + 5] *= 1.5f; /* key 3: changes every output from token 3 on */
    rc |= mla_ref_forward_ext(&cfg, &g, &L.w, T, x, NULL, 0, MLA_REF_ABSORBED, got, NULL, NULL, NULL, NULL, NULL, NULL);
    const double before = rel_err_dd(got, want, 3 * D), after = rel_err_dd(got + 3 * D, want + 3 * D, (size_t)(T - 3) * D);
    check(rc == 0 && same == 0.0 && before == 0.0 && after > 1e-6, "stored_cache_fp8",
          "rel err same values %.2g, one value changed: tokens 0-2 %.2g, 3- %.2g", same, before, after);
    free(want);
    free(got);
    free(ckv);
    free(kr);
    free(sc);
    free(sk);
    free(x);
    free_layer(&L);
}

/* ------------------------------------------------------------------------------------------ */
/* Weights in another element type (mla_ref_round_weight, mla_ref_quantize_fp8)               */
/* ------------------------------------------------------------------------------------------ */

/* Every code of the three formats decodes to a value that encodes back to it (NaN aside: -1), and
   values a format does not hold are refused. */
static void test_weight_codes(void)
{
    int bad = 0, refused = 0;
    for (unsigned c = 0; c < 65536; c++) {
        const double h = mla_ref_decode_f16(c), b = mla_ref_decode_bf16(c);
        bad += isnan(h) ? mla_ref_encode_f16(h) != -1 : mla_ref_encode_f16(h) != (int)c;
        bad += isnan(b) ? mla_ref_encode_bf16(b) != -1 : mla_ref_encode_bf16(b) != (int)c;
    }
    for (unsigned c = 0; c < 256; c++) {
        const double e = mla_ref_decode_e4m3(c);
        bad += isnan(e) ? mla_ref_encode_e4m3(e) != -1 : mla_ref_encode_e4m3(e) != (int)c;
    }
    /* 1 + 2^-4 needs 5 bits; 480 and 2^-10 are past e4m3's range and grid; infinities are not e4m3;
       2^16 is past f16; 1 + 2^-8 needs 9 bits; 2^-134 is below bf16's grid. */
    const double e4m3_not[] = {1.0 + 0x1p-4, 480.0, 0x1p-10, INFINITY, NAN};
    for (size_t i = 0; i < sizeof(e4m3_not) / sizeof(e4m3_not[0]); i++)
        refused += mla_ref_encode_e4m3(e4m3_not[i]) == -1;
    refused += mla_ref_encode_f16(65536.0) == -1;
    refused += mla_ref_encode_f16(1.0 + 0x1p-11) == -1;
    refused += mla_ref_encode_bf16(1.0 + 0x1p-8) == -1;
    refused += mla_ref_encode_bf16(0x1p-134) == -1;
    const int spot = mla_ref_encode_e4m3(448.0) == 0x7E && mla_ref_encode_e4m3(-0.0) == 0x80 &&
                     mla_ref_encode_e4m3(0x1p-9) == 0x01 && mla_ref_encode_f16(-INFINITY) == 0xFC00 &&
                     mla_ref_encode_bf16(1.0) == 0x3F80 && mla_ref_encode_f16(65504.0) == 0x7BFF;
    check(bad == 0 && refused == 9 && spot, "weight_codes",
          "%d codes of f16/bf16/e4m3 not round-tripped; %d of 9 foreign values refused; spot codes %s", bad, refused,
          spot ? "ok" : "WRONG");
}

/* f16 and bf16 weights: each value rounded to nearest even, overflow to infinity, NaN kept; f32
   weights untouched. */
static void test_round_weight_16(void)
{
    /* in, f16, bf16 */
    static const double cases[][3] = {
        {1.0 + 0x1p-11, 1.0, 1.0},                       /* f16 tie: to the even 1 */
        {1.0 + 3 * 0x1p-11, 1.0 + 0x1p-9, 1.0},          /* f16 tie: odd 1 + 2^-10 loses to 1 + 2^-9 */
        {1.0 + 0x1p-8, 1.0 + 0x1p-8, 1.0},               /* bf16 tie: to the even 1 */
        {-(1.0 + 3 * 0x1p-8), -(1.0 + 3 * 0x1p-8), -(1.0 + 0x1p-6)}, /* bf16 tie upwards, sign kept */
        {0x1p-25, 0.0, 0x1p-25},                         /* f16: half the smallest subnormal, to 0 */
        {3 * 0x1p-25, 0x1p-23, 3 * 0x1p-25},             /* f16: 1.5 subnormal units, to 2 */
        {65519.0, 65504.0, 65536.0},                     /* f16: just under the overflow point */
        {65520.0, INFINITY, 65536.0},                    /* f16: the overflow point (a tie) */
        {-1e6, -INFINITY, -999424.0},
    };
    const int n = (int)(sizeof(cases) / sizeof(cases[0]));
    float h[16], b[16], f[16];
    for (int i = 0; i < n; i++)
        h[i] = b[i] = f[i] = (float)cases[i][0];
    h[n] = b[n] = f[n] = NAN;
    int rc = mla_ref_round_weight(MLA_REF_WEIGHT_F16, h, 1, n + 1);
    rc |= mla_ref_round_weight(MLA_REF_WEIGHT_BF16, b, n + 1, 1);
    rc |= mla_ref_round_weight(MLA_REF_WEIGHT_F32, f, 1, n + 1);
    int wrong = 0;
    for (int i = 0; i < n; i++) {
        if ((double)h[i] != cases[i][1] || (double)b[i] != cases[i][2] || (double)f[i] != (double)(float)cases[i][0]) {
            printf("  case %d: in %.17g: f16 %.17g (want %.17g), bf16 %.17g (want %.17g), f32 %.17g\n", i, cases[i][0],
                   (double)h[i], cases[i][1], (double)b[i], cases[i][2], (double)f[i]);
            wrong++;
        }
    }
    const int nan_kept = isnan(h[n]) && isnan(b[n]) && isnan(f[n]);
    const int refused =
        mla_ref_round_weight(4, f, 1, 1) == -1 && mla_ref_round_weight(MLA_REF_WEIGHT_F16, f, -1, 1) == -1;
    check(rc == 0 && wrong == 0 && nan_kept && refused, "round_weight_f16_bf16",
          "%d of %d hand cases wrong; NaN kept: %s; bad dtype / size refused: %s", wrong, n, nan_kept ? "yes" : "no",
          refused ? "yes" : "no");
}

/* One FP8 block whose largest magnitude is 448 * 2^-3: s = 2^-3 exactly, and values that are e4m3
   values times 2^-3 get exact codes, so the weight comes back bitwise. */
static void test_fp8_exact_block(void)
{
    static const double e4m3_values[] = {448.0, -448.0, 1.0, 1.125, -0.8125, 0x1p-9, -7 * 0x1p-9, 0.0,
                                         240.0, 0x1p-6, 13.0, -0.0, 104.0, 3.75, 0.3125};
    enum { R = 3, C = 5 };
    float w[R * C], orig[R * C], scale[1] = {0};
    unsigned char codes[R * C];
    for (int i = 0; i < R * C; i++)
        w[i] = orig[i] = (float)(e4m3_values[i] * 0x1p-3);
    const int rq = mla_ref_quantize_fp8(w, R, C, codes, scale);
    int code_wrong = 0;
    for (int i = 0; i < R * C; i++)
        code_wrong += codes[i] != mla_ref_encode_e4m3(e4m3_values[i]);
    const int rc = mla_ref_round_weight(MLA_REF_WEIGHT_FP8, w, R, C);
    check(rq == 0 && rc == 0 && scale[0] == 0.125f && code_wrong == 0 && memcmp(w, orig, sizeof(w)) == 0,
          "fp8_exact_block", "scale %.9g (want 0.125), %d codes wrong, weights %s", (double)scale[0], code_wrong,
          memcmp(w, orig, sizeof(w)) == 0 ? "unchanged" : "CHANGED");
}

/* Rounding inside a block: ties to even on the normal and the subnormal grid (block max 448: s = 1);
   a scale that float32 cannot hold exactly (max 1: s = 1 / 448 as float32 divides, and the largest
   value comes back as 448 s rounded to float32); a scale that underflows (s = 2^-149). */
static void test_fp8_rounding(void)
{
    /* in, want (s = 1) */
    static const double cases[][2] = {
        {448.0, 448.0},
        {17.0, 16.0},            /* [16, 32): grid 2, tie 16 / 18: to 16 (mantissa 0) */
        {19.0, 20.0},            /* tie 18 / 20: to 20 (mantissa 2) */
        {-17.0, -16.0},
        {300.0, 288.0},          /* [256, 448]: grid 32; 300 / 32 = 9.375 */
        {0x1p-10, 0.0},          /* half the smallest subnormal 2^-9: to 0 */
        {3 * 0x1p-10, 0x1p-8},   /* 1.5 units: to 2 units */
        {5 * 0x1p-10, 0x1p-8},   /* 2.5 units: to 2 units */
        {0.0146484375, 0.015625}, /* 7.5 units of 2^-9: to 8 units = 2^-6, the smallest normal */
    };
    const int n = (int)(sizeof(cases) / sizeof(cases[0]));
    float w[16];
    for (int i = 0; i < n; i++)
        w[i] = (float)cases[i][0];
    int rc = mla_ref_round_weight(MLA_REF_WEIGHT_FP8, w, 1, n);
    int wrong = 0;
    for (int i = 0; i < n; i++)
        if ((double)w[i] != cases[i][1]) {
            printf("  case %d: %.17g -> %.17g, want %.17g\n", i, cases[i][0], (double)w[i], cases[i][1]);
            wrong++;
        }

    volatile float one = 1.0f, d448 = 448.0f;
    const float s_f32 = one / d448; /* the float32 division itself */
    float v[2] = {1.0f, -0.5f}, sc[1] = {0};
    unsigned char cd[2];
    rc |= mla_ref_quantize_fp8(v, 2, 1, cd, sc);
    rc |= mla_ref_round_weight(MLA_REF_WEIGHT_FP8, v, 2, 1);
    const float s_inexact = sc[0];
    const int inexact_ok = s_inexact == s_f32 && cd[0] == 0x7E && v[0] == (float)(448.0 * (double)s_f32) &&
                           v[1] == (float)(mla_ref_round_e4m3(-0.5 / (double)s_f32) * (double)s_f32);

    float tiny[2] = {7 * 0x1p-149f, -0x1p-149f}; /* 7 * 2^-149 / 448 underflows float32 */
    rc |= mla_ref_quantize_fp8(tiny, 1, 2, cd, sc);
    const int underflow_ok = sc[0] == 0x1p-149f && cd[0] == mla_ref_encode_e4m3(7.0) && cd[1] == 0xB8;
    check(rc == 0 && wrong == 0 && inexact_ok && underflow_ok, "fp8_rounding",
          "%d of %d tie/grid cases wrong; max 1: s %.9g (float32 1/448 %.9g), 1 -> %.9g; underflow: s %.3g codes "
          "%#x %#x",
          wrong, n, (double)s_inexact, (double)s_f32, (double)v[0], (double)sc[0], cd[0], cd[1]);
}

/* A block of zeros has scale 1 and comes back as zeros, next to a block with its own scale; a value
   that is not finite makes the whole tensor refused, unchanged. */
static void test_fp8_zero_block(void)
{
    enum { R = 128, C = 256 };
    float *w = calloc((size_t)R * C, sizeof(float)), *orig = malloc((size_t)R * C * sizeof(float));
    unsigned char *codes = malloc((size_t)R * C);
    if (!w || !orig || !codes) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    rng_seed(301);
    for (int r = 0; r < R; r++)
        for (int c = 128; c < C; c++)
            w[r * C + c] = (float)rng_unif(); /* block (0, 1): |W| < 0.5 */
    w[5 * C + 200] = -0.75f;                  /* its max: s = 0.75 / 448 */
    float scale[2] = {0, 0};
    int rc = mla_ref_quantize_fp8(w, R, C, codes, scale);
    int zero_codes = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 128; c++)
            zero_codes += codes[r * C + c] == 0;
    rc |= mla_ref_round_weight(MLA_REF_WEIGHT_FP8, w, R, C);
    int zeros = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 128; c++)
            zeros += w[r * C + c] == 0.0f && !signbit(w[r * C + c]);
    const float s1 = (float)(0.75 / 448.0);

    memcpy(orig, w, (size_t)R * C * sizeof(float));
    w[R * C - 1] = INFINITY;
    const int inf_refused = mla_ref_round_weight(MLA_REF_WEIGHT_FP8, w, R, C) == -1;
    w[R * C - 1] = orig[R * C - 1];
    w[7] = NAN;
    const int nan_refused = mla_ref_round_weight(MLA_REF_WEIGHT_FP8, w, R, C) == -1;
    w[7] = orig[7];
    check(rc == 0 && scale[0] == 1.0f && scale[1] == s1 && zero_codes == 128 * 128 && zeros == 128 * 128 &&
              inf_refused && nan_refused && memcmp(w, orig, (size_t)R * C * sizeof(float)) == 0,
          "fp8_zero_block", "scales %.9g %.9g (want 1, %.9g); zero codes %d, zeros %d of %d; inf / NaN refused %d %d",
          (double)scale[0], (double)scale[1], (double)s1, zero_codes, zeros, 128 * 128, inf_refused, nan_refused);
    free(w);
    free(orig);
    free(codes);
}

/* Partial blocks at the edges: a 130 x 3 weight has two blocks of rows, [0, 128) with max 448
   (s = 1) and [128, 130) with max 21 (s = 21 / 448 = 3 * 2^-6); 0.01 in each comes back as
   e4m3(0.01) = 5 * 2^-9 in the first and e4m3(0.01 / s) s = 14 * 2^-6 * 3 * 2^-6 in the second.
   The same along the columns: 3 x 130. */
static void test_fp8_partial_blocks(void)
{
    enum { LONG = 130, SHORT = 3 };
    float a[LONG * SHORT], b[SHORT * LONG], sa[2] = {0, 0}, sb[2] = {0, 0};
    unsigned char ca[LONG * SHORT], cb[SHORT * LONG];
    for (int i = 0; i < LONG * SHORT; i++)
        a[i] = b[i] = 0.01f;
    a[0] = b[0] = 448.0f;                           /* block 0's max */
    a[128 * SHORT + 1] = b[1 * LONG + 128] = -21.0f; /* block 1's max (row 128 / column 128) */
    int rc = mla_ref_quantize_fp8(a, LONG, SHORT, ca, sa) | mla_ref_quantize_fp8(b, SHORT, LONG, cb, sb);
    rc |= mla_ref_round_weight(MLA_REF_WEIGHT_FP8, a, LONG, SHORT);
    rc |= mla_ref_round_weight(MLA_REF_WEIGHT_FP8, b, SHORT, LONG);
    const float first = (float)(5 * 0x1p-9), second = (float)(14 * 0x1p-6 * 3 * 0x1p-6);
    int wrong = 0;
    for (int r = 0; r < LONG; r++)
        for (int c = 0; c < SHORT; c++) {
            const int i = r * SHORT + c, j = c * LONG + r; /* the same place in a and in b's transpose */
            const float want = i == 0 ? 448.0f : r == 128 && c == 1 ? -21.0f : r < 128 ? first : second;
            wrong += a[i] != want;
            wrong += b[j] != want;
        }
    check(rc == 0 && sa[0] == 1.0f && sa[1] == 0.046875f && sb[0] == 1.0f && sb[1] == 0.046875f && wrong == 0 &&
              first != second,
          "fp8_partial_blocks", "130x3 scales %.9g %.9g, 3x130 scales %.9g %.9g (want 1, 0.046875); %d values wrong "
          "(0.01 -> %.9g in the first block, %.9g in the second)",
          (double)sa[0], (double)sa[1], (double)sb[0], (double)sb[1], wrong, (double)first, (double)second);
}

/* A random 300 x 200 weight, each block at its own magnitude: every value comes back within half
   a unit of e4m3's grid times its block's scale (2^-4 relative for normals, 2^-10 s below 2^-6 s),
   plus the float32 rounding of the product, and no code passes 448. */
static void test_fp8_random_bound(void)
{
    enum { R = 300, C = 200 };
    const size_t n = (size_t)R * C;
    float *w = malloc(n * sizeof(float)), *q = malloc(n * sizeof(float));
    unsigned char *codes = malloc(n);
    if (!w || !q || !codes) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    rng_seed(302);
    for (size_t i = 0; i < n; i++) {
        const size_t r = i / C, c = i % C;
        w[i] = (float)(rng_unif() * ldexp(1.0, (int)(r / 128) * 5 - (int)(c / 128) * 9)); /* 2^0/5/10, x 2^-9 */
    }
    memcpy(q, w, n * sizeof(float));
    float scale[3 * 2];
    int rc = mla_ref_quantize_fp8(w, R, C, codes, scale) | mla_ref_round_weight(MLA_REF_WEIGHT_FP8, q, R, C);
    double worst = 0.0;
    int over = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t r = i / C, c = i % C;
        const double s = scale[(r / 128) * 2 + c / 128], a = fabs((double)w[i]);
        const double bound = ldexp(a, -4) + ldexp(s, -10) + ldexp(a, -22);
        worst = fmax(worst, fabs((double)q[i] - (double)w[i]) / bound);
        over += fabs(mla_ref_decode_e4m3(codes[i])) > 448.0;
    }
    check(rc == 0 && worst <= 1.0 && over == 0, "fp8_random_bound",
          "largest error / bound %.3f (<= 1), codes past 448: %d", worst, over);
    free(w);
    free(q);
    free(codes);
}

/* DeepSeek's FP8 index keys in the reference, by hand: H e0 / 2 = (1/2, 1/2, 1/2, 1/2), the rotation
   undone by a second one, a length that is not a power of two refused; the quantiser's scale
   2^ceil(log2(max|x| / 448)) with the 1e-4 floor, and values on the e4m3 grid times it. */
static void test_fp8_index_keys(void)
{
    double e0[4] = {1, 0, 0, 0}, v[8] = {3, -1, 0.5, 2, 7, -4, 0.25, 1}, w[8];
    const int rc = idx_ref_hadamard(e0, 4);
    check(rc == 0 && e0[0] == 0.5 && e0[1] == 0.5 && e0[2] == 0.5 && e0[3] == 0.5, "hadamard e0",
          "%g %g %g %g", e0[0], e0[1], e0[2], e0[3]);
    memcpy(w, v, sizeof(v));
    idx_ref_hadamard(w, 8);
    const double first = w[0]; /* (3 - 1 + 0.5 + 2 + 7 - 4 + 0.25 + 1) / sqrt(8) */
    idx_ref_hadamard(w, 8);
    double err = 0;
    for (int i = 0; i < 8; i++)
        err = fmax(err, fabs(w[i] - v[i]));
    check(fabs(first - 8.75 / sqrt(8.0)) < 1e-15 && err < 1e-14, "hadamard twice is the identity",
          "first %.17g, error %g", first, err);
    check(idx_ref_hadamard(w, 6) == -1, "hadamard of 6 refused", "");
    /* max 7: 7 / 448 = 2^-6, a power of two itself, so s = 2^-6; 0.25 / s = 16 and 3 / s = 192 are
       on the grid, -1 / s = -64 too; 2^-6 * 448 = 7 */
    double q[4] = {7, 3, -1, 0.25};
    const double s1 = idx_ref_quantize_fp8(q, 4);
    check(s1 == 0x1p-6 && q[0] == 7 && q[1] == 3 && q[2] == -1 && q[3] == 0.25, "fp8 quantiser, exact values",
          "scale %g: %g %g %g %g", s1, q[0], q[1], q[2], q[3]);
    /* max 5: 5 / 448 rounds up to 2^-6; 1.1 / 2^-6 = 70.4 lies between 64 and 72 (steps of 8): 72 */
    double r[2] = {5, 1.1};
    const double s2 = idx_ref_quantize_fp8(r, 2);
    check(s2 == 0x1p-6 && r[0] == 5 && r[1] == 72 * 0x1p-6, "fp8 quantiser, rounding", "scale %g: %g %g", s2, r[0], r[1]);
    /* all tiny: the floor 1e-4 / 448 gives 2^-22; 3e-7 / 2^-22 = 1.258 -> 1.25 */
    double z[2] = {3e-7, 0};
    const double s3 = idx_ref_quantize_fp8(z, 2);
    check(s3 == 0x1p-22 && z[0] == 1.25 * 0x1p-22 && z[1] == 0, "fp8 quantiser, the 1e-4 floor", "scale %g: %g", s3,
          z[0]);
}

int main(void)
{
    test_yarn_bounds_and_freqs();
    test_softmax_scales();
    test_rope();
    test_paths_agree("v2lite_small", small_v2lite_config(), 11);
    test_paths_agree("odd_yarn", odd_config(1), 12);
    test_paths_agree("odd_plain", odd_config(0), 13);
    test_causality();
    test_latent_attention();
    test_sparse_latent_attention();
    test_naive("v2lite_small", small_v2lite_config(), 21);
    test_naive("odd_yarn", odd_config(1), 22);
    test_linear_freqs();
    test_yarn_features();
    test_longrope_freqs();
    test_llama3_freqs();
    test_none_and_query_scale();
    test_feature_effects();
    test_longrope_steps();
    test_naive_features();
    test_stored_cache();
    test_bad_arguments();
    test_bad_features();
    test_max_rel_err();
    test_weight_codes();
    test_round_weight_16();
    test_fp8_exact_block();
    test_fp8_rounding();
    test_fp8_zero_block();
    test_fp8_partial_blocks();
    test_fp8_random_bound();
    test_fp8_index_keys();
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
