/* clmla kernels: the programs and build options the library would build on a device that is
   described by a profile (tools/vendor/profiles/ *.json) rather than present. The library runs as
   it would on that device: tools/vendor/profile_icd.c, an OpenCL driver that reports the profile
   and compiles nothing, stands in for the device's own, and each preset's layer is created and
   warmed up (clmla_layer_warmup: every kernel a step can select, both paths, every product row
   class) with weights of zeros; the library's own log of its builds gives the lines printed. */
#define _DEFAULT_SOURCE /* mkdtemp, realpath */
#include "args.h"
#include "clmla.h"
#include "commands.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What clmla kernels --help says of the command. */
static const char summary[] =
    "The programs and build options clmla would build on the device a profile describes: one line\n"
    "per build, PRESET<TAB>CACHE_DTYPE<TAB>FILE.cl<TAB>OPTIONS, for every kernel the presets' layers\n"
    "select (clmla_layer_warmup: both paths, every step size). Nothing is compiled: an OpenCL driver\n"
    "that reports the profile stands in for the device's (tools/vendor/profile_icd.c).";

#ifndef CLMLA_PROFILE_ICD_PATH
#define CLMLA_PROFILE_ICD_PATH ""
#endif

/* The builds the library logged for one context, as "FILE.cl\tOPTIONS" lines. */
typedef struct build_log {
    char **lines;
    size_t count;
    int failed; /* out of host memory */
} build_log;

/* Takes "kernel NAME.cl [OPTIONS]: built from source in T ms" (program.c's info message). */
static void on_log(void *user, clmla_log_level level, const char *message)
{
    build_log *b = user;
    if (level == CLMLA_LOG_WARNING) {
        fprintf(stderr, "clmla kernels: warning: %s\n", message);
        return;
    }
    static const char head[] = "kernel ";
    const char *open = strstr(message, ".cl [");
    const char *close = open ? strstr(open, "]: built from source") : NULL;
    if (strncmp(message, head, sizeof(head) - 1) != 0 || !open || !close)
        return;
    const char *name = message + sizeof(head) - 1;
    const int name_len = (int)(open - name);
    const char *opts = open + 5;
    const int opts_len = close > opts ? (int)(close - opts) : 0;
    const size_t size = (size_t)name_len + (size_t)opts_len + 8;
    char *line = malloc(size);
    char **grown = realloc(b->lines, (b->count + 1) * sizeof(*b->lines));
    if (!line || !grown) {
        free(line);
        if (grown)
            b->lines = grown;
        b->failed = 1;
        return;
    }
    b->lines = grown;
    snprintf(line, size, "%.*s.cl\t%.*s", name_len, name, opts_len, opts);
    b->lines[b->count++] = line;
}

/* A layer of the preset's shape whose weights are all zero (norms one): the kernels a layer
   selects depend on its shapes and dtypes, not on its values. */
static clmla_status zero_layer(clmla_context *ctx, clmla_preset preset, clmla_weights_dtype wd, float *zeros,
                               float *ones, clmla_layer **layer)
{
    clmla_layer_config cfg;
    clmla_layer_config_preset(preset, &cfg);
    cfg.weights_dtype = wd;
    const int D = cfg.hidden_size, H = cfg.num_heads, rq = cfg.q_lora_rank, rkv = cfg.kv_lora_rank,
              dn = cfg.qk_nope_head_dim, dr = cfg.qk_rope_head_dim, dv = cfg.v_head_dim, dq = dn + dr;
    clmla_layer_weights w;
    memset(&w, 0, sizeof(w));
    if (rq > 0) {
        w.q_a_proj = clmla_tensor_2d(zeros, rq, D);
        w.q_a_layernorm = clmla_tensor_1d(ones, rq);
        w.q_b_proj = clmla_tensor_2d(zeros, (int64_t)H * dq, rq);
    } else {
        w.q_proj = clmla_tensor_2d(zeros, (int64_t)H * dq, D);
    }
    w.kv_a_proj_with_mqa = clmla_tensor_2d(zeros, rkv + dr, D);
    w.kv_a_layernorm = clmla_tensor_1d(ones, rkv);
    w.kv_b_proj = clmla_tensor_2d(zeros, (int64_t)H * (dn + dv), rkv);
    w.o_proj = clmla_tensor_2d(zeros, D, (int64_t)H * dv);
    return clmla_layer_create(ctx, &cfg, &w, layer);
}

