/* clmla-bench: MLA decode, layer and prefill speed on any OpenCL device, against the device's own
   measured peaks and against standard multi-head attention. See docs/BENCHMARKS.md. */
#include "bench.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_LIST 16

typedef struct int_list {
    int n;
    int v[MAX_LIST];
} int_list;

typedef struct name_list {
    int n;
    const char *v[MAX_LIST];
} name_list;

typedef struct options {
    const char *device, *preset, *json, *peaks;
    const char *phase, *ctx, *batch, *path, *dtype, *wdtype, *flush, *q_len, *prefix;
    int quick, peak, no_peak, check, warm_cache, block_tokens, seed, topk, flush_mib, help, version;
    double max_mem_mib, max_time;
    int dims[7]; /* hidden, heads, q-lora-rank, kv-lora-rank, nope-dim, rope-dim, v-dim; -1 = preset's */
} options;

static const char *const dim_names[7] = {"hidden", "heads", "q-lora-rank", "kv-lora-rank", "nope-dim", "rope-dim", "v-dim"};

/* An option's name (without "--") and the field of options it sets. */
typedef struct option_name {
    const char *name;
    size_t offset;
} option_name;
#define OPTION(name, field) {name, offsetof(options, field)}

/* The options without a value (int fields set to 1), with a text value, an integer and a number. */
static const option_name flag_options[] = {OPTION("quick", quick), OPTION("peak", peak), OPTION("no-peak", no_peak),
                                           OPTION("check", check), OPTION("warm-cache", warm_cache),
                                           OPTION("help", help), OPTION("version", version)};
static const option_name text_options[] = {
    OPTION("device", device), OPTION("preset", preset), OPTION("json", json), OPTION("peaks", peaks),
    OPTION("phase", phase), OPTION("ctx", ctx), OPTION("batch", batch), OPTION("path", path),
    OPTION("cache-dtype", dtype), OPTION("weights-dtype", wdtype), OPTION("flush", flush), OPTION("q-len", q_len),
    OPTION("prefix", prefix)};
static const option_name number_options[] = {OPTION("block-tokens", block_tokens), OPTION("seed", seed),
                                             OPTION("topk", topk), OPTION("flush-mib", flush_mib)};
static const option_name real_options[] = {OPTION("max-mem", max_mem_mib), OPTION("max-time", max_time)};

