/* Results: a table on stdout, and with --json a JSON array of one object per row (cJSON), rewritten
   after every row so that an interrupted sweep keeps what it measured. */
#include "bench.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct bench_report {
    const bench_device *dev;
    const bench_shape *shape;
    const char *json_path;
    cJSON *rows;
    bench_peaks peaks;
    int header_printed;
    int json_failed;
};

static double mib(double bytes)
{
    return bytes / 1048576.0;
}

bench_report *bench_report_open(const bench_device *dev, const bench_shape *shape, const char *json_path)
{
    bench_report *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->dev = dev;
    r->shape = shape;
    r->json_path = json_path;
    r->rows = cJSON_CreateArray();
    if (!r->rows) {
        free(r);
        return NULL;
    }
    const clmla_device_info *i = &dev->info;
    const bench_shape *s = shape;
    printf("clmla-bench %s\n", clmla_version_string());
    printf("device   %s | %s | %s | driver %s | %u compute units | %.0f MiB, max allocation %.0f MiB\n", i->name,
           i->vendor, i->platform_name, i->driver_version, i->compute_units, mib((double)i->global_mem_bytes),
           mib((double)i->max_alloc_bytes));
    printf("timing   %s; %s\n", dev->profiling ? "OpenCL profiling events" : "wall clock around clFinish",
           !dev->flush_buffer  ? "warm caches (--warm-cache)"
           : dev->flush_kernel ? "caches flushed before every call (a read of the flush size below on every compute unit)"
                               : "caches flushed before every call (a write of the flush size below)");
    if (dev->flush_buffer)
        printf("flush    %.0f MiB\n", mib((double)dev->flush_bytes));
    printf("model    %s: D %d, %d heads, q_lora_rank %d, kv_lora_rank %d, head dims nope/rope/v %d/%d/%d, softmax scale %.6f\n",
           s->preset, s->D, s->H, s->rq, s->rkv, s->dn, s->dr, s->dv, s->scale);
    fflush(stdout);
    return r;
}

void bench_report_peaks(bench_report *r, const bench_peaks *peaks)
{
    r->peaks = *peaks;
}

static void print_header(bench_report *r)
{
    if (r->header_printed)
        return;
    r->header_printed = 1;
    printf("\n%-8s %-14s %-6s %-6s %5s %6s %9s %9s %-21s %9s %-5s %6s %10s %9s %9s %5s %5s %10s %10s  %s\n", "phase",
           "path", "wdtype", "cdtype", "batch", "ctx", "first ms", "median ms", "(min - max)", "bound ms", "by",
           "%bound", "tokens/s", "GB/s", "GFLOP/s", "%bw", "%flop", "cache MiB", "MHA MiB", "note");
}

/* The roofline's time for a row: max(bytes / read peak, FLOPs / FMA peak) in ms, and which term
   is the larger ("bw" or "flops"). Every count the row has needs its peak; returns 0 (no bound)
   when one is missing or the row counts nothing. */
static int row_bound(const bench_peaks *p, double bytes, double flops, double *ms, const char **by)
{
    *ms = 0;
    *by = NULL;
    if ((bytes > 0 && !(p->read_gbs > 0)) || (flops > 0 && !(p->fma_gflops > 0)) || (bytes <= 0 && flops <= 0))
        return 0;
    const double bw_ms = bytes > 0 ? bytes / (p->read_gbs * 1e6) : 0;
    const double flops_ms = flops > 0 ? flops / (p->fma_gflops * 1e6) : 0;
    *ms = bw_ms >= flops_ms ? bw_ms : flops_ms;
    *by = bw_ms >= flops_ms ? "bw" : "flops";
    return 1;
}

static void fmt_ms(char *buf, size_t size, double ms)
{
    if (ms < 10)
        snprintf(buf, size, "%.3f", ms);
    else if (ms < 100)
        snprintf(buf, size, "%.2f", ms);
    else
        snprintf(buf, size, "%.1f", ms);
}

static void fmt_fraction(char *buf, size_t size, double value, double peak)
{
    if (peak > 0 && value > 0)
        snprintf(buf, size, "%.0f%%", 100.0 * value / peak);
    else
        snprintf(buf, size, "-");
}

