/* Extreme inputs, against the float64 reference (ref/):
 *   scale     hidden states scaled by 1e3, 1e-3 and 0 (with q_proj the scores grow with the square
 *             of the scale: ~1e5 at x1e3, far past where a naive exp overflows), f32 and f16
 *             caches, both paths, prefill then decode: outputs finite and within tolerance;
 *   logits    clmla_attention_latent with scores of +-1e2 .. +-1e5 (exp overflows past 88.7),
 *             one and several splits (the combine then merges partial results whose
 *             log-sum-exps differ by thousands), all keys far below or far above zero;
 *   long      a 131072-token context in an f16 cache filled with clmla_cache_append_cl: latent
 *             attention over it against mla_ref_latent_attention on the contents read back, and a
 *             decode step of the layer at position 131072 on both paths against a float64 decode
 *             of the same token over the same keys;
 *   nonfinite NaN and +-Inf in hidden states (both paths, both kernel variants of each), in
 *             cached rows and in queries: every call returns (CLMLA_SUCCESS) within a bounded
 *             time, the affected sequence's outputs from that token on are not finite (the value
 *             propagates, it is not hidden), its outputs before that token and every other
 *             sequence in the same batch are exactly as without it.
 * `test_extreme PART...` runs the named parts. */
#include "check.h"
#include "clmla.h"
#include "attention.h"
#include "mla_ref.h"
#include "test_util.h"
#include "tolerance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static clmla_context *ctx;

/* A call that NaN or Inf might send into a loop must return well within this. */
#define BOUNDED_SECONDS 60.0

static cl_mem buffer(size_t bytes, const void *host)
{
    return tu_buffer(ctx, bytes, host);
}

static void read_buffer(cl_mem m, size_t bytes, void *host)
{
    tu_read_buffer(ctx, m, bytes, host);
}

static int count_nonfinite(const float *a, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += !isfinite(a[i]);
    return bad;
}

static clmla_status forward(clmla_layer *layer, clmla_cache *cache, const clmla_batch_entry *e, int n,
                            clmla_attention_path path, const float *x, float *out)
{
    clmla_forward_args a = {e, n, 0, path};
    return clmla_layer_forward(layer, cache, &a, x, out);
}

/* ---- scale ------------------------------------------------------------------------------------------ */

static void test_scale(void)
{
    static const float scales[] = {1e3f, 1e-3f, 0.0f};
    for (int q_lora = 0; q_lora < 2; q_lora++) {
        clmla_layer_config c = tu_small_config(40, 3, q_lora ? 16 : 0, 32, 16, 8, 16);
        const int D = c.hidden_size, T = 13, prefill = 9;
        tu_weights w;
        if (tu_weights_make(&w, &c, 500 + (uint64_t)q_lora) != 0)
            continue;
        clmla_layer *layer = NULL;
        CHECK_STATUS(clmla_layer_create(ctx, &c, &w.layer, &layer), CLMLA_SUCCESS, ctx);
        float *x = tu_random_inputs(T, D, 600), *xs = malloc((size_t)T * D * sizeof(float));
        float *out = malloc((size_t)T * D * sizeof(float));
        for (size_t si = 0; layer && si < sizeof(scales) / sizeof(scales[0]); si++) {
            for (size_t i = 0; i < (size_t)T * D; i++)
                xs[i] = x[i] * scales[si];
            tu_ref_run ref;
            if (tu_ref_run_make(&ref, &w, T, xs, MLA_REF_DECOMPRESSED) != 0) {
                CHECK(0, "reference failed");
                continue;
            }
            for (int dt = 0; dt < 2; dt++)
                for (int p = 1; p <= 2; p++) {
                    clmla_cache_config cc = {1, c.kv_lora_rank, c.qk_rope_head_dim, 4, 8, (clmla_cache_dtype)dt, 0, CLMLA_CACHE_F32};
                    clmla_cache *cache = NULL;
                    CHECK_STATUS(clmla_cache_create(ctx, &cc, &cache), CLMLA_SUCCESS, ctx);
                    int32_t seq = -1;
                    clmla_cache_seq_add(cache, &seq);
                    /* Prefill on the path under test, then decode steps on it too. */
                    clmla_batch_entry e = {seq, prefill};
                    clmla_status st = forward(layer, cache, &e, 1, (clmla_attention_path)p, xs, out);
                    for (int t = prefill; st == CLMLA_SUCCESS && t < T; t++) {
                        e.num_tokens = 1;
                        st = forward(layer, cache, &e, 1, (clmla_attention_path)p, xs + (size_t)t * D, out + (size_t)t * D);
                    }
                    CHECK(st == CLMLA_SUCCESS, "x%g: %s", (double)scales[si], clmla_last_error(ctx));
                    if (st == CLMLA_SUCCESS) {
                        CHECK(count_nonfinite(out, (size_t)T * D) == 0, "x%g q_lora %d %s %s: %d outputs not finite",
                              (double)scales[si], q_lora, dt ? "f16" : "f32", p == 1 ? "absorbed" : "decompressed",
                              count_nonfinite(out, (size_t)T * D));
                        CHECK_CLOSE(out, ref.out, (size_t)T * D, D, TOL_FOR_DTYPE(dt),
                                    "hidden states x%g, q_lora %d, %s cache, %s: out [token, i]", (double)scales[si],
                                    q_lora, dt ? "f16" : "f32", p == 1 ? "absorbed" : "decompressed");
                    }
                    clmla_cache_destroy(cache);
                }
            tu_ref_run_free(&ref);
        }
        clmla_layer_destroy(layer);
        free(x);
        free(xs);
        free(out);
        tu_weights_free(&w);
    }
}