/* The field of o that option key names among the n of table, or NULL. */
static void *option_field(options *o, const char *key, const option_name *table, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(key, table[i].name) == 0)
            return (char *)o + table[i].offset;
    return NULL;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: clmla-bench [options]\n\n"
            "Multi-head Latent Attention speed on an OpenCL device: achieved GB/s and GFLOP/s, as fractions of\n"
            "the device's own measured peaks, next to standard multi-head attention of the same model shape.\n\n"
            "  --device SPEC        device (P:D, index, gpu|cpu|accelerator, or part of a name; see clmla devices)\n"
            "  --preset NAME        v2-lite (default), v2, v3, kimi-k2, glm-4.7-flash, minicpm3-4b, mistral-small-4,\n"
            "                       moonlight, or custom (v2-lite's dims, changed by:)\n"
            "  --hidden N --heads N --q-lora-rank N --kv-lora-rank N --nope-dim N --rope-dim N --v-dim N\n"
            "  --phase LIST         decode (default), layer, prefill, products, cold, peak; comma-separated\n"
            "                         decode:  latent attention of one new token over the cache (FlashMLA's measure)\n"
            "                         layer:   a whole decode step of one layer (projections, RoPE, cache write,\n"
            "                                  attention, output projection)\n"
            "                         prefill: a prompt of ctx tokens through one layer\n"
            "                         products: the layer's projections alone, y = x W^T with batch rows\n"
            "                                  (--batch, default 1,2,4,8; paths q_proj or q_a_proj,q_b_proj,\n"
            "                                  kv_a_proj, qkv_a_proj (the two stacked, as the layer runs them),\n"
            "                                  kv_b_proj, o_proj), against the read peak\n"
            "                         cold:    a fresh context, layer and clmla_layer_warmup, then the first\n"
            "                                  step (batch sequences of ctx tokens; default 1 and 1): the\n"
            "                                  cost before a first step, apart from the timed rows; paths\n"
            "                                  build (no disk cache: every kernel compiled) and cache (from\n"
            "                                  a disk cache filled first); 3 samples, 1 with --quick\n"
            "                         peak:    same as --peak\n"
            "  --ctx LIST           context lengths (decode 1024,4096,32768; layer 4096; prefill 512,4096)\n"
            "  --batch LIST         sequences per step (decode 1,8,32; layer and prefill 1)\n"
            "  --path LIST          absorbed, decompressed, mha (standard multi-head attention over a full\n"
            "                       per-head K/V cache; decode only), sparse (decode: clmla_attention_latent_sparse\n"
            "                       over --topk random distinct positions of the same cache, every position when\n"
            "                       topk >= ctx), indexer (decode: DSA's selection alone, clmla_index_select: the\n"
            "                       scores of every index key and their top --topk; H_I x d_I 64 x 128, DeepSeek-V3.2's),\n"
            "                       paged (decode: clmla_paged_attention, the cache's rows as a caller's device buffer,\n"
            "                       q as FlashMLA's [T, H, rkv + dr]), paged-host (the same in host memory, used in\n"
            "                       place where the device shares it), paged-copy (host memory 8 bytes off the\n"
            "                       device's alignment: copied to the device for each call); the host forms are\n"
            "                       timed by the wall clock (they return when done)\n"
            "                       auto (the library's choice; layer, prefill)\n"
            "                       build, cache (cold)\n"
            "                       (defaults: decode absorbed,mha; layer absorbed; prefill auto; cold build,cache)\n"
            "  --cache-dtype LIST   f32 (default), f16, bf16, fp8 (bf16 and fp8: the absorbed path, through the library)\n"
            "  --weights-dtype LIST auto (default: f32, as the random weights are made), f32, f16, bf16, fp8: the\n"
            "                       dtype the layer (layer, prefill) or clmla_linear (products) keeps the weights in\n"
            "  --peak               first measure the device's peaks: read bandwidth, fp32 FMA, CLBlast SGEMM,\n"
            "                       clmla's SGEMM (best of 3 each, printed as peak rows); every row then carries\n"
            "                       the fraction of them it reached and its bound (below)\n"
            "  --peaks FILE         take the peaks from the peak rows of an earlier --json FILE of this device\n"
            "  --no-peak            measure no peaks: %%bw, %%flop, bound ms and %%bound print -. Without --peak,\n"
            "                       --peaks or --no-peak, the two peaks the bound needs (read bandwidth, fp32\n"
            "                       FMA) are measured briefly first (--quick's sizes, one trial; a few seconds\n"
            "                       on a 2-core CPU), so that every row carries bound ms = max(bytes / read peak,\n"
            "                       FLOPs / FMA peak), what bounds it (bw or flops), and %%bound = bound / median\n"
            "  --q-len LIST         decode, absorbed: new tokens per sequence (default 1), each seeing the keys up\n"
            "                       to itself (speculative or multi-token decode); one row per length\n"
            "  --prefix LIST        prefill: tokens each sequence already holds (default 0): the ctx prompt tokens\n"
            "                       are a chunk after them (chunked prefill), seeing the prefix and themselves\n"
            "  --json FILE          also write every row as a JSON array of objects\n"
            "  --quick              small sweep, short timing (peak, decode, layer, prefill; under a minute on\n"
            "                       a 2-core CPU once kernels are compiled and cached)\n"
            "  --check              compare each decode output with a float64 host computation (small shapes;\n"
            "                       a relative error past 1e-4 fails the run)\n"
            "  --warm-cache         do not flush the device's caches before each timed call (default: flush,\n"
            "                       so that a cache that fits in the last-level cache is not read from it)\n"
            "  --flush read|write   how: read 4x the last-level cache on every compute unit, or write as much\n"
            "                       from the queue (triton's do_bench; leaves that many dirty lines) (default write)\n"
            "  --flush-mib N        the flush's size in MiB (default, or 0: 4x the last-level cache, at least 64)\n"
            "  --block-tokens N     tokens per cache block (default 64)\n"
            "  --topk N             decode, sparse and indexer: positions each query token attends to / selects\n"
            "                       (default 2048, DSA's)\n"
            "  --max-mem MIB        skip rows that need more device memory (default: the device's global memory)\n"
            "  --max-time S         stop sampling a row after S seconds (default 3, 0.6 with --quick)\n"
            "  --seed N             seed of the random inputs (default 1)\n"
            "  --version, --help\n");
}