/* The most floats any weight of the preset holds, and the longest norm. */
static void preset_sizes(clmla_preset preset, size_t *most, size_t *norm)
{
    clmla_layer_config c;
    clmla_layer_config_preset(preset, &c);
    const size_t D = (size_t)c.hidden_size, H = (size_t)c.num_heads, rq = (size_t)(c.q_lora_rank > 0 ? c.q_lora_rank : 0),
                 rkv = (size_t)c.kv_lora_rank, dq = (size_t)(c.qk_nope_head_dim + c.qk_rope_head_dim),
                 dv = (size_t)c.v_head_dim, dn = (size_t)c.qk_nope_head_dim, dr = (size_t)c.qk_rope_head_dim;
    const size_t sizes[] = {rq * D, H * dq * (rq ? rq : D), (rkv + dr) * D, H * (dn + dv) * rkv, D * H * dv};
    *most = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        *most = sizes[i] > *most ? sizes[i] : *most;
    *norm = rq > rkv ? rq : rkv;
}

/* One preset and cache dtype on a fresh context: the builds, printed; 0 or 1. */
static int plan_one(clmla_preset preset, int dtype, clmla_weights_dtype wd)
{
    build_log b = {NULL, 0, 0};
    clmla_context_options o;
    memset(&o, 0, sizeof(o));
    o.device = "0"; /* the profile driver's one device */
    o.cache_dir = "off";
    o.program_binaries = "off";
    o.log = on_log;
    o.log_user = &b;
    o.log_level = CLMLA_LOG_INFO;
    clmla_context *ctx = NULL;
    clmla_layer *layer = NULL;
    clmla_cache *cache = NULL;
    size_t most = 0, norm = 0;
    preset_sizes(preset, &most, &norm);
    float *zeros = calloc(most, sizeof(float)); /* pages of zeros that are never written */
    float *ones = malloc(norm * sizeof(float));
    int rc = 1;
    if (!zeros || !ones) {
        fprintf(stderr, "clmla kernels: out of host memory\n");
        goto done;
    }
    for (size_t i = 0; i < norm; i++)
        ones[i] = 1.0f;
    if (clmla_context_create_opts(&o, &ctx) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla kernels: %s\n", clmla_last_error(NULL));
        goto done;
    }
    if (zero_layer(ctx, preset, wd, zeros, ones, &layer) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla kernels: %s %s: %s\n", clmla_preset_name(preset), cli_cache_dtype_name(dtype),
                clmla_last_error(ctx));
        goto done;
    }
    clmla_layer_config cfg;
    clmla_layer_config_preset(preset, &cfg);
    const int block_tokens = 64;
    const clmla_cache_config cc = {1, cfg.kv_lora_rank, cfg.qk_rope_head_dim, block_tokens,
                                   (CLMLA_WARMUP_TOKENS + block_tokens - 1) / block_tokens + 2,
                                   (clmla_cache_dtype)dtype, 0, CLMLA_CACHE_F32};
    if (clmla_cache_create(ctx, &cc, &cache) != CLMLA_SUCCESS || clmla_layer_warmup(layer, cache, 0) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla kernels: %s %s: %s\n", clmla_preset_name(preset), cli_cache_dtype_name(dtype),
                clmla_last_error(ctx));
        goto done;
    }
    if (b.failed) {
        fprintf(stderr, "clmla kernels: out of host memory\n");
        goto done;
    }
    for (size_t i = 0; i < b.count; i++)
        printf("%s\t%s\t%s\n", clmla_preset_name(preset), cli_cache_dtype_name(dtype), b.lines[i]);
    rc = 0;
