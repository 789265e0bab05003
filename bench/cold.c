/* Phase "cold": what a process pays before its first step, reported apart from the timed rows.
 *
 * A sample creates a context of its own on the device under test, a layer with random weights (made
 * beforehand, untimed), a cache, runs clmla_layer_warmup (which builds every kernel the layer's
 * steps select) and then the first real step: `batch` fresh sequences of `ctx` tokens each, path
 * auto, on host arrays. Everything is destroyed again before the next sample.
 *   build   the disk cache off: every program of the sample is compiled from source
 *   cache   a disk cache of the row's own (a temporary folder, filled by an untimed sample first and
 *           removed at the end): every program is loaded from its binary, on every device (PoCL's
 *           CPU device keeps no binaries by default, clmla.h's program_binaries; this row keeps
 *           them there too)
 * The row's median is the whole, context creation to the end of the first step, by wall clock;
 * the parts are reported beside it, with the programs the sample built or loaded (layer creation
 * builds its weight conversion and packing kernels; the first step of a warmed layer builds
 * nothing, and the note says so if it did).
 * Samples: 3, or 1 when the row's time budget is under a second (--quick). */
#include "bench.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct cold_sample {
    double context_ms, layer_ms, warmup_ms, first_ms, total_ms;
    int built, loaded;             /* programs of the whole sample */
    int first_built, first_loaded; /* of the first step alone */
} cold_sample;

static int cold_fail(clmla_context *ctx, const char *what)
{
    fprintf(stderr, "clmla-bench: cold start, %s: %s\n", what, clmla_last_error(ctx));
    return 1;
}

static int compare_doubles(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int one_sample(const bench_case *c, const char *device_spec, const char *cache_dir,
                      const bench_layer_weights *bw, const float *x, float *out, cold_sample *r)
{
    const bench_shape *s = c->shape;
    memset(r, 0, sizeof(*r));
    clmla_context_options o;
    memset(&o, 0, sizeof(o));
    o.device = device_spec;
    o.cache_dir = cache_dir;
    o.program_binaries = "on";
    o.clblast_tuning = getenv("CLMLA_CLBLAST_TUNING") ? NULL : "auto"; /* as the bench's own context */
    clmla_context *ctx = NULL;
    clmla_layer *layer = NULL;
    clmla_cache *cache = NULL;
    int32_t *seqs = calloc((size_t)c->batch, sizeof(int32_t));
    clmla_batch_entry *entries = calloc((size_t)c->batch, sizeof(clmla_batch_entry));
    if (!seqs || !entries) {
        free(seqs);
        free(entries);
        fprintf(stderr, "clmla-bench: out of host memory\n");
        return 1;
    }
    int rc = 0;
    const double t0 = bench_now();
    if (clmla_context_create_opts(&o, &ctx) != CLMLA_SUCCESS)
        rc = cold_fail(NULL, "context");
    const double t1 = bench_now();
    clmla_program_stats start, after_warmup, after_step;
    memset(&start, 0, sizeof(start));
    after_warmup = after_step = start;
    if (!rc)
        clmla_context_program_stats(ctx, &start);
    if (!rc && clmla_layer_create(ctx, &bw->config, &bw->weights, &layer) != CLMLA_SUCCESS)
        rc = cold_fail(ctx, "layer");
    const int per_seq = (c->ctx + c->block_tokens - 1) / c->block_tokens;
    const int blocks = (CLMLA_WARMUP_TOKENS + c->block_tokens - 1) / c->block_tokens + c->batch * per_seq;
    clmla_cache_config cc = {1, s->rkv, s->dr, c->block_tokens, blocks, c->dtype, 0, CLMLA_CACHE_F32};
    if (!rc && clmla_cache_create(ctx, &cc, &cache) != CLMLA_SUCCESS)
        rc = cold_fail(ctx, "cache");
    const double t2 = bench_now();
    if (!rc && clmla_layer_warmup(layer, cache, 0) != CLMLA_SUCCESS)
        rc = cold_fail(ctx, "warm-up");
    const double t3 = bench_now();
    if (!rc)
        clmla_context_program_stats(ctx, &after_warmup);
    for (int b = 0; !rc && b < c->batch; b++) {
        if (clmla_cache_seq_add(cache, &seqs[b]) != CLMLA_SUCCESS)
            rc = cold_fail(ctx, "sequence");
        entries[b].seq_id = seqs[b];
        entries[b].num_tokens = c->ctx;
    }
    const double t4 = bench_now();
    clmla_forward_args args = {entries, c->batch, 0, CLMLA_PATH_AUTO};
    if (!rc && clmla_layer_forward(layer, cache, &args, x, out) != CLMLA_SUCCESS)
        rc = cold_fail(ctx, "first step");
    const double t5 = bench_now();
    if (!rc)
        clmla_context_program_stats(ctx, &after_step);
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    clmla_context_destroy(ctx);
    free(seqs);
    free(entries);
    if (rc)
        return 1;
    r->context_ms = (t1 - t0) * 1e3;
    r->layer_ms = (t2 - t1) * 1e3;
    r->warmup_ms = (t3 - t2) * 1e3;
    r->first_ms = (t5 - t4) * 1e3;
    r->total_ms = r->context_ms + r->layer_ms + r->warmup_ms + r->first_ms;
    r->built = (int)(after_step.built_from_source - start.built_from_source);
    r->loaded = (int)(after_step.loaded_from_disk - start.loaded_from_disk);
    r->first_built = (int)(after_step.built_from_source - after_warmup.built_from_source);
    r->first_loaded = (int)(after_step.loaded_from_disk - after_warmup.loaded_from_disk);
    return 0;
}

/* Removes the row's own cache folder: its *.clbin files, then the folder. */
static void remove_cache_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            const size_t len = strlen(e->d_name);
            if (len > 6 && strcmp(e->d_name + len - 6, ".clbin") == 0) {
                char path[4096];
                snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
                unlink(path);
            }
        }
        closedir(d);
    }
    rmdir(dir);
}