static int parse_int(const char *text, int *out)
{
    char *end = NULL;
    errno = 0;
    const long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < 0 || v > 1 << 30)
        return 1;
    *out = (int)v;
    return 0;
}

/* A comma list of integers of at least `least` (1, or 0 where 0 means none, as --prefix). */
static int parse_ints_from(const char *text, int_list *list, const char *what, int least)
{
    list->n = 0;
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", text);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int v = 0;
        if (list->n == MAX_LIST || parse_int(tok, &v) || v < least) {
            fprintf(stderr, "clmla-bench: --%s expects up to %d %s integers separated by commas, got '%s'\n", what,
                    MAX_LIST, least > 0 ? "positive" : "non-negative", text);
            return 1;
        }
        list->v[list->n++] = v;
    }
    if (list->n == 0) {
        fprintf(stderr, "clmla-bench: --%s is empty\n", what);
        return 1;
    }
    return 0;
}

static int parse_ints(const char *text, int_list *list, const char *what)
{
    return parse_ints_from(text, list, what, 1);
}

/* Splits a comma list into names, each of which must be one of `allowed` (NULL-terminated);
   the names point into static storage of `allowed`. */
static int parse_names(const char *text, name_list *list, const char *const *allowed, const char *what)
{
    list->n = 0;
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", text);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const char *const *a = allowed;
        while (*a && strcmp(*a, tok) != 0)
            a++;
        if (!*a || list->n == MAX_LIST) {
            fprintf(stderr, "clmla-bench: --%s: '%s' is not one of", what, tok);
            for (a = allowed; *a; a++)
                fprintf(stderr, " %s", *a);
            fprintf(stderr, "\n");
            return 1;
        }
        list->v[list->n++] = *a;
    }
    if (list->n == 0) {
        fprintf(stderr, "clmla-bench: --%s is empty\n", what);
        return 1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof(*o));
    o->block_tokens = 64;
    o->topk = 2048;
    o->seed = 1;
    for (int d = 0; d < 7; d++)
        o->dims[d] = -1;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(stderr, "clmla-bench: unexpected argument '%s' (see --help)\n", arg);
            return 1;
        }
        const char *name = arg + 2;
        char key[64];
        const char *eq = strchr(name, '=');
        const size_t len = eq ? (size_t)(eq - name) : strlen(name);
        snprintf(key, sizeof(key), "%.*s", (int)(len < sizeof(key) - 1 ? len : sizeof(key) - 1), name);
        int *flag = option_field(o, key, flag_options, sizeof(flag_options) / sizeof(flag_options[0]));
        if (flag) {
            if (eq) {
                fprintf(stderr, "clmla-bench: --%s takes no value\n", key);
                return 1;
            }
            *flag = 1;
            continue;
        }
        const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!value) {
            fprintf(stderr, "clmla-bench: --%s needs a value\n", key);
            return 1;
        }
        const char **text = option_field(o, key, text_options, sizeof(text_options) / sizeof(text_options[0]));
        if (text) {
            *text = value;
            continue;
        }
        int *number = option_field(o, key, number_options, sizeof(number_options) / sizeof(number_options[0]));
        for (int d = 0; !number && d < 7; d++)
            if (strcmp(key, dim_names[d]) == 0)
                number = &o->dims[d];
        if (number) {
            if (parse_int(value, number)) {
                fprintf(stderr, "clmla-bench: --%s expects a non-negative integer, got '%s'\n", key, value);
                return 1;
            }
            continue;
        }
        double *real = option_field(o, key, real_options, sizeof(real_options) / sizeof(real_options[0]));
        if (real) {
            char *end = NULL;
            *real = strtod(value, &end);
            if (end == value || *end || *real <= 0) {
                fprintf(stderr, "clmla-bench: --%s expects a positive number, got '%s'\n", key, value);
                return 1;
            }
            continue;
        }
        fprintf(stderr, "clmla-bench: unknown option '%s' (see --help)\n", arg);
        return 1;
    }
    if (o->block_tokens < 1) {
        fprintf(stderr, "clmla-bench: --block-tokens must be at least 1\n");
        return 1;
    }
    if (o->topk < 1 || o->topk > CLMLA_SPARSE_MAX_TOPK) {
        fprintf(stderr, "clmla-bench: --topk must be in 1..%d, got %d\n", CLMLA_SPARSE_MAX_TOPK, o->topk);
        return 1;
    }
    if (!o->flush)
        o->flush = "write";
    if (strcmp(o->flush, "read") != 0 && strcmp(o->flush, "write") != 0) {
        fprintf(stderr, "clmla-bench: --flush is read or write, got '%s'\n", o->flush);
        return 1;
    }
    return 0;
}