static void add_number_or_null(cJSON *o, const char *name, double value, int valid)
{
    if (valid)
        cJSON_AddNumberToObject(o, name, value);
    else
        cJSON_AddNullToObject(o, name);
}

/* name: value where valid, else null. */
/* A JSON number field: its name and value. */
typedef struct named_number {
    const char *name;
    double value;
} named_number;

/* Adds the n fields of v to o in order. */
static void add_numbers(cJSON *o, const named_number *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cJSON_AddNumberToObject(o, v[i].name, v[i].value);
}

static void add_string_or_null(cJSON *o, const char *name, const char *value, int valid)
{
    if (valid)
        cJSON_AddStringToObject(o, name, value);
    else
        cJSON_AddNullToObject(o, name);
}

static int write_json(bench_report *r)
{
    if (!r->json_path)
        return 0;
    char *text = cJSON_Print(r->rows);
    if (!text)
        return 1;
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", r->json_path);
    FILE *f = fopen(tmp, "w");
    int rc = !f || fputs(text, f) < 0 || fputc('\n', f) == EOF;
    if (f && fclose(f) != 0)
        rc = 1;
    if (!rc && rename(tmp, r->json_path) != 0)
        rc = 1;
    cJSON_free(text);
    if (rc && !r->json_failed) {
        fprintf(stderr, "clmla-bench: cannot write %s\n", r->json_path);
        r->json_failed = 1;
    }
    return rc;
}

