/* Soak: decode steps for minutes, the way a server runs them, with memory use flat.
 *
 * Four sequences are live at a time; every step decodes one token for each (a batch of 4, on the
 * auto path: absorbed), and a sequence that reaches its length (100 to 400 tokens) is freed and
 * replaced by a new one with a prefill chunk of PREFILL tokens (auto: decompressed), so block ids,
 * sequence ids and scratch buffers are recycled all the time. Every 500 steps one sequence's latest
 * output is compared with the float64 reference over its whole history.
 *
 * The shapes of the launches are few on purpose (batches of 4 decode tokens, or of 1 to 4 chunks of
 * PREFILL tokens): PoCL compiles a work-group function for every local size it picks, and for the
 * kernels launched without one (cache_write, cache_gather, rope, attn_combine) that depends on the
 * global size, so every new token count or context length gathered costs a compile and some
 * resident memory that stays (docs/RELIABILITY.md). Varied shapes would measure that, not clmla.
 *
 * Memory: VmRSS (/proc/self/status) is sampled every second. After a warm-up (a fifth of the run,
 * at least 20 s: kernels built, scratch buffers at their largest), the resident size may not grow
 * by more than RSS_GROWTH_LIMIT_KB, and a least-squares line through the samples after warm-up may
 * not climb by more than that over the run. The OpenCL objects held (the context's reference
 * count, less scratch buffers) must be the same at the end as after warm-up.
 *
 * `test_soak [SECONDS]` (default 300). Not in the default ctest set: CMake registers it with
 * -DCLMLA_SOAK=ON, under the label `soak` (ctest -L soak). */
#include "check.h"
#include "clmla.h"
#include "internal.h"
#include "mla_ref.h"
#include "test_util.h"
#include "tolerance.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RSS_GROWTH_LIMIT_KB 8192

enum { LIVE = 4, MAX_LEN = 400, PREFILL = 48 };

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kb = strtol(line + 6, NULL, 10);
            break;
        }
    fclose(f);
    return kb;
}

/* The context's OpenCL objects, less its scratch buffers (which may be replaced by larger ones). */
static long objects_held(clmla_context *ctx)
{
    clFinish(clmla_context_queue(ctx));
    cl_uint refs = 0;
    clGetContextInfo(clmla_context_cl_context(ctx), CL_CONTEXT_REFERENCE_COUNT, sizeof(refs), &refs, NULL);
    long scratch = 0;
    for (int i = 0; i < 16; i++)
        scratch += ctx->scratch[i] != NULL;
    return (long)refs - scratch;
}

typedef struct live_seq {
    int32_t id;
    int len, target;
    float *x; /* [MAX_LEN, D] */
} live_seq;