static int make_shape(const options *o, bench_shape *shape)
{
    const char *name = o->preset ? o->preset : "v2-lite";
    const int custom = strcmp(name, "custom") == 0;
    clmla_preset preset = CLMLA_PRESET_DEEPSEEK_V2_LITE;
    if (!custom && clmla_preset_from_name(name, &preset) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla-bench: unknown preset '%s' (v2-lite, v2, v3, kimi-k2, glm-4.7-flash, minicpm3-4b, "
                        "mistral-small-4, moonlight, custom)\n", name);
        return 1;
    }
    clmla_layer_config config;
    clmla_layer_config_preset(preset, &config);
    int *fields[7] = {&config.hidden_size, &config.num_heads, &config.q_lora_rank, &config.kv_lora_rank,
                      &config.qk_nope_head_dim, &config.qk_rope_head_dim, &config.v_head_dim};
    int changed = 0;
    for (int d = 0; d < 7; d++)
        if (o->dims[d] >= 0 && o->dims[d] != *fields[d]) {
            *fields[d] = o->dims[d];
            changed = 1;
        }
    if (clmla_layer_config_validate(&config) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla-bench: %s\n", clmla_last_error(NULL));
        return 1;
    }
    bench_shape_from_config(shape, custom || changed ? "custom" : clmla_preset_name(preset), &config);
    return 0;
}

static const char *const phase_names[] = {"peak", "decode", "layer", "prefill", "products", "cold", NULL};
static const char *const path_names[] = {"absorbed",  "decompressed", "mha",        "auto",      "q_proj",
                                          "q_a_proj",  "q_b_proj",     "kv_a_proj",  "qkv_a_proj", "kv_b_proj",
                                          "o_proj",    "build",        "cache",      "sparse",    "indexer",    "paged",
                                          "paged-host", "paged-copy", NULL};
static const char *const dtype_names[] = {"f32", "f16", "bf16", "fp8", NULL}; /* clmla_cache_dtype's order */
static const char *const weights_names[] = {"auto", "f32", "f16", "bf16", "fp8", NULL};

/* A name of dtype_names as the cache dtype. */
static clmla_cache_dtype cache_dtype_of(const char *name)
{
    return strcmp(name, "f16") == 0    ? CLMLA_CACHE_F16
           : strcmp(name, "bf16") == 0 ? CLMLA_CACHE_BF16
           : strcmp(name, "fp8") == 0  ? CLMLA_CACHE_FP8
                                       : CLMLA_CACHE_F32;
}

/* A name of weights_names as the dtype the weights are held in: the bench's random weights are
   float32, so "auto" (as given) is f32. */
static clmla_dtype weights_dtype_of(const char *name)
{
    return strcmp(name, "f16") == 0    ? CLMLA_DTYPE_F16
           : strcmp(name, "bf16") == 0 ? CLMLA_DTYPE_BF16
           : strcmp(name, "fp8") == 0  ? CLMLA_DTYPE_FP8_E4M3
                                       : CLMLA_DTYPE_F32;
}

/* The sweep of one phase: explicit lists win, else the phase's defaults. The products phase has
   no context (one pass, ctx 0) and no cache; its paths are the shape's projections. */