/* ---- logits ------------------------------------------------------------------------------------------ */

/* One clmla_attention_latent call over a sequence of n_keys random rows whose queries are scaled
   so that the scores reach about +-magnitude; `shift` adds the same amount to every score (through
   a constant rope component), pushing all of them far above or below zero. */
static void latent_case(int heads, int n_keys, double magnitude, double shift, clmla_cache_dtype dt)
{
    const int rkv = 24, dr = 4, row = rkv + dr, bt = 8, T = 2;
    char what[160];
    snprintf(what, sizeof(what), "latent H=%d keys=%d |score|~%g shift %g %s", heads, n_keys, magnitude, shift,
             dt ? "f16" : "f32");
    clmla_cache_config cc = {1, rkv, dr, bt, (n_keys + bt - 1) / bt, dt, 0, CLMLA_CACHE_F32};
    clmla_cache *cache = NULL;
    CHECK_STATUS(clmla_cache_create(ctx, &cc, &cache), CLMLA_SUCCESS, ctx);
    if (!cache)
        return;
    tu_rng rng = tu_rng_seed((uint64_t)n_keys * 31 + (uint64_t)heads);
    int32_t seq;
    clmla_cache_seq_add(cache, &seq);
    float *rows = malloc((size_t)n_keys * row * sizeof(float));
    /* Values exact in half: [-2, 2] in steps of 1/64; the last rope value is 1 in every row, so a
       query's last rope component adds the same amount to every score. */
    for (int t = 0; t < n_keys; t++)
        for (int d = 0; d < row; d++)
            rows[(size_t)t * row + d] = d == row - 1 ? 1.0f : (float)(tu_rng_below(&rng, 257) - 128) / 64.0f;
    cl_mem rb = buffer((size_t)n_keys * row * sizeof(float), rows);
    CHECK_STATUS(clmla_cache_append_cl(cache, 0, seq, n_keys, rb, 0, row, rb, (size_t)rkv, row, NULL), CLMLA_SUCCESS,
                 ctx);
    clFinish(clmla_context_queue(ctx));
    clReleaseMemObject(rb);

    const float scale = 0.125f;
    /* A random unit direction times the magnitude: scores = scale * q.k with |k| ~ sqrt(row)*1.15. */
    const size_t nq = (size_t)T * heads * rkv, nr = (size_t)T * heads * dr;
    float *ql = malloc(nq * sizeof(float)), *qr = malloc(nr * sizeof(float));
    tu_fill_uniform(ql, nq, 0.0f, 1.0f, &rng);
    tu_fill_uniform(qr, nr, 0.0f, 1.0f, &rng);
    const double per = magnitude / (scale * sqrt((double)row) * 0.66 * 1.15);
    for (size_t i = 0; i < nq; i++)
        ql[i] = (float)(ql[i] * per);
    for (size_t i = 0; i < nr; i++)
        qr[i] = (float)(qr[i] * per);
    for (int i = 0; i < T * heads; i++)
        qr[(size_t)i * dr + dr - 1] = (float)(shift / scale);

    int32_t blocks[4096];
    int nb = 0;
    clmla_cache_seq_blocks(cache, seq, blocks, 4096, &nb);
    const int ctx_len[2] = {n_keys, n_keys / 2 + 1}, token_seq[2] = {0, 0};
    cl_mem qlb = buffer(nq * sizeof(float), ql), qrb = buffer(nr * sizeof(float), qr);
    cl_mem table = buffer((size_t)nb * sizeof(int32_t), blocks), tsb = buffer(sizeof(token_seq), token_seq);
    cl_mem tcb = buffer(sizeof(ctx_len), ctx_len), outb = buffer(nq * sizeof(float), NULL);
    cl_mem lseb = buffer((size_t)T * heads * sizeof(float), NULL);
    clmla_latent_attention_args a = {.num_tokens = T, .num_heads = heads, .softmax_scale = scale, .q_latent = qlb,
                                     .q_rope = qrb, .block_table = table, .max_blocks_per_seq = nb, .token_seq = tsb,
                                     .token_ctx_len = tcb, .max_ctx_len = n_keys, .out = outb, .lse = lseb};
    CHECK_STATUS(clmla_attention_latent(cache, 0, &a, NULL), CLMLA_SUCCESS, ctx);
    float *out = malloc(nq * sizeof(float)), *lse = malloc((size_t)T * heads * sizeof(float));
    read_buffer(outb, nq * sizeof(float), out);
    read_buffer(lseb, (size_t)T * heads * sizeof(float), lse);
    CHECK(count_nonfinite(out, nq) == 0 && count_nonfinite(lse, (size_t)T * heads) == 0,
          "%s: %d outputs and %d lse not finite", what, count_nonfinite(out, nq), count_nonfinite(lse, (size_t)T * heads));

    double *ckv = malloc((size_t)n_keys * rkv * sizeof(double)), *kr = malloc((size_t)n_keys * dr * sizeof(double));
    for (int t = 0; t < n_keys; t++)
        for (int d = 0; d < row; d++) {
            if (d < rkv)
                ckv[(size_t)t * rkv + d] = rows[(size_t)t * row + d];
            else
                kr[(size_t)t * dr + d - rkv] = rows[(size_t)t * row + d];
        }
    double *qld = malloc((size_t)heads * rkv * sizeof(double)), *qrd = malloc((size_t)heads * dr * sizeof(double));
    double *want = malloc((size_t)heads * rkv * sizeof(double)), *want_lse = malloc((size_t)heads * sizeof(double));
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < heads * rkv; i++)
            qld[i] = ql[(size_t)t * heads * rkv + i];
        for (int i = 0; i < heads * dr; i++)
            qrd[i] = qr[(size_t)t * heads * dr + i];
        mla_ref_latent_attention(heads, rkv, dr, scale, ctx_len[t], qld, qrd, ckv, kr, want, want_lse);
        /* With scores this large the float32 score of a key is off by up to ~|score| * 2^-22, so
           softmax weights carry that much absolute error in the exponent; the output is compared
           with the usual tolerance scaled by that. */
        const double tol = TOL_F32_CACHE * (magnitude + fabs(shift) > 1e3 ? (magnitude + fabs(shift)) / 1e3 : 1.0);
        CHECK_CLOSE(out + (size_t)t * heads * rkv, want, (size_t)heads * rkv, rkv, tol, "%s token %d: out [head, i]",
                    what, t);
        /* lse ~ max score: compare it relative to its own size. */
        double worst = 0;
        for (int h = 0; h < heads; h++) {
            const double e = fabs(lse[t * heads + h] - want_lse[h]) / (fabs(want_lse[h]) + 1.0);
            if (e > worst)
                worst = e;
        }
        CHECK(worst <= 1e-5, "%s token %d: lse relative error %.3g", what, t, worst);
    }
    RELEASE_MEMS(qlb, qrb, table, tsb, tcb, outb, lseb);
    clmla_cache_destroy(cache);
    free(rows);
    free(ql);
    free(qr);
    free(out);
    free(lse);
    free(ckv);
    free(kr);
    free(qld);
    free(qrd);
    free(want);
    free(want_lse);
}

