/* clmla demo: DeepSeek-shaped attention (V2-Lite by default) with random weights on one device: prefill, then
   decode through the paged latent cache, timed, and the last step checked against the float64
   CPU reference (ref/). */
#define _POSIX_C_SOURCE 200809L
#include "args.h"
#include "clmla.h"
#include "commands.h"
#include "mla_ref.h"
#include "random_layer.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* What clmla demo --help says of the command. */
static const char summary[] =
    "DeepSeek-shaped MLA (V2-Lite unless --preset) with random weights: a prefill step, then token-by-token\n"
    "decode through the paged latent cache; prints speed, cache size and the error of the\n"
    "last step against the float64 CPU reference.";

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The float64 reference in two parts, so that a value rounded the other way at a boundary does
   not read as an error of the attention:
   1. the stored cache (read back as float32) against the reference's c^KV and k^R: each value
      must be as close to the unrounded value v as the reference's own rounding r(v) is, up to
      float32 error: a device whose float32 v lies across a rounding boundary from float64's may
      store the neighbour of r(v), nothing further. Each value is a product over the hidden size D
      (then normed and rotated), summed in an order each device picks, so float32 error is taken
      as 4 sqrt(D) float32 epsilons of the row's largest value, at least 2e-6 (1.1e-5 at D 2048,
      1.7e-5 at D 5120), far below the smallest dtype step the check is for, bf16's 3.9e-3;
   2. the output against the reference's attention over those stored values, at 1e-4.
   rw holds the weights as the layer holds them (rounded to its weights dtype), so that both parts
   compare like with like. Then, for information, the output against an unrounded cache: the cache
   dtype's own error; and, with rounded weights, against the reference with the float32 weights
   (rw_f32) and the same cache dtype: the weights dtype's own error. */
static int check_against_reference(const mla_ref_config *rcfg, const mla_ref_weights *rw, const mla_ref_weights *rw_f32,
                                   const char *weights_dtype, clmla_cache *cache, int32_t seq, int dtype,
                                   const char *cache_dtype, int T, const float *x, const float *out)
{
    const size_t D = (size_t)rcfg->hidden, rkv = (size_t)rcfg->kv_lora_rank, dr = (size_t)rcfg->rope_dim;
    double *ref = malloc((size_t)T * D * sizeof(double));
    double *ckv = malloc((size_t)T * rkv * sizeof(double)), *kr = malloc((size_t)T * dr * sizeof(double));
    double *row = malloc((rkv + dr) * sizeof(double));
    float *sc = malloc((size_t)T * rkv * sizeof(float)), *sk = malloc((size_t)T * dr * sizeof(float));
    mla_ref_features rf;
    memset(&rf, 0, sizeof(rf));
    int rc = 1;
    if (!ref || !ckv || !kr || !row || !sc || !sk) {
        fprintf(stderr, "clmla demo: out of host memory\n");
        goto out;
    }
    if (clmla_cache_read(cache, 0, seq, 0, T, sc, sk) != CLMLA_SUCCESS ||
        mla_ref_forward_ext(rcfg, &rf, rw, T, x, NULL, 0, MLA_REF_ABSORBED, ref, ckv, kr, NULL, NULL, NULL, NULL) != 0) {
        fprintf(stderr, "clmla demo: the reference could not run\n");
        goto out;
    }
    const double unrounded_err = mla_ref_max_rel_err(out, ref, (size_t)T * D, NULL);
    size_t differ = 0, beyond = 0;
    const double f32_err = fmax(2e-6, 4.0 * sqrt((double)D) * 0x1p-24);
    double excess = 0; /* the largest distance beyond the rounding's own, as a fraction of the row's largest value */
    for (size_t t = 0; t < (size_t)T; t++) {
        const double *v = ckv + t * rkv, *vr = kr + t * dr;
        memcpy(row, v, rkv * sizeof(double));
        memcpy(row + rkv, vr, dr * sizeof(double));
        mla_ref_round_cache_row((mla_ref_cache_type)dtype, row, (int)rkv, row + rkv, (int)dr); /* same numbering */
        double amax = 0;
        for (size_t i = 0; i < rkv + dr; i++)
            amax = fmax(amax, fabs(i < rkv ? v[i] : vr[i - rkv]));
        for (size_t i = 0; i < rkv + dr; i++) {
            const double want = i < rkv ? v[i] : vr[i - rkv];
            const double got = i < rkv ? sc[t * rkv + i] : sk[t * dr + i - rkv];
            differ += got != row[i];
            const double over = fabs(got - want) - fabs(row[i] - want);
            beyond += !(over <= f32_err * amax);
            if (amax > 0 && over / amax > excess)
                excess = over / amax;
        }
    }
    const size_t values = (size_t)T * (rkv + dr);
    if (dtype == CLMLA_CACHE_F32)
        printf("cache        stored values against the reference's: %zu of %zu further apart than float32 error "
               "(%.1e of the row's largest; at most %.1e): %s\n",
               beyond, values, f32_err, excess, beyond ? "FAILED" : "OK");
    else
        printf("cache        stored values against the reference's %s rounding: %zu of %zu differ, %zu by more than "
               "float32 error (%.1e of the row's largest; at most %.1e beyond the rounding's): %s\n",
               cache_dtype, differ, values, beyond, f32_err, excess, beyond ? "FAILED" : "OK");

    rf.stored_ckv = sc;
    rf.stored_kr = sk;
    if (mla_ref_forward_ext(rcfg, &rf, rw, T, x, NULL, 0, MLA_REF_ABSORBED, ref, NULL, NULL, NULL, NULL, NULL, NULL) !=
        0) {
        fprintf(stderr, "clmla demo: the reference could not run\n");
        goto out;
    }
    const double tolerance = 1e-4;
    const double last = mla_ref_max_rel_err(out + (size_t)(T - 1) * D, ref + (size_t)(T - 1) * D, D, NULL);
    const double all = mla_ref_max_rel_err(out, ref, (size_t)T * D, NULL);
    const int ok = last <= tolerance && all <= tolerance;
    printf("check        max relative error over the stored cache, last step %.2e, all %d tokens %.2e (tolerance "
           "%.0e): %s\n",
           last, T, all, tolerance, ok ? "OK" : "FAILED");
    if (dtype != CLMLA_CACHE_F32)
        printf("rounding     the %s cache's own error, against an unrounded cache: max relative error %.2e\n", cache_dtype,
               unrounded_err);
    rc = ok && beyond == 0 ? 0 : 1;
    if (rw_f32) {
        mla_ref_features wf;
        memset(&wf, 0, sizeof(wf));
        wf.cache_type = (mla_ref_cache_type)dtype; /* the same cache rounding: only the weights differ */
        if (mla_ref_forward_ext(rcfg, &wf, rw_f32, T, x, NULL, 0, MLA_REF_ABSORBED, ref, NULL, NULL, NULL, NULL, NULL,
                                NULL) != 0) {
            fprintf(stderr, "clmla demo: the reference could not run\n");
            rc = 1;
            goto out;
        }
        printf("rounding     the %s weights' own error, against float32 weights (same %s cache): max relative error "
               "%.2e\n",
               weights_dtype, cache_dtype, mla_ref_max_rel_err(out, ref, (size_t)T * D, NULL));
    }
out:
    free(ref);
    free(ckv);
    free(kr);
    free(row);
    free(sc);
    free(sk);
    return rc;
}