int bench_cold(const bench_case *c, const char *device_spec, bench_row *row)
{
    const bench_shape *s = c->shape;
    const int build = strcmp(c->path, "build") == 0;
    if (!build && strcmp(c->path, "cache") != 0) {
        snprintf(row->note, sizeof(row->note), "the cold phase's paths are build and cache, not %s", c->path);
        return -1;
    }
    const size_t values = (size_t)c->batch * c->ctx * s->D;
    const double need = bench_weight_bytes(s) + 2.0 * values * sizeof(float);
    if (need > (double)c->dev->memory_budget) {
        snprintf(row->note, sizeof(row->note), "needs about %.0f MiB, more than the %.0f MiB budget (--max-mem)",
                 need / 1048576.0, c->dev->memory_budget / 1048576.0);
        return -1;
    }
    bench_layer_weights bw;
    if (bench_layer_weights_make(s, c->seed, c->weights, &bw))
        return 1;
    float *x = malloc(values * sizeof(float)), *out = malloc(values * sizeof(float));
    char dir[4096] = "off";
    int rc = !x || !out;
    if (rc)
        fprintf(stderr, "clmla-bench: out of host memory\n");
    for (size_t i = 0; !rc && i < values; i++)
        x[i] = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
    if (!rc && !build) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof(dir), "%s/clmla-bench-cold-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            fprintf(stderr, "clmla-bench: cannot make a cache folder %s\n", dir);
            rc = 1;
            dir[0] = '\0';
        }
    }
    cold_sample prime;
    if (!rc && !build)
        rc = one_sample(c, device_spec, dir, &bw, x, out, &prime); /* fills the folder, untimed */
    const int n = c->timing->max_seconds < 1.0 ? 1 : 3;
    cold_sample samples[3];
    for (int i = 0; !rc && i < n; i++)
        rc = one_sample(c, device_spec, dir, &bw, x, out, &samples[i]);
    if (!rc) {
        double v[5][3];
        for (int i = 0; i < n; i++) {
            v[0][i] = samples[i].total_ms;
            v[1][i] = samples[i].context_ms;
            v[2][i] = samples[i].layer_ms;
            v[3][i] = samples[i].warmup_ms;
            v[4][i] = samples[i].first_ms;
        }
        row->t.first_ms = samples[0].total_ms;
        row->t.min_ms = row->t.max_ms = samples[0].total_ms;
        for (int i = 1; i < n; i++) {
            row->t.min_ms = samples[i].total_ms < row->t.min_ms ? samples[i].total_ms : row->t.min_ms;
            row->t.max_ms = samples[i].total_ms > row->t.max_ms ? samples[i].total_ms : row->t.max_ms;
        }
        row->t.median_ms = row->t.wall_median_ms = median_of(v[0], n);
        row->t.samples = n;
        row->t.calls_per_sample = 1;
        row->t.stable = 1;
        row->t.timer = "wall";
        row->cold_context_ms = median_of(v[1], n);
        row->cold_layer_ms = median_of(v[2], n);
        row->cold_warmup_ms = median_of(v[3], n);
        row->cold_first_step_ms = median_of(v[4], n);
        const cold_sample *last = &samples[n - 1];
        row->cold_built = last->built;
        row->cold_loaded = last->loaded;
        const char *kcache = getenv("POCL_KERNEL_CACHE");
        const int pocl_cache = strstr(c->dev->info.platform_name, "Portable Computing Language") &&
                               !(kcache && strcmp(kcache, "0") == 0);
        snprintf(row->note, sizeof(row->note),
                 "context %.0f + layer %.0f + warm-up %.0f + step %.0f ms; programs %d built, %d loaded%s%s",
                 row->cold_context_ms, row->cold_layer_ms, row->cold_warmup_ms, row->cold_first_step_ms, last->built,
                 last->loaded, last->first_built + last->first_loaded ? "; the step built programs" : "",
                 build && pocl_cache ? "; PoCL's own kernel cache on" : "");
    }
    row->check_error = -1;
    if (!build && dir[0])
        remove_cache_dir(dir);
    free(x);
    free(out);
    bench_layer_weights_free(&bw);
    return rc ? 1 : 0;
}