static void test_logits(void)
{
    static const double magnitudes[] = {1e2, 1e4, 1e5};
    for (size_t m = 0; m < sizeof(magnitudes) / sizeof(magnitudes[0]); m++) {
        latent_case(3, 37, magnitudes[m], 0.0, CLMLA_CACHE_F32);      /* one split */
        latent_case(9, 1200, magnitudes[m], 0.0, CLMLA_CACHE_F16);    /* several splits, two head groups */
    }
    latent_case(2, 700, 10.0, 2e4, CLMLA_CACHE_F32);   /* every score near +2e4 */
    latent_case(2, 700, 10.0, -2e4, CLMLA_CACHE_F32);  /* every score near -2e4: exp underflows to 0 */
}

/* ---- a 128K context -------------------------------------------------------------------------------- */

/* A float64 decode of one token at position `pos` over keys [ckv ; kr] (n rows, then the token's
   own row, computed here), for a layer without q_lora and with YaRN off (amplitude 1). */
static void ref_decode(const tu_weights *w, const float *x /* [D] */, long pos, int n, const float *ckv /* [n, rkv] */,
                       const float *kr /* [n, dr] */, double *out /* [D] */)
{
    const mla_ref_config *cfg = &w->ref_config;
    const int D = cfg->hidden, H = cfg->heads, rkv = cfg->kv_lora_rank, dr = cfg->rope_dim, dn = cfg->nope_dim,
              dv = cfg->v_dim;
    /* At position 0 RoPE is the identity: the reference's q^R and k^R are the raw projections. */
    double *tmp_out = malloc((size_t)D * sizeof(double)), *c0 = malloc((size_t)rkv * sizeof(double));
    double *k0 = malloc((size_t)dr * sizeof(double)), *qt = malloc((size_t)H * rkv * sizeof(double));
    double *qr = malloc((size_t)H * dr * sizeof(double));
    mla_ref_forward(cfg, &w->ref, 1, x, MLA_REF_ABSORBED, tmp_out, c0, k0, qt, qr, NULL, NULL);
    for (int h = 0; h < H; h++)
        mla_ref_rope_apply(cfg, qr + (size_t)h * dr, pos);
    mla_ref_rope_apply(cfg, k0, pos);
    double *keys_c = malloc(((size_t)n + 1) * rkv * sizeof(double)), *keys_r = malloc(((size_t)n + 1) * dr * sizeof(double));
    for (size_t i = 0; i < (size_t)n * rkv; i++)
        keys_c[i] = ckv[i];
    for (size_t i = 0; i < (size_t)n * dr; i++)
        keys_r[i] = kr[i];
    memcpy(keys_c + (size_t)n * rkv, c0, (size_t)rkv * sizeof(double));
    memcpy(keys_r + (size_t)n * dr, k0, (size_t)dr * sizeof(double));
    double *lat = malloc((size_t)H * rkv * sizeof(double)), lse[64];
    mla_ref_latent_attention(H, rkv, dr, mla_ref_softmax_scale(cfg), n + 1, qt, qr, keys_c, keys_r, lat, lse);
    double *o = malloc((size_t)H * dv * sizeof(double));
    for (int h = 0; h < H; h++)
        for (int j = 0; j < dv; j++) {
            const float *w_uv = w->kv_b_proj + ((size_t)h * (dn + dv) + dn + j) * rkv;
            double s = 0;
            for (int i = 0; i < rkv; i++)
                s += (double)w_uv[i] * lat[(size_t)h * rkv + i];
            o[(size_t)h * dv + j] = s;
        }
    for (int i = 0; i < D; i++) {
        double s = 0;
        for (int k = 0; k < H * dv; k++)
            s += (double)w->o_proj[(size_t)i * H * dv + k] * o[k];
        out[i] = s;
    }
    free(tmp_out);
    free(c0);
    free(k0);
    free(qt);
    free(qr);
    free(keys_c);
    free(keys_r);
    free(lat);
    free(o);
}

