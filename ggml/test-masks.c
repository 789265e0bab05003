/* FLASH_ATTN_EXT over the masks llama.cpp builds, on the CLMLA backend beside ggml's CPU backend and
   a float64 reference computed here: causal prefill at depth 0 and deeper, keys masked inside a
   token's range, several sequences interleaved in one cache, a token with no key, a slice with no
   key, a mask that leaves every key, sequences in the batch dimension, f32 K and several KV heads.
   test-backend-ops' masks are random, so these are the cases where the backend gives each query
   token its own key range (per_token_ranges in ggml-clmla.c); each case also says whether the
   backend must take that path, read from the count it logs when freed.

     test-masks LLAMA_CPP_BUILD_BIN LIBGGML_CLMLA

   Exit status 0 when every case passes. */
#define _POSIX_C_SOURCE 200809L
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mask_case {
    const char *name;
    int q_heads, kv_heads, tokens, kv, seqs;
    int f32;    /* K in f32, else f16 */
    int ranged; /* 1: the backend must give each token its own key range; 0: it must not */
    /* 0 causal over `depth` earlier keys per sequence (sequence s at depth + 37 s), cells past the
       last token masked; 1 the same with keys masked inside each range and finite mask values; 2
       two sequences interleaved, cells alternating; 3 causal with token 3 seeing no key; 4 every
       key live; 5 sequence 1 seeing no key */
    int form, depth;
} mask_case;

static unsigned long long rng = 88172645463325252ULL;
static float uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* mask value of token t of sequence s for key j, as the forms above build them */
static float mask_value(const mask_case *c, int s, int t, int j)
{
    const int depth = c->depth + 37 * s;
    switch (c->form) {
    case 0:
        return j <= depth + t ? 0.0f : -INFINITY;
    case 1:
        if (j > depth + t || (j * 7 + t) % 5 == 0)
            return -INFINITY;
        return 0.25f * (float)((j + 3 * t) % 4);
    case 2: { /* cells 2i of sequence 0, 2i + 1 of 1; token t is sequence t % 2 at cell depth + t */
        const int cell = depth + t;
        return j <= cell && j % 2 == cell % 2 ? 0.0f : -INFINITY;
    }
    case 3:
        return t == 3 || j > depth + t ? -INFINITY : 0.0f;
    case 4:
        return 0.5f * (float)(j % 3);
    default:
        return s == 1 || j > depth + t ? -INFINITY : 0.0f;
    }
}