int bench_report_row(bench_report *r, const bench_row *row)
{
    const double seconds = row->t.median_ms * 1e-3;
    const double gbs = row->bytes > 0 ? row->bytes / seconds * 1e-9 : 0;
    const double gflops = row->flops > 0 ? row->flops / seconds * 1e-9 : 0;
    const double tokens_per_s = row->tokens > 0 ? row->tokens / seconds : 0;
    const int is_peak = strcmp(row->phase, "peak") == 0;
    const bench_peaks *p = &r->peaks;
    double bound_ms = 0;
    const char *bound_by = NULL;
    const int has_bound = row_bound(p, row->bytes, row->flops, &bound_ms, &bound_by) && row->t.median_ms > 0;

    print_header(r);
    char first[32], median[32], lo[32], hi[32], range[80], tps[32], gb[32], gf[32], fbw[16], ffl[16], cache[32], mha[32];
    char bound[32], of_bound[16];
    fmt_ms(first, sizeof(first), row->t.first_ms);
    fmt_ms(median, sizeof(median), row->t.median_ms);
    fmt_ms(lo, sizeof(lo), row->t.min_ms);
    fmt_ms(hi, sizeof(hi), row->t.max_ms);
    snprintf(range, sizeof(range), "(%s - %s)", lo, hi);
    snprintf(tps, sizeof(tps), tokens_per_s > 0 ? "%.0f" : "-", tokens_per_s);
    snprintf(gb, sizeof(gb), gbs > 0 ? "%.1f" : "-", gbs);
    snprintf(gf, sizeof(gf), gflops > 0 ? "%.1f" : "-", gflops);
    fmt_fraction(fbw, sizeof(fbw), gbs, p->read_gbs);
    fmt_fraction(ffl, sizeof(ffl), gflops, p->fma_gflops);
    if (has_bound) {
        /* bounds on a GPU are often microseconds: three significant digits down to 1 us */
        if (bound_ms < 0.01)
            snprintf(bound, sizeof(bound), "%.5f", bound_ms);
        else if (bound_ms < 0.1)
            snprintf(bound, sizeof(bound), "%.4f", bound_ms);
        else
            fmt_ms(bound, sizeof(bound), bound_ms);
        fmt_fraction(of_bound, sizeof(of_bound), bound_ms, row->t.median_ms);
    } else {
        snprintf(bound, sizeof(bound), "-");
        snprintf(of_bound, sizeof(of_bound), "-");
    }
    snprintf(cache, sizeof(cache), row->cache_bytes > 0 ? "%.1f" : "-", mib(row->cache_bytes));
    snprintf(mha, sizeof(mha), row->mha_cache_bytes > 0 ? "%.1f" : "-", mib(row->mha_cache_bytes));
    char note[256];
    snprintf(note, sizeof(note), "%s%s", row->note, row->t.stable ? "" : (row->note[0] ? "; not stable" : "not stable"));
    if (row->q_len > 1) {
        const size_t len = strlen(note);
        snprintf(note + len, sizeof(note) - len, "%sq-len %d", len ? "; " : "", row->q_len);
    }
    if (row->prefix > 0) {
        const size_t len = strlen(note);
        snprintf(note + len, sizeof(note) - len, "%sprefix %d", len ? "; " : "", row->prefix);
    }
    if (row->topk > 0) {
        const size_t len = strlen(note);
        snprintf(note + len, sizeof(note) - len, "%stopk %d", len ? "; " : "", row->topk);
    }
    if (row->check_error >= 0) {
        const size_t len = strlen(note);
        snprintf(note + len, sizeof(note) - len, "%scheck %.1e", len ? "; " : "", row->check_error);
    }
    char batch[16], ctx[16];
    snprintf(batch, sizeof(batch), is_peak ? "-" : "%d", row->batch);
    snprintf(ctx, sizeof(ctx), is_peak ? "-" : "%d", row->ctx);
    printf("%-8s %-14s %-6s %-6s %5s %6s %9s %9s %-21s %9s %-5s %6s %10s %9s %9s %5s %5s %10s %10s  %s\n", row->phase,
           row->path, row->weights_dtype[0] ? row->weights_dtype : "-", row->cache_dtype[0] ? row->cache_dtype : "-",
           batch, ctx, first, median, range, bound, has_bound ? bound_by : "-", of_bound, tps, gb, gf, fbw, ffl, cache,
           mha, note);
    fflush(stdout);

    const clmla_device_info *i = &r->dev->info;
    const bench_shape *s = r->shape;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return 1;
    cJSON_AddStringToObject(o, "device", i->name);
    cJSON_AddStringToObject(o, "vendor", i->vendor);
    cJSON_AddStringToObject(o, "driver", i->driver_version);
    cJSON_AddStringToObject(o, "platform", i->platform_name);
    cJSON_AddNumberToObject(o, "compute_units", i->compute_units);
    cJSON_AddStringToObject(o, "clmla_version", clmla_version_string());
    cJSON_AddStringToObject(o, "preset", s->preset);
    cJSON_AddStringToObject(o, "phase", row->phase);
    cJSON_AddStringToObject(o, "path", row->path);
    cJSON_AddNumberToObject(o, "batch", row->batch);
    cJSON_AddNumberToObject(o, "ctx", row->ctx);
    add_number_or_null(o, "q_len", row->q_len, row->q_len > 0);
    add_number_or_null(o, "topk", row->topk, row->topk > 0);
    add_number_or_null(o, "prefix", row->prefix, strcmp(row->phase, "prefill") == 0);
    /* null where the row has no weights (peak, decode's absorbed and mha) or no cache (peak, products) */
    add_string_or_null(o, "weights_dtype", row->weights_dtype, row->weights_dtype[0] != 0);
    add_string_or_null(o, "cache_dtype", row->cache_dtype, row->cache_dtype[0] != 0);
    const named_number shape[] = {{"hidden_size", s->D}, {"num_heads", s->H}, {"q_lora_rank", s->rq},
                                  {"kv_lora_rank", s->rkv}, {"qk_nope_head_dim", s->dn}, {"qk_rope_head_dim", s->dr},
                                  {"v_head_dim", s->dv}};
    add_numbers(o, shape, sizeof(shape) / sizeof(shape[0]));
    cJSON_AddStringToObject(o, "timer", row->t.timer ? row->t.timer : "wall");
    cJSON_AddBoolToObject(o, "cold_cache", r->dev->flush_buffer != NULL);
    if (r->dev->flush_buffer)
        cJSON_AddStringToObject(o, "flush", r->dev->flush_kernel ? "read" : "write");
    cJSON_AddNumberToObject(o, "samples", row->t.samples);
    cJSON_AddNumberToObject(o, "calls_per_sample", row->t.calls_per_sample);
    cJSON_AddBoolToObject(o, "stable", row->t.stable);
    const named_number times[] = {{"first_ms", row->t.first_ms}, {"median_ms", row->t.median_ms},
                                  {"min_ms", row->t.min_ms}, {"max_ms", row->t.max_ms},
                                  {"wall_median_ms", row->t.wall_median_ms}};
    add_numbers(o, times, sizeof(times) / sizeof(times[0]));
    add_number_or_null(o, "tokens_per_s", tokens_per_s, tokens_per_s > 0);
    cJSON_AddNumberToObject(o, "bytes", row->bytes);
    add_number_or_null(o, "weight_bytes", row->weight_bytes, row->weights_dtype[0] != 0);
    cJSON_AddNumberToObject(o, "flops", row->flops);
    add_number_or_null(o, "gbs", gbs, gbs > 0);
    add_number_or_null(o, "gflops", gflops, gflops > 0);
    add_number_or_null(o, "arithmetic_intensity", row->flops / row->bytes, row->bytes > 0 && row->flops > 0);
    add_number_or_null(o, "peak_gbs", p->read_gbs, p->read_gbs > 0);
    add_number_or_null(o, "peak_gflops", p->fma_gflops, p->fma_gflops > 0);
    add_number_or_null(o, "peak_sgemm_gflops", p->sgemm_gflops, p->sgemm_gflops > 0);
    add_number_or_null(o, "frac_peak_bw", gbs / p->read_gbs, gbs > 0 && p->read_gbs > 0);
    add_number_or_null(o, "frac_peak_flops", gflops / p->fma_gflops, gflops > 0 && p->fma_gflops > 0);
    /* the roofline: the time the peaks allow for the row's bytes and FLOPs, and the fraction of it
       reached (1 = at the roof) */
    add_string_or_null(o, "peaks_source", p->source, p->source[0] != 0);
    add_number_or_null(o, "bound_ms", bound_ms, has_bound);
    add_string_or_null(o, "bound_by", bound_by, has_bound);
    add_number_or_null(o, "of_bound", has_bound ? bound_ms / row->t.median_ms : 0, has_bound);
    add_number_or_null(o, "cache_mib", mib(row->cache_bytes), row->cache_bytes > 0);
    add_number_or_null(o, "mha_cache_mib", mib(row->mha_cache_bytes), row->mha_cache_bytes > 0);
    add_number_or_null(o, "check_rel_error", row->check_error, row->check_error >= 0);
    if (strcmp(row->phase, "cold") == 0) {
        /* the parts of a cold start (medians over the samples) and the programs of the last one */
        const named_number cold[] = {{"context_ms", row->cold_context_ms}, {"layer_create_ms", row->cold_layer_ms},
                                     {"warmup_ms", row->cold_warmup_ms}, {"first_step_ms", row->cold_first_step_ms},
                                     {"programs_built", row->cold_built}, {"programs_loaded", row->cold_loaded}};
        add_numbers(o, cold, sizeof(cold) / sizeof(cold[0]));
    }
    cJSON_AddStringToObject(o, "note", row->note);
    cJSON_AddItemToArray(r->rows, o);
    return write_json(r);
}

void bench_report_skip(bench_report *r, const bench_row *row)
{
    print_header(r);
    char batch[16], ctx[16];
    snprintf(batch, sizeof(batch), "%d", row->batch);
    snprintf(ctx, sizeof(ctx), "%d", row->ctx);
    printf("%-8s %-14s %-6s %-6s %5s %6s  skipped: %s\n", row->phase, row->path,
           row->weights_dtype[0] ? row->weights_dtype : "-", row->cache_dtype[0] ? row->cache_dtype : "-", batch, ctx,
           row->note);
    fflush(stdout);
}

int bench_report_close(bench_report *r)
{
    if (!r)
        return 0;
    const int rc = write_json(r) || r->json_failed;
    cJSON_Delete(r->rows);
    free(r);
    return rc;
}