static void test_long(void)
{
    const int N = 131072, bt = 256;
    clmla_layer_config c = tu_small_config(32, 2, 0, 16, 8, 4, 8);
    const int D = c.hidden_size, rkv = c.kv_lora_rank, dr = c.qk_rope_head_dim, row = rkv + dr;
    tu_weights w;
    if (tu_weights_make(&w, &c, 900) != 0)
        return;
    double t0 = tu_seconds();
    clmla_layer *layer = NULL;
    CHECK_STATUS(clmla_layer_create(ctx, &c, &w.layer, &layer), CLMLA_SUCCESS, ctx);
    clmla_cache_config cc = {1, rkv, dr, bt, 2 * (N / bt) + 2, CLMLA_CACHE_F16, 0, CLMLA_CACHE_F32};
    clmla_cache *cache = NULL;
    CHECK_STATUS(clmla_cache_create(ctx, &cc, &cache), CLMLA_SUCCESS, ctx);
    if (!layer || !cache) {
        clmla_layer_destroy(layer);
        clmla_cache_destroy(cache);
        tu_weights_free(&w);
        return;
    }
    /* Two sequences: s0 gets the 128K random rows (c^KV with unit rms, as after RMSNorm; k^R of
       any size), s1 is decoded through the layer at the same position on the other path. */
    int32_t seqs[2];
    clmla_cache_seq_add(cache, &seqs[0]);
    clmla_cache_seq_add(cache, &seqs[1]);
    tu_rng rng = tu_rng_seed(901);
    float *rows = malloc((size_t)N * row * sizeof(float));
    tu_fill_uniform(rows, (size_t)N * row, 0.0f, 1.7320508f, &rng);
    cl_mem rb = buffer((size_t)N * row * sizeof(float), rows);
    for (int s = 0; s < 2; s++)
        CHECK_STATUS(clmla_cache_append_cl(cache, 0, seqs[s], N, rb, 0, row, rb, (size_t)rkv, row, NULL), CLMLA_SUCCESS,
                     ctx);
    clFinish(clmla_context_queue(ctx));
    clReleaseMemObject(rb);
    free(rows);
    float *ckv = malloc(((size_t)N + 1) * rkv * sizeof(float)), *kr = malloc(((size_t)N + 1) * dr * sizeof(float));
    CHECK_STATUS(clmla_cache_read(cache, 0, seqs[0], 0, N, ckv, kr), CLMLA_SUCCESS, ctx);
    printf("# long: 2 x %d tokens appended and read back in %.1f s\n", N, tu_seconds() - t0);

    /* (a) latent attention alone: token 0 over all N keys, token 1 over the first 100000. */
    {
        const int H = 4, T = 2;
        int32_t *blocks = malloc((size_t)(N / bt + 2) * sizeof(int32_t));
        int nb = 0;
        clmla_cache_seq_blocks(cache, seqs[0], blocks, N / bt + 2, &nb);
        float ql[2 * 4 * 16], qr[2 * 4 * 4];
        tu_fill_uniform(ql, sizeof(ql) / sizeof(float), 0.0f, 1.0f, &rng);
        tu_fill_uniform(qr, sizeof(qr) / sizeof(float), 0.0f, 1.0f, &rng);
        const int ctx_len[2] = {N, 100000}, token_seq[2] = {0, 0};
        cl_mem qlb = buffer(sizeof(ql), ql), qrb = buffer(sizeof(qr), qr);
        cl_mem table = buffer((size_t)nb * sizeof(int32_t), blocks), tsb = buffer(sizeof(token_seq), token_seq);
        cl_mem tcb = buffer(sizeof(ctx_len), ctx_len), outb = buffer(sizeof(ql), NULL), lseb = buffer(T * H * sizeof(float), NULL);
        clmla_latent_attention_args a = {.num_tokens = T, .num_heads = H, .softmax_scale = 0.3f, .q_latent = qlb,
                                         .q_rope = qrb, .block_table = table, .max_blocks_per_seq = nb,
                                         .token_seq = tsb, .token_ctx_len = tcb, .max_ctx_len = N, .out = outb,
                                         .lse = lseb};
        double t1 = tu_seconds();
        CHECK_STATUS(clmla_attention_latent(cache, 0, &a, NULL), CLMLA_SUCCESS, ctx);
        float out[2 * 4 * 16], lse[8];
        read_buffer(outb, sizeof(out), out);
        read_buffer(lseb, sizeof(lse), lse);
        printf("# long: latent attention over %d keys in %.2f s\n", N, tu_seconds() - t1);
        double *cd = malloc((size_t)N * rkv * sizeof(double)), *kd = malloc((size_t)N * dr * sizeof(double));
        for (size_t i = 0; i < (size_t)N * rkv; i++)
            cd[i] = ckv[i];
        for (size_t i = 0; i < (size_t)N * dr; i++)
            kd[i] = kr[i];
        for (int t = 0; t < T; t++) {
            double qld[4 * 16], qrd[4 * 4], want[4 * 16], want_lse[4];
            for (int i = 0; i < H * rkv; i++)
                qld[i] = ql[t * H * rkv + i];
            for (int i = 0; i < H * dr; i++)
                qrd[i] = qr[t * H * dr + i];
            mla_ref_latent_attention(H, rkv, dr, 0.3, ctx_len[t], qld, qrd, cd, kd, want, want_lse);
            CHECK(count_nonfinite(out + t * H * rkv, (size_t)H * rkv) == 0, "128K latent: outputs not finite");
            CHECK_CLOSE(out + t * H * rkv, want, (size_t)H * rkv, rkv, TOL_F32_CACHE,
                        "128K context, f16 cache read back: latent out of token %d (%d keys) [head, i]", t, ctx_len[t]);
            CHECK_CLOSE(lse + t * H, want_lse, (size_t)H, H, TOL_F32_CACHE, "128K context: lse of token %d", t);
        }
        free(cd);
        free(kd);
        free(blocks);
        cl_mem bufs[] = {qlb, qrb, table, tsb, tcb, outb, lseb};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
            clReleaseMemObject(bufs[i]);
    }

    /* (b) the layer: one decode step at position N, absorbed on s0 and decompressed on s1 (same
       cached rows, same new token), against the float64 decode over the rows read back. */
    {
        float *x = tu_random_inputs(1, D, 902), out[2][64];
        double want[64];
        ref_decode(&w, x, N, N, ckv, kr, want);
        for (int p = 0; p < 2; p++) {
            clmla_batch_entry e = {seqs[p], 1};
            double t1 = tu_seconds();
            CHECK_STATUS(forward(layer, cache, &e, 1, p ? CLMLA_PATH_DECOMPRESSED : CLMLA_PATH_ABSORBED, x, out[p]),
                         CLMLA_SUCCESS, ctx);
            printf("# long: layer decode at position %d, %s, in %.2f s\n", N, p ? "decompressed" : "absorbed",
                   tu_seconds() - t1);
            CHECK(count_nonfinite(out[p], (size_t)D) == 0, "128K decode: output not finite");
            CHECK_CLOSE(out[p], want, (size_t)D, D, TOL_F16_CACHE, "128K context, f16 cache: layer decode at position %d, %s",
                        N, p ? "decompressed" : "absorbed");
            int len = -1;
            clmla_cache_seq_length(cache, seqs[p], 0, &len);
            CHECK(len == N + 1, "128K decode: length %d", len);
        }
        double *second = tu_to_double(out[1], (size_t)D);
        CHECK_CLOSE(out[0], second, (size_t)D, D, TOL_AGREE_F16, "128K decode: absorbed vs decompressed");
        free(second);
        free(x);
    }
    free(ckv);
    free(kr);
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    tu_weights_free(&w);
}