static int phase_lists(const options *o, const bench_shape *shape, const char *phase, int_list *ctx, int_list *batch,
                       name_list *paths)
{
    if (strcmp(phase, "products") == 0) {
        ctx->n = 1;
        ctx->v[0] = 0;
        const char *names = shape->rq > 0 ? "q_a_proj,q_b_proj,kv_a_proj,qkv_a_proj,kv_b_proj,o_proj"
                                          : "q_proj,kv_a_proj,qkv_a_proj,kv_b_proj,o_proj";
        return parse_ints(o->batch ? o->batch : (o->quick ? "1,8" : "1,2,4,8"), batch, "batch") ||
               parse_names(o->path ? o->path : names, paths, path_names, "path");
    }
    if (strcmp(phase, "cold") == 0)
        return parse_ints(o->ctx ? o->ctx : "1", ctx, "ctx") || parse_ints(o->batch ? o->batch : "1", batch, "batch") ||
               parse_names(o->path ? o->path : "build,cache", paths, path_names, "path");
    const int decode = strcmp(phase, "decode") == 0, layer = strcmp(phase, "layer") == 0;
    const char *ctx_text = o->ctx ? o->ctx
                           : decode ? (o->quick ? "1024,4096" : "1024,4096,32768")
                           : layer  ? (o->quick ? "1024" : "4096")
                                    : (o->quick ? "256" : "512,4096");
    const char *batch_text = o->batch ? o->batch : decode ? (o->quick ? "1,4" : "1,8,32") : "1";
    const char *path_text = o->path ? o->path : decode ? "absorbed,mha" : layer ? "absorbed" : "auto";
    return parse_ints(ctx_text, ctx, "ctx") || parse_ints(batch_text, batch, "batch") ||
           parse_names(path_text, paths, path_names, "path");
}

/* The peaks of an earlier run on the same device: its rows with phase "peak". */
static int read_peaks(const char *path, const char *device, bench_peaks *peaks)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "clmla-bench: cannot read %s\n", path);
        return 1;
    }
    char *text = NULL;
    size_t size = 0, cap = 0;
    for (;;) {
        if (size + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *grown = realloc(text, cap);
            if (!grown) {
                free(text);
                fclose(f);
                return 1;
            }
            text = grown;
        }
        const size_t got = fread(text + size, 1, 4096, f);
        size += got;
        if (got < 4096)
            break;
    }
    fclose(f);
    text[size] = 0;
    cJSON *rows = cJSON_Parse(text);
    free(text);
    memset(peaks, 0, sizeof(*peaks));
    int rc = 0;
    const cJSON *row = NULL;
    cJSON_ArrayForEach(row, rows)
    {
        const char *phase = cJSON_GetStringValue(cJSON_GetObjectItem(row, "phase"));
        const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(row, "path"));
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(row, "device"));
        if (!phase || !kind || !name || strcmp(phase, "peak") != 0)
            continue;
        if (strcmp(name, device) != 0) {
            fprintf(stderr, "clmla-bench: the peaks in %s were measured on '%s', not on '%s'\n", path, name, device);
            rc = 1;
            break;
        }
        const double gbs = cJSON_GetNumberValue(cJSON_GetObjectItem(row, "gbs"));
        const double gflops = cJSON_GetNumberValue(cJSON_GetObjectItem(row, "gflops"));
        if (strcmp(kind, "read-bandwidth") == 0 && gbs > 0)
            peaks->read_gbs = gbs;
        else if (strcmp(kind, "fp32-fma") == 0 && gflops > 0)
            peaks->fma_gflops = gflops;
        else if ((strcmp(kind, "sgemm") == 0 || strcmp(kind, "sgemm-clmla") == 0) && gflops > peaks->sgemm_gflops) {
            peaks->sgemm_gflops = gflops;
            snprintf(peaks->sgemm_path, sizeof(peaks->sgemm_path), "%s", kind[5] ? "clmla" : "CLBlast");
        }
    }
    if (!rows || (!rc && !peaks->read_gbs && !peaks->fma_gflops)) {
        fprintf(stderr, "clmla-bench: %s holds no peak rows (run clmla-bench --peak --json FILE first)\n", path);
        rc = 1;
    }
    cJSON_Delete(rows);
    return rc;
}

static int progress_tty;
static const char *device_spec; /* --device, for the contexts of the cold phase */

/* dtypes: "weights f32, cache f16" or the part that applies, or "". */
static void progress(int index, int total, const char *phase, const char *path, const char *dtypes, int batch, int ctx)
{
    if (progress_tty)
        fprintf(stderr, "\r\033[K[%d/%d] %s %s %s batch %d ctx %d ...", index, total, phase, path, dtypes, batch, ctx);
    else
        fprintf(stderr, "clmla-bench: [%d/%d] %s %s %s batch %d ctx %d\n", index, total, phase, path, dtypes, batch,
                ctx);
    fflush(stderr);
}