done:
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    clmla_context_destroy(ctx);
    for (size_t i = 0; i < b.count; i++)
        free(b.lines[i]);
    free(b.lines);
    free(zeros);
    free(ones);
    return rc;
}

/* Splits a comma-separated list in place; returns how many items (at most max). */
static int split_list(char *text, char **items, int max)
{
    int n = 0;
    for (char *tok = strtok(text, ","); tok && n < max; tok = strtok(NULL, ","))
        items[n++] = tok;
    return n;
}

int cmd_kernels(int argc, char **argv)
{
    int exit_code = 0;
    const char *profile = NULL, *presets_arg = "v2-lite,v2,v3,kimi-k2", *dtypes_arg = "f32,f16,bf16,fp8",
               *weights = "f32", *record = NULL, *driver = NULL, *device = NULL;
    cli_option opts[] = {
        {"profile", CLI_STRING, &profile, "FILE  the device profile (tools/vendor/profiles/*.json); required"},
        {"preset", CLI_STRING, &presets_arg, "LIST  presets, comma-separated (default v2-lite,v2,v3,kimi-k2)"},
        {"cache-dtype", CLI_STRING, &dtypes_arg, "LIST  cache dtypes, comma-separated (default f32,f16,bf16,fp8)"},
        {"weights-dtype", CLI_STRING, &weights, "D     f32 (default), f16, bf16 or fp8: the layer's weights"},
        {"record", CLI_STRING, &record,
         "DIR   also write the driver's record there: each program's source (src/HASH.cl)\n"
         "                         and record.tsv (builds, kernels created, work-group shapes launched)"},
        {"driver", CLI_STRING, &driver,
         "PATH  the profile driver, libclmla_profile_icd.so (default: CLMLA_PROFILE_ICD,\n"
         "                         else the one this build made)"},
        {"device", CLI_STRING, &device, "SPEC  ignored: the device is the profile's"},
        {NULL, CLI_FLAG, NULL, NULL},
    };
    if (cli_start("kernels", summary, opts, argc, argv, &exit_code))
        return exit_code;
    (void)device;
    if (!profile) {
        fprintf(stderr, "clmla kernels: --profile FILE is required (see --help)\n");
        return 2;
    }
    clmla_weights_dtype wd = CLMLA_WEIGHTS_F32;
    const int w = cli_weights_dtype(weights);
    if (w < 0 || w == CLMLA_WEIGHTS_AS_GIVEN) {
        fprintf(stderr, "clmla kernels: --weights-dtype must be one of f32, f16, bf16, fp8, not '%s'\n", weights);
        return 2;
    }
    wd = (clmla_weights_dtype)w;
    char presets_text[256], dtypes_text[64];
    char *preset_names[16], *dtype_names[8];
    snprintf(presets_text, sizeof(presets_text), "%s", presets_arg);
    snprintf(dtypes_text, sizeof(dtypes_text), "%s", dtypes_arg);
    const int npresets = split_list(presets_text, preset_names, 16), ndtypes = split_list(dtypes_text, dtype_names, 8);
    clmla_preset presets[16];
    int dtypes[8];
    for (int i = 0; i < npresets; i++)
        if (clmla_preset_from_name(preset_names[i], &presets[i]) != CLMLA_SUCCESS ||
            (presets[i] != CLMLA_PRESET_DEEPSEEK_V2_LITE && presets[i] != CLMLA_PRESET_DEEPSEEK_V2 &&
             presets[i] != CLMLA_PRESET_DEEPSEEK_V3 && presets[i] != CLMLA_PRESET_KIMI_K2)) {
            fprintf(stderr, "clmla kernels: --preset takes v2-lite, v2, v3 and kimi-k2, not '%s'\n", preset_names[i]);
            return 2;
        }
    for (int i = 0; i < ndtypes; i++)
        if ((dtypes[i] = cli_cache_dtype(dtype_names[i])) < 0) {
            fprintf(stderr, "clmla kernels: --cache-dtype takes " CLI_CACHE_DTYPES ", not '%s'\n", dtype_names[i]);
            return 2;
        }
    if (npresets == 0 || ndtypes == 0) {
        fprintf(stderr, "clmla kernels: --preset and --cache-dtype need at least one name each\n");
        return 2;
    }

    if (!driver)
        driver = getenv("CLMLA_PROFILE_ICD");
    if (!driver || !*driver)
        driver = CLMLA_PROFILE_ICD_PATH;
    if (!*driver || access(driver, R_OK) != 0) {
        fprintf(stderr,
                "clmla kernels: the profile driver '%s' is not there; build the target clmla_profile_icd and pass "
                "--driver PATH or set CLMLA_PROFILE_ICD\n",
                driver);
        return 2;
    }
    /* The profile is checked by the driver's own reader, so that it is refused here, by name,
       rather than seen as a machine without OpenCL. */
    void *lib = dlopen(driver, RTLD_NOW | RTLD_LOCAL);
    int (*check)(const char *, char *, size_t) = NULL;
    if (lib)
        *(void **)&check = dlsym(lib, "clmla_profile_check");
    if (!check) {
        fprintf(stderr, "clmla kernels: '%s' is not the profile driver: %s\n", driver, dlerror());
        return 2;
    }
    char why[1024];
    if (check(profile, why, sizeof(why)) != 0) {
        fprintf(stderr, "clmla kernels: profile %s refused: %s\n", profile, why);
        return 2;
    }
    /* The driver alone, in place of the machine's: a folder holding one .icd file that names it,
       set before the first OpenCL call (the loader reads it once, then the folder goes). */
    char folder[] = "/tmp/clmla-profile-XXXXXX", icd[sizeof(folder) + 16], full[4096];
    if (!realpath(driver, full) || !mkdtemp(folder)) {
        fprintf(stderr, "clmla kernels: cannot make a folder for the driver's .icd file in /tmp\n");
        return 1;
    }
    snprintf(icd, sizeof(icd), "%s/profile.icd", folder);
    FILE *f = fopen(icd, "w");
    if (!f || fprintf(f, "%s\n", full) < 0 || fclose(f) != 0) {
        fprintf(stderr, "clmla kernels: cannot write %s\n", icd);
        remove(icd);
        rmdir(folder);
        return 1;
    }
    setenv("OCL_ICD_VENDORS", folder, 1);
    unsetenv("OCL_ICD_FILENAMES");
    setenv("CLMLA_PROFILE", profile, 1);
    if (record)
        setenv("CLMLA_PROFILE_RECORD", record, 1);
    else
        unsetenv("CLMLA_PROFILE_RECORD");

    clmla_device_info *devs = NULL;
    size_t n = 0;
    const clmla_status listed = clmla_devices_list(&devs, &n);
    remove(icd);
    rmdir(folder);
    if (listed != CLMLA_SUCCESS || n != 1) {
        fprintf(stderr, "clmla kernels: the profile driver gave no device (%s)\n",
                n ? "more than one device" : clmla_last_error(NULL));
        clmla_free(devs);
        return 1;
    }
    fprintf(stderr, "clmla kernels: %s / %s (%s), %u compute units, %llu bytes of local memory\n", devs[0].vendor,
            devs[0].name, devs[0].platform_name, devs[0].compute_units, (unsigned long long)devs[0].local_mem_bytes);
    clmla_free(devs);
    for (int p = 0; p < npresets; p++)
        for (int d = 0; d < ndtypes; d++)
            if (plan_one(presets[p], dtypes[d], wd) != 0)
                return 1;
    fflush(stdout);
    return 0;
}