int cmd_demo(int argc, char **argv)
{
    int exit_code = 0, prefill = 512, decode = 64, seed = 1, no_check = 0;
    const char *device = NULL, *cache_dtype = "f32", *weights_dtype = "auto", *preset_name = "v2-lite";
    cli_option opts[] = {
        {"device", CLI_STRING, &device, "SPEC  device to run on (see clmla devices)"},
        {"preset", CLI_STRING, &preset_name, "NAME  attention shape: v2-lite (default), v2, v3, kimi-k2"},
        {"prefill", CLI_INT, &prefill, "N     prompt tokens, one prefill step (default 512)"},
        {"decode", CLI_INT, &decode, "N     tokens decoded one at a time after it (default 64)"},
        {"cache-dtype", CLI_STRING, &cache_dtype, CLI_CACHE_DTYPES "  latent cache storage (default f32)"},
        {"weights-dtype", CLI_STRING, &weights_dtype,
         CLI_WEIGHTS_DTYPES "  weights on the device (default auto: f32, as the random weights are made)"},
        {"seed", CLI_INT, &seed, "N     seed of the random weights and inputs (default 1)"},
        {"no-check", CLI_FLAG, &no_check, "skip the float64 CPU reference check"},
        {NULL, CLI_FLAG, NULL, NULL},
    };
    if (cli_start("demo", summary, opts, argc, argv, &exit_code))
        return exit_code;
    const int dtype = cli_cache_dtype(cache_dtype);
    if (dtype < 0) {
        fprintf(stderr, "clmla demo: --cache-dtype must be one of " CLI_CACHE_DTYPES ", not '%s'\n", cache_dtype);
        return 2;
    }
    int want = cli_weights_dtype(weights_dtype);
    if (want < 0) {
        fprintf(stderr, "clmla demo: --weights-dtype must be one of " CLI_WEIGHTS_DTYPES ", not '%s'\n", weights_dtype);
        return 2;
    }
    if (prefill < 1 || decode < 0 || prefill + decode > 1 << 20) {
        fprintf(stderr, "clmla demo: need --prefill >= 1, --decode >= 0, and at most 2^20 tokens in all\n");
        return 2;
    }
    const int T = prefill + decode;
    /* The DeepSeek presets: one RoPE (interleaved pairs, YaRN) and the layout the reference's
       basic configuration describes; the other families are checked against transformers by
       tests/parity. */
    clmla_preset preset = CLMLA_PRESET_DEEPSEEK_V2_LITE;
    if (clmla_preset_from_name(preset_name, &preset) != CLMLA_SUCCESS ||
        (preset != CLMLA_PRESET_DEEPSEEK_V2_LITE && preset != CLMLA_PRESET_DEEPSEEK_V2 &&
         preset != CLMLA_PRESET_DEEPSEEK_V3 && preset != CLMLA_PRESET_KIMI_K2)) {
        fprintf(stderr, "clmla demo: --preset must be one of v2-lite, v2, v3, kimi-k2, not '%s'\n", preset_name);
        return 2;
    }

    clmla_context *ctx = NULL;
    clmla_device_info info;
    if (cli_context_create("demo", device, &ctx, &info))
        return 1;
    printf("device       %s (%s, %s), %u compute units\n", info.name, info.platform_name, info.driver_version,
           info.compute_units);

    /* Weights ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), norms ~ 1, inputs ~ U(-1, 1). */
    uint64_t rng = (uint64_t)seed * 0x9E3779B97F4A7C15ULL + 1;
    cli_random_layer rl;
    const int made = cli_random_layer_make(&rl, preset, (clmla_weights_dtype)want, &rng); /* auto: f32 */
    const clmla_layer_config cfg = rl.cfg;
    const clmla_dtype held = rl.held;
    const char *held_name = clmla_dtype_name(held);
    const int D = cfg.hidden_size, H = cfg.num_heads, rq = cfg.q_lora_rank, rkv = cfg.kv_lora_rank,
              dn = cfg.qk_nope_head_dim, dr = cfg.qk_rope_head_dim, dv = cfg.v_head_dim, dq = dn + dr;
    printf("model        %s attention shape: D %d, %d heads, q_lora_rank %d, kv_lora_rank %d, head dims %d/%d/%d, "
           "YaRN s=%g\n",
           clmla_preset_name(preset), D, H, rq, rkv, dn, dr, dv, cfg.yarn_factor);
    float *x = made == 0 ? clmla_tuner_random_floats((size_t)T * D, 1.0f, 0, &rng) : NULL;
    float *out = malloc((size_t)T * D * sizeof(float));
    int rc = 1;
    clmla_layer *layer = NULL;
    clmla_cache *cache = NULL;
    double *decode_ms = malloc(((size_t)decode + 1) * sizeof(double));
    if (made != 0 || !x || !out || !decode_ms) {
        fprintf(stderr, "clmla demo: out of host memory\n");
        goto done;
    }

    printf("setup        building kernels and uploading weights (compiles happen on a first run only; "
           "then they come from the cache)...\n");
    fflush(stdout);
    double t0 = now_seconds();
    if (clmla_layer_create(ctx, &cfg, &rl.w, &layer) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla demo: %s\n", clmla_last_error(ctx));
        goto done;
    }
    const int block_tokens = 64;
    const int cache_tokens = T > CLMLA_WARMUP_TOKENS ? T : CLMLA_WARMUP_TOKENS;
    clmla_cache_config cc = {1, rkv, dr, block_tokens, (cache_tokens + block_tokens - 1) / block_tokens + 2,
                             (clmla_cache_dtype)dtype, 0, CLMLA_CACHE_F32};
    if (clmla_cache_create(ctx, &cc, &cache) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla demo: %s\n", clmla_last_error(ctx));
        goto done;
    }
    /* Every kernel the steps will select, built now (clmla_layer_warmup), so that the timed steps
       compile nothing. */
    if (clmla_layer_warmup(layer, cache, 0) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla demo: warm-up: %s\n", clmla_last_error(ctx));
        goto done;
    }
    int32_t seq = -1;
    clmla_batch_entry entry = {0, 0};
    clmla_forward_args args = {&entry, 1, 0, CLMLA_PATH_AUTO};
    printf("setup        %.1f s (kernel builds, weight upload, clmla_layer_warmup)\n", now_seconds() - t0);

    /* The measured run. */
    clmla_cache_seq_add(cache, &seq);
    entry.seq_id = seq;
    entry.num_tokens = prefill;
    args.path = CLMLA_PATH_AUTO;
    clmla_attention_path chosen = CLMLA_PATH_ABSORBED;
    clmla_layer_auto_path(layer, 0, prefill, &chosen);
    const char *prefill_path = chosen == CLMLA_PATH_DECOMPRESSED ? "decompressed" : "absorbed";
    t0 = now_seconds();
    if (clmla_layer_forward(layer, cache, &args, x, out) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla demo: prefill: %s\n", clmla_last_error(ctx));
        goto done;
    }
    const double prefill_s = now_seconds() - t0;
    printf("prefill      %d tokens in %.1f ms: %.0f tokens/s (%s path)\n", prefill, prefill_s * 1e3, prefill / prefill_s,
           prefill_path);
    entry.num_tokens = 1;
    for (int i = 0; i < decode; i++) {
        t0 = now_seconds();
        if (clmla_layer_forward(layer, cache, &args, x + (size_t)(prefill + i) * D, out + (size_t)(prefill + i) * D) !=
            CLMLA_SUCCESS) {
            fprintf(stderr, "clmla demo: decode step %d: %s\n", i, clmla_last_error(ctx));
            goto done;
        }
        decode_ms[i] = (now_seconds() - t0) * 1e3;
    }
    if (decode > 0) {
        qsort(decode_ms, (size_t)decode, sizeof(double), compare_double);
        printf("decode       %d tokens at context %d..%d: median %.2f ms/token (min %.2f, max %.2f; absorbed path)\n",
               decode, prefill + 1, T, decode_ms[decode / 2], decode_ms[0], decode_ms[decode - 1]);
    }
    clmla_cache_info ci;
    clmla_cache_get_info(cache, &ci);
    const size_t elem = dtype == CLMLA_CACHE_F32 ? 4 : dtype == CLMLA_CACHE_FP8 ? 1 : 2;
    const size_t mha = (size_t)H * (dq + dv) * elem;
    printf("kv cache     %zu bytes/token/layer (%s c^KV + k^R); standard MHA would cache %zu: %.1fx less\n",
           ci.bytes_per_token_per_layer, cache_dtype, mha, (double)mha / ci.bytes_per_token_per_layer);
    clmla_layer_memory lm;
    if (clmla_layer_get_memory(layer, &lm) == CLMLA_SUCCESS) {
        /* Bytes per weight of the four projections as the layer reports them: what the device
           holds (FP8 scales and CPU panel padding included), so a dtype the layer did not keep shows. */
        const double query = rq > 0 ? (double)rq * D + (double)H * dq * rq : (double)H * dq * D;
        const double values = query + (double)(rkv + dr) * D + (double)H * (dn + dv) * rkv + (double)D * H * dv;
        const double projections =
            (double)lm.q_proj + lm.q_a_proj + lm.q_b_proj + lm.kv_a_proj_with_mqa + lm.kv_b_proj + lm.o_proj;
        char q_text[96];
        if (rq > 0)
            snprintf(q_text, sizeof(q_text), "q_a_proj %.2f, q_b_proj %.2f", lm.q_a_proj / 1048576.0,
                     lm.q_b_proj / 1048576.0);
        else
            snprintf(q_text, sizeof(q_text), "q_proj %.2f", lm.q_proj / 1048576.0);
        printf("weights      %.1f MiB on the device, projections in %s (%.2f bytes/weight): %s, "
               "kv_a_proj_with_mqa %.2f, kv_b_proj %.2f, o_proj %.2f MiB\n",
               lm.total / 1048576.0, held_name, projections / values, q_text, lm.kv_a_proj_with_mqa / 1048576.0,
               lm.kv_b_proj / 1048576.0, lm.o_proj / 1048576.0);
    }

    if (no_check) {
        printf("check        skipped (--no-check)\n");
        rc = 0;
        goto done;
    }
    printf("check        float64 CPU reference of all %d tokens on one core (its time grows with the preset's "
           "size; --no-check skips it)...\n",
           T);
    fflush(stdout);
    const double check_start = now_seconds();
    rc = check_against_reference(&rl.rcfg, &rl.rw_held, held == CLMLA_DTYPE_F32 ? NULL : &rl.rw, held_name, cache, seq, dtype,
                                 cache_dtype, T, x, out);
    printf("check        took %.1f s\n", now_seconds() - check_start);

done:
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    clmla_context_destroy(ctx);
    if (made == 0)
        cli_random_layer_free(&rl);
    free(x);
    free(out);
    free(decode_ms);
    return rc;
}