int main(int argc, char **argv)
{
    const double seconds = argc > 1 ? atof(argv[1]) : 300.0;
    const double warmup = seconds / 5 > 20 ? seconds / 5 : 20;
    clmla_context *ctx = NULL;
    if (clmla_context_create(NULL, &ctx) != CLMLA_SUCCESS) {
        CHECK(0, "no device: %s", clmla_last_error(NULL));
        return check_summary();
    }
    /* A quarter of V2-Lite's widths: 8 heads, rkv 128, dn/dr/dv 32/16/32, f16 cache. */
    clmla_layer_config c = tu_small_config(512, 8, 0, 128, 32, 16, 32);
    const int D = c.hidden_size;
    tu_weights w;
    if (tu_weights_make(&w, &c, 1) != 0)
        return 1;
    clmla_layer *layer = NULL;
    clmla_cache *cache = NULL;
    CHECK_STATUS(clmla_layer_create(ctx, &c, &w.layer, &layer), CLMLA_SUCCESS, ctx);
    clmla_cache_config cc = {1, c.kv_lora_rank, c.qk_rope_head_dim, 16, LIVE * (MAX_LEN / 16 + 1), CLMLA_CACHE_F16, 0, CLMLA_CACHE_F32};
    CHECK_STATUS(clmla_cache_create(ctx, &cc, &cache), CLMLA_SUCCESS, ctx);
    if (!layer || !cache)
        return check_summary();

    tu_rng rng = tu_rng_seed(2024);
    live_seq seqs[LIVE];
    float *x = malloc((size_t)LIVE * PREFILL * D * sizeof(float)), *out = malloc((size_t)LIVE * PREFILL * D * sizeof(float));
    for (int i = 0; i < LIVE; i++) {
        seqs[i].x = malloc((size_t)MAX_LEN * D * sizeof(float));
        seqs[i].id = -1;
    }
    enum { MAX_SAMPLES = 100000 };
    static double sample_t[MAX_SAMPLES], sample_kb[MAX_SAMPLES];
    int samples = 0;
    long steps = 0, tokens = 0, sequences = 0, checked = 0, rss_start = rss_kb(), rss_warm = -1, rss_max = 0;
    long objects_warm = -1;
    const double t0 = tu_seconds();
    double next_sample = 0;
    int failed_before = check_failed;
    for (;;) {
        const double now = tu_seconds() - t0;
        if (now >= seconds || check_failed - failed_before > 10)
            break;
        if (now >= next_sample && samples < MAX_SAMPLES) {
            const long kb = rss_kb();
            sample_t[samples] = now;
            sample_kb[samples++] = (double)kb;
            if (kb > rss_max)
                rss_max = kb;
            if (rss_warm < 0 && now >= warmup) {
                rss_warm = kb;
                objects_warm = objects_held(ctx);
                printf("# warm-up done at %.0f s: VmRSS %ld kB (start %ld kB), %ld steps\n", now, kb, rss_start, steps);
            }
            next_sample += 1.0;
        }
        /* New sequences, each with a prefill chunk (one batch for all that need one). */
        clmla_batch_entry e[LIVE];
        int n = 0, rows = 0;
        for (int i = 0; i < LIVE; i++) {
            if (seqs[i].id >= 0 && seqs[i].len < seqs[i].target)
                continue;
            if (seqs[i].id >= 0)
                CHECK_STATUS(clmla_cache_seq_free(cache, seqs[i].id), CLMLA_SUCCESS, ctx);
            CHECK_STATUS(clmla_cache_seq_add(cache, &seqs[i].id), CLMLA_SUCCESS, ctx);
            seqs[i].len = 0;
            seqs[i].target = 100 + tu_rng_below(&rng, MAX_LEN - 100 + 1);
            const int chunk = PREFILL;
            float *fresh = tu_random_inputs(chunk, D, tu_rng_next(&rng));
            memcpy(x + (size_t)rows * D, fresh, (size_t)chunk * D * sizeof(float));
            free(fresh);
            e[n].seq_id = seqs[i].id;
            e[n].num_tokens = chunk;
            n++;
            rows += chunk;
            sequences++;
        }
        const clmla_attention_path path = CLMLA_PATH_AUTO;
        if (n == 0) {
            /* A decode step for every sequence. */
            for (int i = 0; i < LIVE; i++) {
                float *fresh = tu_random_inputs(1, D, tu_rng_next(&rng));
                memcpy(x + (size_t)i * D, fresh, (size_t)D * sizeof(float));
                free(fresh);
                e[i].seq_id = seqs[i].id;
                e[i].num_tokens = 1;
            }
            n = LIVE;
            rows = LIVE;
        }
        clmla_forward_args a = {e, n, 0, path};
        clmla_status st = clmla_layer_forward(layer, cache, &a, x, out);
        CHECK_STATUS(st, CLMLA_SUCCESS, ctx);
        if (st != CLMLA_SUCCESS)
            break;
        /* Record the rows and, now and then, compare one sequence's newest output. */
        int row = 0;
        live_seq *checked_seq = NULL;
        int checked_row = 0;
        for (int k = 0; k < n; k++) {
            for (int i = 0; i < LIVE; i++)
                if (seqs[i].id == e[k].seq_id) {
                    memcpy(seqs[i].x + (size_t)seqs[i].len * D, x + (size_t)row * D, (size_t)e[k].num_tokens * D * sizeof(float));
                    seqs[i].len += e[k].num_tokens;
                    if (k == 0) {
                        checked_seq = &seqs[i];
                        checked_row = row + e[k].num_tokens - 1;
                    }
                }
            row += e[k].num_tokens;
        }
        tokens += rows;
        if (steps % 500 == 0 && checked_seq) {
            tu_ref_run ref;
            if (tu_ref_run_make(&ref, &w, checked_seq->len, checked_seq->x, MLA_REF_DECOMPRESSED) == 0) {
                CHECK_CLOSE(out + (size_t)checked_row * D, ref.out + (size_t)(checked_seq->len - 1) * D, (size_t)D, D,
                            TOL_F16_CACHE, "step %ld: sequence %d token %d", steps, (int)checked_seq->id,
                            checked_seq->len - 1);
                tu_ref_run_free(&ref);
                checked++;
            }
        }
        steps++;
    }
    const double elapsed = tu_seconds() - t0;
    const long rss_end = rss_kb(), objects_end = objects_held(ctx);

    /* Least squares over the samples after warm-up: kB per second. */
    double sn = 0, st_ = 0, sk = 0, stt = 0, stk = 0;
    for (int i = 0; i < samples; i++)
        if (sample_t[i] >= warmup) {
            sn++;
            st_ += sample_t[i];
            sk += sample_kb[i];
            stt += sample_t[i] * sample_t[i];
            stk += sample_t[i] * sample_kb[i];
        }
    const double slope = sn > 2 ? (sn * stk - st_ * sk) / (sn * stt - st_ * st_) : 0.0;
    const double climb = slope * (seconds - warmup);
    printf("# soak: %.0f s, %ld steps (%.1f steps/s), %ld tokens, %ld sequences, %ld outputs checked\n", elapsed, steps,
           steps / elapsed, tokens, sequences, checked);
    printf("# VmRSS kB: start %ld, after warm-up %ld, end %ld, max %ld; trend after warm-up %+.2f kB/s (%+.0f kB over "
           "the run); OpenCL objects after warm-up %ld, end %ld\n",
           rss_start, rss_warm, rss_end, rss_max, slope, climb, objects_warm, objects_end);
    printf("# VmRSS every 10 s (kB):");
    for (int i = 0; i < samples; i += 10)
        printf(" %.0f", sample_kb[i]);
    printf("\n");
    CHECK(elapsed < warmup || rss_warm > 0, "no sample after warm-up");
    if (rss_warm > 0) {
        CHECK(rss_end - rss_warm <= RSS_GROWTH_LIMIT_KB, "VmRSS grew by %ld kB after warm-up (limit %d kB)",
              rss_end - rss_warm, RSS_GROWTH_LIMIT_KB);
        CHECK(climb <= RSS_GROWTH_LIMIT_KB, "VmRSS trend %+.2f kB/s climbs %.0f kB over the run (limit %d kB)", slope,
              climb, RSS_GROWTH_LIMIT_KB);
        CHECK(objects_end == objects_warm, "OpenCL objects held: %ld after warm-up, %ld at the end", objects_warm,
              objects_end);
    }
    CHECK(checked > 0, "no output was checked against the reference");
    for (int i = 0; i < LIVE; i++)
        free(seqs[i].x);
    free(x);
    free(out);
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    tu_weights_free(&w);
    clmla_context_destroy(ctx);
    return check_summary();
}