/* ---- NaN and Inf --------------------------------------------------------------------------------- */

static void test_nonfinite(void)
{
    static const struct {
        float value;
        const char *name;
    } poisons[] = {{NAN, "NaN"}, {INFINITY, "+Inf"}, {-INFINITY, "-Inf"}};
    clmla_layer_config c = tu_small_config(24, 2, 8, 16, 8, 4, 8);
    const int D = c.hidden_size, Ta = 6, Tb = 6;
    tu_weights w;
    if (tu_weights_make(&w, &c, 77) != 0)
        return;
    clmla_layer *layer = NULL;
    float *xa = tu_random_inputs(Ta, D, 78), *xb = tu_random_inputs(Tb, D, 79);
    tu_ref_run rb;
    CHECK(tu_ref_run_make(&rb, &w, Tb, xb, MLA_REF_DECOMPRESSED) == 0, "reference");
    float *x = malloc((size_t)(Ta + Tb) * D * sizeof(float)), *out = malloc((size_t)(Ta + Tb) * D * sizeof(float));
    double slowest = 0;
    /* Both kernel variants of each path: the CPU ones (_rows) and the work-group ones, each with a
       layer made under it (a layer builds the kernels its context runs). */
    for (int variant = CLMLA_LATENT_GROUP; variant <= CLMLA_LATENT_ROWS; variant++) {
        clmla_attention_set_variant(ctx, variant);
        clmla_layer_destroy(layer);
        layer = NULL;
        CHECK_STATUS(clmla_layer_create(ctx, &c, &w.layer, &layer), CLMLA_SUCCESS, ctx);
        for (size_t pi = 0; layer && pi < sizeof(poisons) / sizeof(poisons[0]); pi++)
            for (int p = 1; p <= 2; p++)
                for (int dt = 0; dt < 2; dt++) {
                    clmla_attention_set_variant(ctx, variant);
                    char what[160];
                    snprintf(what, sizeof(what), "%s in x, %s, %s cache, %s kernels", poisons[pi].name,
                             p == 1 ? "absorbed" : "decompressed", dt ? "f16" : "f32",
                             variant == CLMLA_LATENT_ROWS ? "CPU" : "work-group");
                    clmla_cache_config cc = {1, c.kv_lora_rank, c.qk_rope_head_dim, 4, 8, (clmla_cache_dtype)dt, 0, CLMLA_CACHE_F32};
                    clmla_cache *cache = NULL;
                    CHECK_STATUS(clmla_cache_create(ctx, &cc, &cache), CLMLA_SUCCESS, ctx);
                    int32_t a, b;
                    clmla_cache_seq_add(cache, &a);
                    clmla_cache_seq_add(cache, &b);
                    /* Step 1: a gets tokens 0..3, token 2 carrying the poison in one element; b gets 4
                       clean tokens in the same batch. Step 2: one decode token each. */
                    float *xa_p = malloc((size_t)Ta * D * sizeof(float));
                    memcpy(xa_p, xa, (size_t)Ta * D * sizeof(float));
                    xa_p[2 * D + 5] = poisons[pi].value;
                    memcpy(x, xa_p, (size_t)4 * D * sizeof(float));
                    memcpy(x + 4 * D, xb, (size_t)4 * D * sizeof(float));
                    clmla_batch_entry step1[2] = {{a, 4}, {b, 4}};
                    double t0 = tu_seconds();
                    clmla_status st = forward(layer, cache, step1, 2, (clmla_attention_path)p, x, out);
                    CHECK_STATUS(st, CLMLA_SUCCESS, ctx);
                    float out2[2 * 64];
                    clmla_batch_entry step2[2] = {{b, 1}, {a, 1}};
                    float xs2[2 * 64];
                    memcpy(xs2, xb + 4 * D, (size_t)D * sizeof(float));
                    memcpy(xs2 + D, xa_p + 4 * D, (size_t)D * sizeof(float));
                    clmla_status st2 = forward(layer, cache, step2, 2, (clmla_attention_path)p, xs2, out2);
                    CHECK_STATUS(st2, CLMLA_SUCCESS, ctx);
                    const double took = tu_seconds() - t0;
                    if (took > slowest)
                        slowest = took;
                    CHECK(took < BOUNDED_SECONDS, "%s: two steps took %.1f s", what, took);
                    if (st == CLMLA_SUCCESS && st2 == CLMLA_SUCCESS) {
                        /* a: tokens 0, 1 precede the poison (causal): exactly the clean reference's. */
                        tu_ref_run ra;
                        if (tu_ref_run_make(&ra, &w, 2, xa, MLA_REF_DECOMPRESSED) == 0) {
                            CHECK_CLOSE(out, ra.out, (size_t)2 * D, D, TOL_FOR_DTYPE(dt), "%s: a's tokens before it", what);
                            tu_ref_run_free(&ra);
                        }
                        /* a: token 2 and every later one are visibly not finite. */
                        for (int t = 2; t < 4; t++)
                            CHECK(count_nonfinite(out + (size_t)t * D, (size_t)D) > 0, "%s: a's token %d came out finite",
                                  what, t);
                        CHECK(count_nonfinite(out2 + D, (size_t)D) > 0, "%s: a's decode after it came out finite", what);
                        /* b, in the same batches, is unaffected. */
                        CHECK(count_nonfinite(out + 4 * D, (size_t)4 * D) == 0 && count_nonfinite(out2, (size_t)D) == 0,
                              "%s: b has non-finite outputs", what);
                        CHECK_CLOSE(out + 4 * D, rb.out, (size_t)4 * D, D, TOL_FOR_DTYPE(dt), "%s: b's prefill beside it", what);
                        CHECK_CLOSE(out2, rb.out + 4 * D, (size_t)D, D, TOL_FOR_DTYPE(dt), "%s: b's decode beside it", what);
                        /* And b's cache rows are the reference's. */
                        float ckv[5 * 16], kr[5 * 4];
                        CHECK_STATUS(clmla_cache_read(cache, 0, b, 0, 5, ckv, kr), CLMLA_SUCCESS, ctx);
                        CHECK_CLOSE(ckv, rb.ckv, (size_t)5 * 16, 16, TOL_FOR_DTYPE(dt), "%s: b's cached c^KV", what);
                    }
                    free(xa_p);
                    clmla_cache_destroy(cache);
                }
    }
    clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
    printf("# nonfinite: slowest poisoned pair of steps %.2f s\n", slowest);

    /* A NaN query in clmla_attention_latent: that token's output is NaN, the other token's is not. */
    {
        const int rkv = 16, dr = 4, row = 20, H = 2, n = 40;
        clmla_cache_config cc = {1, rkv, dr, 8, 10, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
        clmla_cache *cache = NULL;
        CHECK_STATUS(clmla_cache_create(ctx, &cc, &cache), CLMLA_SUCCESS, ctx);
        int32_t s0, s1;
        clmla_cache_seq_add(cache, &s0);
        clmla_cache_seq_add(cache, &s1);
        float rows[40 * 20];
        tu_rng rng = tu_rng_seed(5);
        tu_fill_uniform(rows, sizeof(rows) / sizeof(float), 0.0f, 1.0f, &rng);
        cl_mem rbuf = buffer(sizeof(rows), rows);
        clmla_cache_append_cl(cache, 0, s0, n, rbuf, 0, row, rbuf, rkv, row, NULL);
        rows[7 * row + 3] = NAN; /* s1: the same rows but one NaN in key 7 */
        cl_mem rbuf2 = buffer(sizeof(rows), rows);
        clmla_cache_append_cl(cache, 0, s1, n, rbuf2, 0, row, rbuf2, rkv, row, NULL);
        clFinish(clmla_context_queue(ctx));
        int32_t table[2][5];
        clmla_cache_seq_blocks(cache, s0, table[0], 5, NULL);
        clmla_cache_seq_blocks(cache, s1, table[1], 5, NULL);
        /* tokens: 0 NaN query over s0; 1 clean over s0; 2 clean over s1 (NaN key); 3 clean over s1's
           first 7 keys (before the NaN one). */
        enum { T = 4 };
        float ql[T * H * 16], qr[T * H * 4];
        tu_fill_uniform(ql, sizeof(ql) / sizeof(float), 0.0f, 1.0f, &rng);
        tu_fill_uniform(qr, sizeof(qr) / sizeof(float), 0.0f, 1.0f, &rng);
        ql[5] = NAN;
        const int ctx_len[T] = {n, n, n, 7}, token_seq[T] = {0, 0, 1, 1};
        cl_mem qlb = buffer(sizeof(ql), ql), qrb = buffer(sizeof(qr), qr), tb = buffer(sizeof(table), table);
        cl_mem tsb = buffer(sizeof(token_seq), token_seq), tcb = buffer(sizeof(ctx_len), ctx_len);
        cl_mem outb = buffer(sizeof(ql), NULL);
        clmla_latent_attention_args a = {.num_tokens = T, .num_heads = H, .softmax_scale = 0.25f, .q_latent = qlb,
                                         .q_rope = qrb, .block_table = tb, .max_blocks_per_seq = 5, .token_seq = tsb,
                                         .token_ctx_len = tcb, .max_ctx_len = n, .out = outb};
        double t0 = tu_seconds();
        CHECK_STATUS(clmla_attention_latent(cache, 0, &a, NULL), CLMLA_SUCCESS, ctx);
        float out[T * H * 16];
        read_buffer(outb, sizeof(out), out);
        CHECK(tu_seconds() - t0 < BOUNDED_SECONDS, "NaN query: %.1f s", tu_seconds() - t0);
        CHECK(count_nonfinite(out, 16) > 0, "a NaN query (head 0) gave a finite output");
        CHECK(count_nonfinite(out + 16, 16) == 0, "a NaN in head 0's query reached head 1");
        CHECK(count_nonfinite(out + 32, 32) == 0, "a NaN query reached another token");
        CHECK(count_nonfinite(out + 64, 32) > 0, "attention over a NaN key gave a finite output");
        CHECK(count_nonfinite(out + 96, 32) == 0, "attention before the NaN key is not finite");
        cl_mem bufs[] = {rbuf, rbuf2, qlb, qrb, tb, tsb, tcb, outb};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
            clReleaseMemObject(bufs[i]);
        clmla_cache_destroy(cache);
    }
    clmla_layer_destroy(layer);
    tu_ref_run_free(&rb);
    free(xa);
    free(xb);
    free(x);
    free(out);
    tu_weights_free(&w);
}

/* ---- main ---------------------------------------------------------------------------------------- */

static const tu_part parts[] = {
    {"scale", test_scale}, {"logits", test_logits}, {"long", test_long}, {"nonfinite", test_nonfinite},
};

int main(int argc, char **argv)
{
    return tu_parts_exit(
        tu_run_parts(argc, argv, parts, (int)(sizeof(parts) / sizeof(parts[0])), NULL, &ctx, &check_failed));
}