static double ranged_seen;
static void on_log(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    const char *at = strstr(text, "CLMLA: so far computed");
    if (at) {
        const char *r = strstr(at, "query rows, ");
        if (r)
            ranged_seen = atof(r + strlen("query rows, "));
    }
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

/* float64 attention of one case: out [seqs][tokens][q_heads][hsv] */
static void reference(const mask_case *c, int hsk, int hsv, const float *q, const float *k, const float *m, float scale,
                      double *out)
{
    const int per = c->q_heads / c->kv_heads;
    double *w = malloc(sizeof(double) * c->kv);
    for (int s = 0; s < c->seqs; s++)
        for (int t = 0; t < c->tokens; t++)
            for (int h = 0; h < c->q_heads; h++) {
                const float *qr = q + (((size_t)s * c->q_heads + h) * c->tokens + t) * hsk;
                const float *kh = k + ((size_t)s * c->kv_heads + h / per) * c->kv * hsk;
                const float *mr = m + ((size_t)s * c->tokens + t) * c->kv;
                double top = -INFINITY, sum = 0;
                for (int j = 0; j < c->kv; j++) {
                    double d = 0;
                    for (int x = 0; x < hsk; x++)
                        d += (double)qr[x] * kh[(size_t)j * hsk + x];
                    w[j] = isinf(mr[j]) ? -INFINITY : d * scale + mr[j];
                    top = w[j] > top ? w[j] : top;
                }
                double *o = out + (((size_t)s * c->tokens + t) * c->q_heads + h) * hsv;
                memset(o, 0, sizeof(double) * hsv);
                if (isinf(top))
                    continue; /* no key: 0, as ggml's CPU backend gives */
                for (int j = 0; j < c->kv; j++)
                    sum += w[j] = isinf(w[j]) ? 0 : exp(w[j] - top);
                for (int j = 0; j < c->kv; j++)
                    for (int x = 0; x < hsv; x++)
                        o[x] += w[j] / sum * kh[(size_t)j * hsk + x];
            }
    free(w);
}

/* normalised squared error of got against want, test-backend-ops' measure */
static double nmse(const float *got, const double *want, size_t n)
{
    double e = 0, a = 0;
    for (size_t i = 0; i < n; i++) {
        e += (got[i] - want[i]) * (got[i] - want[i]);
        a += want[i] * want[i];
    }
    return a > 0 ? e / a : e;
}

static double max_error(const float *got, const double *want, size_t n)
{
    double e = 0, a = 0;
    for (size_t i = 0; i < n; i++) {
        e = fabs(got[i] - want[i]) > e ? fabs(got[i] - want[i]) : e;
        a = fabs(want[i]) > a ? fabs(want[i]) : a;
    }
    return e / (a > 0 ? a : 1);
}

static int run_case(const mask_case *c, ggml_backend_t cpu, ggml_backend_reg_t reg)
{
    const int hsk = 576, hsv = 512, T = c->tokens, kv = c->kv;
    const float scale = 1.0f / sqrtf(192.0f);
    struct ggml_init_params ip = {.mem_size = 16 * ggml_tensor_overhead() + ggml_graph_overhead(), .no_alloc = true};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, hsk, T, c->q_heads, c->seqs);
    struct ggml_tensor *k = ggml_new_tensor_4d(ctx, c->f32 ? GGML_TYPE_F32 : GGML_TYPE_F16, hsk, kv, c->kv_heads, c->seqs);
    struct ggml_tensor *v = ggml_view_4d(ctx, k, hsv, kv, c->kv_heads, c->seqs, k->nb[1], k->nb[2], k->nb[3], 0);
    struct ggml_tensor *mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, kv, T, 1, c->seqs);
    struct ggml_tensor *fa = ggml_flash_attn_ext(ctx, q, k, v, mask, scale, 0.0f, 0.0f);
    struct ggml_cgraph *graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, fa);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, cpu);

    const size_t nq = ggml_nelements(q), nk = ggml_nelements(k), nm = ggml_nelements(mask), no = ggml_nelements(fa);
    float *hq = malloc(nq * 4), *hk = malloc(nk * 4), *hm = malloc(nm * 4), *got_cpu = malloc(no * 4),
          *got = malloc(no * 4);
    ggml_fp16_t *h16 = malloc((nk > nm ? nk : nm) * 2);
    double *want = malloc(no * sizeof(double));
    for (size_t i = 0; i < nq; i++)
        hq[i] = uniform();
    for (size_t i = 0; i < nk; i++)
        hk[i] = uniform();
    if (!c->f32) { /* the reference reads the values K holds */
        ggml_fp32_to_fp16_row(hk, h16, (int64_t)nk);
        ggml_fp16_to_fp32_row(h16, hk, (int64_t)nk);
        ggml_backend_tensor_set(k, h16, 0, nk * 2);
    } else {
        ggml_backend_tensor_set(k, hk, 0, nk * 4);
    }
    for (int s = 0; s < c->seqs; s++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < kv; j++)
                hm[((size_t)s * T + t) * kv + j] = mask_value(c, s, t, j);
    ggml_fp32_to_fp16_row(hm, h16, (int64_t)nm);
    ggml_fp16_to_fp32_row(h16, hm, (int64_t)nm);
    ggml_backend_tensor_set(mask, h16, 0, nm * 2);
    /* q [hsk, T, heads, seqs] in ggml's order is the reference's [seqs][heads][T][hsk] */
    ggml_backend_tensor_set(q, hq, 0, nq * 4);
    reference(c, hsk, hsv, hq, hk, hm, scale, want);

    int ok = 1;
    if (ggml_backend_graph_compute(cpu, graph) != GGML_STATUS_SUCCESS) {
        printf("FAIL %s: the CPU backend failed\n", c->name);
        ok = 0;
    }
    ggml_backend_tensor_get(fa, got_cpu, 0, no * 4);
    ggml_backend_t clmla = ggml_backend_dev_init(ggml_backend_reg_dev_get(reg, 0), NULL);
    const double before = ranged_seen;
    if (!clmla || !ggml_backend_supports_op(clmla, fa)) {
        printf("FAIL %s: the CLMLA backend %s\n", c->name, clmla ? "declines the node" : "did not start");
        ok = 0;
    } else if (ggml_backend_graph_compute(clmla, graph) != GGML_STATUS_SUCCESS) {
        printf("FAIL %s: the CLMLA backend failed\n", c->name);
        ok = 0;
    }
    ggml_backend_tensor_get(fa, got, 0, no * 4);
    if (clmla)
        ggml_backend_free(clmla);
    const int ranged = ranged_seen > before;
    const double e_cpu = nmse(got_cpu, want, no), e = nmse(got, want, no), m = max_error(got, want, no);
    /* ggml's CPU backend accumulates V in f16: test-backend-ops' bound for it, 5e-4; clmla in f32 */
    if (ok && (e_cpu > 5e-4 || e > 1e-9 || m > 1e-4 || ranged != c->ranged)) {
        printf("FAIL %s: ", c->name);
        ok = 0;
    } else if (ok) {
        printf("ok   %s: ", c->name);
    }
    if (ok || e_cpu > 5e-4 || e > 1e-9 || m > 1e-4 || ranged != c->ranged)
        printf("NMSE against float64: CLMLA %.2e (largest error %.2e of the largest value), CPU backend %.2e; "
               "key range per token: %s (%s)\n",
               e, m, e_cpu, ranged ? "yes" : "no", c->ranged ? "must" : "must not");
    free(hq);
    free(hk);
    free(hm);
    free(h16);
    free(got_cpu);
    free(got);
    free(want);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s LLAMA_CPP_BUILD_BIN LIBGGML_CLMLA\n", argv[0]);
        return 2;
    }
    ggml_log_set(on_log, NULL);
    /* every node the backend can compute runs on it (on CPU devices it declines small ones) */
    setenv("CLMLA_GGML_MIN_KV", "0", 1);
    ggml_backend_load_all_from_path(argv[1]);
    ggml_backend_reg_t reg = ggml_backend_load(argv[2]);
    ggml_backend_t cpu = ggml_backend_init_by_name("CPU", NULL);
    if (!reg || !cpu) {
        fprintf(stderr, "test-masks: %s did not load\n", !reg ? argv[2] : "the CPU backend");
        return 1;
    }
    static const mask_case cases[] = {
        {"causal from depth 0, 37 tokens over 64 cells", 16, 1, 37, 64, 1, 0, 1, 0, 0},
        {"causal at depth 300, 20 tokens over 512 cells", 16, 1, 20, 512, 1, 0, 1, 0, 300},
        {"causal at depth 200, keys masked inside the ranges, finite values", 16, 1, 24, 256, 1, 0, 1, 1, 200},
        {"two sequences interleaved in one cache, 24 tokens", 16, 1, 24, 256, 1, 0, 1, 2, 150},
        {"causal at depth 100, token 3 sees no key", 16, 1, 9, 256, 1, 0, 1, 3, 100},
        {"every key live (not causal)", 16, 1, 8, 128, 1, 0, 0, 4, 0},
        {"2 sequences in the batch dimension at depths 90 and 127", 16, 1, 16, 256, 2, 0, 1, 0, 90},
        {"sequence 1 of 2 sees no key", 16, 1, 16, 256, 2, 0, 0, 5, 90},
        {"f32 K, causal at depth 50", 16, 1, 12, 128, 1, 1, 1, 0, 50},
        {"4 KV heads x 4 query heads, causal at depth 60", 16, 4, 10, 128, 1, 0, 1, 0, 60},
        {"one token (decode) at depth 300", 16, 1, 1, 512, 1, 0, 0, 0, 300},
    };
    int failed = 0;
    const int n = (int)(sizeof(cases) / sizeof(cases[0]));
    for (int i = 0; i < n; i++)
        failed += !run_case(&cases[i], cpu, reg);
    ggml_backend_free(cpu);
    printf("test-masks: %d/%d cases passed\n", n - failed, n);
    return failed ? 1 : 0;
}