static void progress_clear(void)
{
    if (progress_tty) {
        fprintf(stderr, "\r\033[K");
        fflush(stderr);
    }
}

/* Runs one case and reports its row (with_weights, with_cache: whether the row names the weights
   and the cache dtype; decode names its weights dtype itself, only its decompressed path has
   weights). Returns 1 when it failed. */
static int run_row(bench_report *report, const bench_case *bc, int with_weights, int with_cache, int index, int total)
{
    bench_row row;
    memset(&row, 0, sizeof(row));
    snprintf(row.phase, sizeof(row.phase), "%s", bc->phase);
    snprintf(row.path, sizeof(row.path), "%s", bc->path);
    snprintf(row.weights_dtype, sizeof(row.weights_dtype), "%s", with_weights ? clmla_dtype_name(bc->weights) : "");
    snprintf(row.cache_dtype, sizeof(row.cache_dtype), "%s", with_cache ? dtype_names[bc->dtype] : "");
    row.batch = bc->batch;
    row.ctx = bc->ctx;
    row.check_error = -1;
    char what[48];
    snprintf(what, sizeof(what), "%s%s%s%s%s", with_weights ? "weights " : "", row.weights_dtype,
             with_weights && with_cache ? ", " : "", with_cache ? "cache " : "", row.cache_dtype);
    progress(index, total, bc->phase, bc->path, what, bc->batch, bc->ctx);
    const int rc = strcmp(bc->phase, "decode") == 0     ? bench_decode(bc, &row)
                   : strcmp(bc->phase, "products") == 0 ? bench_products(bc, &row)
                   : strcmp(bc->phase, "cold") == 0     ? bench_cold(bc, device_spec, &row)
                                                        : bench_layer(bc, &row);
    progress_clear();
    if (rc < 0) {
        bench_report_skip(report, &row);
        return 0;
    }
    if (rc > 0) {
        snprintf(row.note, sizeof(row.note), "failed (see the message above)");
        bench_report_skip(report, &row);
        return 1;
    }
    return bench_report_row(report, &row) != 0;
}

int main(int argc, char **argv)
{
    options o;
    if (parse_args(argc, argv, &o))
        return 2;
    if (o.help) {
        usage(stdout);
        return 0;
    }
    if (o.version) {
        printf("clmla-bench %s\n", clmla_version_string());
        return 0;
    }
    bench_shape shape;
    name_list phases, dtypes, wdtypes;
    int_list q_lens, prefixes;
    if (make_shape(&o, &shape) || parse_ints(o.q_len ? o.q_len : "1", &q_lens, "q-len") ||
        parse_ints_from(o.prefix ? o.prefix : "0", &prefixes, "prefix", 0) ||
        parse_names(o.phase ? o.phase : (o.quick ? "peak,decode,layer,prefill" : "decode"), &phases, phase_names, "phase") ||
        parse_names(o.dtype ? o.dtype : "f32", &dtypes, dtype_names, "cache-dtype") ||
        parse_names(o.wdtype ? o.wdtype : "auto", &wdtypes, weights_names, "weights-dtype"))
        return 2;
    int want_peak = o.peak;
    for (int p = 0; p < phases.n; p++)
        want_peak |= strcmp(phases.v[p], "peak") == 0;
    if (o.no_peak && (want_peak || o.peaks)) {
        fprintf(stderr, "clmla-bench: --no-peak contradicts %s\n", o.peaks ? "--peaks" : "--peak and --phase peak");
        return 2;
    }

    /* Validate every list before opening the device, and count the rows for the progress line. */
    int total = want_peak ? BENCH_PEAK_ROWS : 0;
    for (int p = 0; p < phases.n; p++) {
        if (strcmp(phases.v[p], "peak") == 0)
            continue;
        int_list ctx, batch;
        name_list paths;
        if (phase_lists(&o, &shape, phases.v[p], &ctx, &batch, &paths))
            return 2;
        const int nw = strcmp(phases.v[p], "decode") == 0 ? 1 : wdtypes.n;
        const int nc = strcmp(phases.v[p], "products") == 0 ? 1 : dtypes.n;
        const int nl = strcmp(phases.v[p], "decode") == 0 ? q_lens.n : strcmp(phases.v[p], "prefill") == 0 ? prefixes.n : 1;
        total += nw * nc * paths.n * batch.n * ctx.n * nl;
    }

    bench_device dev;
    memset(&dev, 0, sizeof(dev));
    /* A benchmark process of its own: CLBlast tuned as the clmla commands tune it ("auto"), unless
       CLMLA_CLBLAST_TUNING says otherwise. */
    clmla_context_options copts;
    memset(&copts, 0, sizeof(copts));
    copts.device = o.device;
    copts.clblast_tuning = getenv("CLMLA_CLBLAST_TUNING") ? NULL : "auto";
    if (clmla_context_create_opts(&copts, &dev.ctx) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla-bench: %s\n", clmla_last_error(NULL));
        return 1;
    }
    clmla_context_device(dev.ctx, &dev.info);
    dev.cl_ctx = clmla_context_cl_context(dev.ctx);
    dev.queue = clmla_context_queue(dev.ctx);
    dev.device = dev.info.device_id;
    cl_command_queue_properties props = 0;
    clGetCommandQueueInfo(dev.queue, CL_QUEUE_PROPERTIES, sizeof(props), &props, NULL);
    clGetCommandQueueInfo(dev.queue, CL_QUEUE_DEVICE, sizeof(dev.device), &dev.device, NULL);
    dev.profiling = (props & CL_QUEUE_PROFILING_ENABLE) != 0;
    dev.memory_budget = o.max_mem_mib > 0 ? (size_t)(o.max_mem_mib * 1048576.0) : (size_t)dev.info.global_mem_bytes;
    progress_tty = isatty(fileno(stderr));
    device_spec = o.device;
    if (!o.warm_cache) {
        cl_ulong llc = 0;
        clGetDeviceInfo(dev.device, CL_DEVICE_GLOBAL_MEM_CACHE_SIZE, sizeof(llc), &llc, NULL);
        dev.flush_bytes = (size_t)llc * 4 > ((size_t)64 << 20) ? (size_t)llc * 4 : ((size_t)64 << 20);
        if (o.flush_mib > 0)
            dev.flush_bytes = (size_t)o.flush_mib << 20;
        if (dev.flush_bytes > dev.info.max_alloc_bytes)
            dev.flush_bytes = (size_t)dev.info.max_alloc_bytes;
        dev.flush_buffer = bench_buffer(&dev, dev.flush_bytes, "cache flush buffer");
        if (!dev.flush_buffer || bench_flush_setup(&dev, strcmp(o.flush, "read") == 0)) {
            bench_flush_release(&dev);
            clmla_context_destroy(dev.ctx);
            return 1;
        }
    }

    bench_timing_options timing;
    bench_timing_defaults(&timing, o.quick);
    if (o.max_time > 0) {
        timing.max_seconds = o.max_time;
        if (timing.min_seconds > o.max_time)
            timing.min_seconds = o.max_time;
    }

    bench_report *report = bench_report_open(&dev, &shape, o.json);
    if (!report) {
        clmla_context_destroy(dev.ctx);
        return 1;
    }
    int failures = 0, index = 0;
    if (o.peaks && !want_peak) {
        bench_peaks peaks;
        if (read_peaks(o.peaks, dev.info.name, &peaks)) {
            bench_report_close(report);
            bench_flush_release(&dev);
            clmla_context_destroy(dev.ctx);
            return 1;
        }
        snprintf(peaks.source, sizeof(peaks.source), "file");
        bench_report_peaks(report, &peaks);
        printf("peak     read %.1f GB/s | fp32 FMA %.1f GFLOP/s | SGEMM %.1f GFLOP/s (%s) (from %s)\n", peaks.read_gbs,
               peaks.fma_gflops, peaks.sgemm_gflops, peaks.sgemm_path[0] ? peaks.sgemm_path : "-", o.peaks);
    }
    if (!o.peaks && !want_peak && o.no_peak)
        printf("peak     none (--no-peak): %%bw, %%flop, bound ms and %%bound print -\n");
    if (!o.peaks && !want_peak && !o.no_peak) {
        /* A row's bound needs the read and FMA peaks: measured briefly, at --quick's sizes and
           timing with one trial, unless --no-peak. Not a row of its own; a failure leaves the
           bounds out ("-") and is not the run's failure. */
        bench_timing_options brief;
        bench_timing_defaults(&brief, 1);
        brief.max_seconds = 0.3; /* per kernel variant: 2 read orders, 4 FMA widths */
        if (brief.max_seconds > timing.max_seconds)
            brief.max_seconds = timing.max_seconds;
        if (brief.min_seconds > brief.max_seconds)
            brief.min_seconds = brief.max_seconds;
        bench_peaks peaks;
        progress(0, total, "peak", "read-bandwidth, fp32-fma (brief, for the bounds)", "", 0, 0);
        const double start = bench_now();
        const int prc = bench_peak_roof(&dev, &brief, &peaks);
        progress_clear();
        if (peaks.read_gbs > 0 || peaks.fma_gflops > 0) {
            snprintf(peaks.source, sizeof(peaks.source), "brief");
            bench_report_peaks(report, &peaks);
            printf("peak     read %.1f GB/s | fp32 FMA %.1f GFLOP/s, measured briefly for the bounds (128 MiB read, "
                   "one trial, %.1f s; --peak measures them fully)%s\n",
                   peaks.read_gbs, peaks.fma_gflops, bench_now() - start,
                   prc ? "; one failed (see above): bounds that need it print -" : "");
        } else {
            printf("peak     the brief measurement failed (see above): %%bw, %%flop, bound ms and %%bound print -\n");
        }
    }
    if (want_peak) {
        bench_row rows[BENCH_PEAK_ROWS];
        bench_peaks peaks;
        progress(++index, total, "peak", "read-bandwidth, fp32-fma, sgemm, sgemm-clmla, call-floor", "", 0, 0);
        failures += bench_peak(&dev, &timing, o.quick, rows, &peaks) != 0;
        index += BENCH_PEAK_ROWS - 1;
        progress_clear();
        snprintf(peaks.source, sizeof(peaks.source), "peak");
        bench_report_peaks(report, &peaks);
        printf("peak     read %.1f GB/s | fp32 FMA %.1f GFLOP/s | SGEMM %.1f GFLOP/s, the better of CLBlast and clmla's "
               "own product (%s; %s) | a call's floor %.4f ms\n",
               peaks.read_gbs, peaks.fma_gflops, peaks.sgemm_gflops, peaks.sgemm_path[0] ? peaks.sgemm_path : "-",
               rows[2].note, rows[4].t.samples > 0 ? rows[4].t.median_ms : 0.0);
        for (int i = 0; i < BENCH_PEAK_ROWS; i++)
            if (rows[i].t.samples > 0)
                bench_report_row(report, &rows[i]);
    }
    for (int p = 0; p < phases.n; p++) {
        const char *phase = phases.v[p];
        if (strcmp(phase, "peak") == 0)
            continue;
        int_list ctx, batch;
        name_list paths;
        phase_lists(&o, &shape, phase, &ctx, &batch, &paths);
        const int products = strcmp(phase, "products") == 0, decode = strcmp(phase, "decode") == 0,
                  prefill = strcmp(phase, "prefill") == 0;
        /* decode rows go through --q-len, prefill rows through --prefix */
        const int_list *inner = decode ? &q_lens : prefill ? &prefixes : NULL;
        /* decode has no weights of the library's, products no cache */
        for (int w = 0; w < (decode ? 1 : wdtypes.n); w++)
            for (int d = 0; d < (products ? 1 : dtypes.n); d++)
                for (int q = 0; q < paths.n; q++)
                    for (int b = 0; b < batch.n; b++)
                        for (int c = 0; c < ctx.n; c++)
                            for (int l = 0; l < (inner ? inner->n : 1); l++) {
                                bench_case bc = {&dev, &shape, &timing, phase, paths.v[q], batch.v[b], ctx.v[c],
                                                 cache_dtype_of(dtypes.v[d]), o.block_tokens, o.check,
                                                 (unsigned)o.seed * 1000003u, weights_dtype_of(wdtypes.v[w]),
                                                 decode ? q_lens.v[l] : 0, o.topk, prefill ? prefixes.v[l] : 0};
                                failures += run_row(report, &bc, !decode, !products, ++index, total);
                            }
    }
    failures += bench_report_close(report) != 0;
    bench_flush_release(&dev);
    bench_kernels_release();
    clmla_context_destroy(dev.ctx);
    return failures ? 1 : 0;
}
