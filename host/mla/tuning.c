/* CLBlast Xgemm tuning: the entries context creation applies (a JSON file, else the built-in
   table), saving entries, and the search behind `clmla tune`. At the end, the parameters of
   clmla's own kernels, latent attention and products (one user file, built-in tables, defaults).
   See include/clmla.h. */
#include "tuning.h"
#include "clcall.h"
#include "fileio.h"
#include "gemm.h"

#include <clblast_c.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const names[CLMLA_XGEMM_PARAMETERS] = {"GEMMK", "KREG",  "KWG", "KWI", "MDIMA", "MDIMC",
                                                          "MWG",   "NDIMB", "NDIMC", "NWG", "SA",    "SB",
                                                          "STRM",  "STRN",  "VWM", "VWN"};
enum { GEMMK, KREG, KWG, KWI, MDIMA, MDIMC, MWG, NDIMB, NDIMC, NWG, SA, SB, STRM, STRN, VWM, VWN };

/* Entries measured with `clmla tune` on the developers' machines (docs/BENCHMARKS.md, "CLBlast
   tuning"): vendor and device name as the OpenCL driver reports them. */
static const clmla_xgemm_tuning builtin[] = {
    /* PoCL 3.1 (Debian 12), 2-core AMD EPYC (Zen 3): `clmla tune --candidates 16`, 2 minutes */
    {"AuthenticAMD", "pthread-haswell-AMD EPYC", {0, 1, 32, 2, 4, 4, 64, 16, 16, 64, 1, 1, 1, 1, 8, 4}, 1024, 83.4, 21.9},
};

const char *clmla_xgemm_parameter_name(int i)
{
    return i >= 0 && i < CLMLA_XGEMM_PARAMETERS ? names[i] : NULL;
}

/* The message for the first tiling parameter outside 1..1024, or NULL. */
static const char *out_of_range(const size_t *v)
{
    static const struct {
        int index;
        const char *message;
    } tiling[] = {{KWG, "KWG must be from 1 to 1024"},     {KWI, "KWI must be from 1 to 1024"},
                  {MDIMA, "MDIMA must be from 1 to 1024"}, {MDIMC, "MDIMC must be from 1 to 1024"},
                  {MWG, "MWG must be from 1 to 1024"},     {NDIMB, "NDIMB must be from 1 to 1024"},
                  {NDIMC, "NDIMC must be from 1 to 1024"}, {NWG, "NWG must be from 1 to 1024"}};
    for (size_t i = 0; i < sizeof(tiling) / sizeof(tiling[0]); i++)
        if (v[tiling[i].index] < 1 || v[tiling[i].index] > 1024)
            return tiling[i].message;
    return NULL;
}

/* The constraints of CLBlast 1.5's Xgemm kernel (GEMMK = 0) on a device with the given limits. */
static const char *check_values(const size_t *v, size_t max_work_group, uint64_t local_bytes)
{
    if (v[GEMMK] != 0)
        return "GEMMK must be 0 (the 2D-register variant GEMMK = 1 is not supported here)";
    if (v[KREG] != 1)
        return "KREG must be 1 when GEMMK is 0";
    if (v[SA] > 1 || v[SB] > 1 || v[STRM] > 1 || v[STRN] > 1)
        return "SA, SB, STRM and STRN must be 0 or 1";
    if (!(v[VWM] == 1 || v[VWM] == 2 || v[VWM] == 4 || v[VWM] == 8))
        return "VWM (a vector width) must be 1, 2, 4 or 8";
    if (!(v[VWN] == 1 || v[VWN] == 2 || v[VWN] == 4 || v[VWN] == 8))
        return "VWN (a vector width) must be 1, 2, 4 or 8";
    const char *range = out_of_range(v);
    if (range)
        return range;
    if (v[KWG] % v[KWI] != 0)
        return "KWG must be a multiple of KWI";
    if (v[MWG] % (v[MDIMC] * v[VWM]) != 0 || v[MWG] % (v[MDIMA] * v[VWM]) != 0)
        return "MWG must be a multiple of MDIMC * VWM and of MDIMA * VWM";
    if (v[NWG] % (v[NDIMC] * v[VWN]) != 0 || v[NWG] % (v[NDIMB] * v[VWN]) != 0)
        return "NWG must be a multiple of NDIMC * VWN and of NDIMB * VWN";
    const size_t threads = v[MDIMC] * v[NDIMC];
    if (threads % v[MDIMA] != 0 || threads % v[NDIMB] != 0)
        return "MDIMC * NDIMC must be a multiple of MDIMA and of NDIMB";
    if (v[KWG] % (threads / v[MDIMA]) != 0 || v[KWG] % (threads / v[NDIMB]) != 0)
        return "KWG must be a multiple of MDIMC * NDIMC / MDIMA and of MDIMC * NDIMC / NDIMB";
    if (max_work_group && threads > max_work_group)
        return "MDIMC * NDIMC exceeds the device's work-group size";
    const uint64_t local = (uint64_t)(v[SA] * v[KWG] * v[MWG] + v[SB] * v[KWG] * v[NWG]) * sizeof(float);
    if (local_bytes && local > local_bytes)
        return "(SA * KWG * MWG + SB * KWG * NWG) floats exceed the device's local memory";
    return NULL;
}

clmla_status clmla_xgemm_values_check(const clmla_context *ctx, const size_t values[CLMLA_XGEMM_PARAMETERS],
                                      const char **why)
{
    const char *w = !ctx || !values ? "NULL argument"
                                    : check_values(values, ctx->info.max_work_group_size, ctx->info.local_mem_bytes);
    if (why)
        *why = w;
    return w ? clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "Xgemm parameters refused: %s", w) : CLMLA_SUCCESS;
}

/* ---- files ----------------------------------------------------------------------------------- */

clmla_status clmla_xgemm_tuning_path(char *buf, size_t size)
{
    if (!buf || size == 0)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_xgemm_tuning_path: no buffer");
    clmla_env env;
    clmla_env_read(&env);
    int n = 0;
    if (env.clblast_tuning[0] && strcmp(env.clblast_tuning, "off") != 0 && strcmp(env.clblast_tuning, "auto") != 0)
        n = snprintf(buf, size, "%s", env.clblast_tuning);
    else if (env.cache_dir[0])
        n = snprintf(buf, size, "%s/clblast-tuning.json", env.cache_dir);
    else
        buf[0] = '\0';
    if (n < 0 || (size_t)n >= size) {
        buf[0] = '\0';
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "the tuning path needs %d bytes, the buffer has %zu", n + 1,
                          size);
    }
    return CLMLA_SUCCESS;
}

/* Tuning files are small; a larger one is not one. */
#define MAX_TUNING_FILE_BYTES ((size_t)16 << 20)

/* 1 when nothing is at path (a tuning file that does not exist holds no entry). */
static int absent(const char *path)
{
    struct stat sb;
    return stat(path, &sb) != 0 && errno == ENOENT;
}

/* One entry of a file: everything but vendor/device checked here; *why says what is wrong. */
static int parse_entry(const cJSON *o, clmla_xgemm_tuning *t, char *why, size_t why_size)
{
    memset(t, 0, sizeof(*t));
    const cJSON *kernel = cJSON_GetObjectItemCaseSensitive(o, "kernel");
    const cJSON *precision = cJSON_GetObjectItemCaseSensitive(o, "precision");
    const cJSON *vendor = cJSON_GetObjectItemCaseSensitive(o, "vendor");
    const cJSON *device = cJSON_GetObjectItemCaseSensitive(o, "device");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (!cJSON_IsObject(o)) {
        snprintf(why, why_size, "an entry is not a JSON object");
        return 0;
    }
    if (kernel && !(cJSON_IsString(kernel) && strcmp(kernel->valuestring, "Xgemm") == 0)) {
        snprintf(why, why_size, "\"kernel\" must be \"Xgemm\"");
        return 0;
    }
    if (precision && !(cJSON_IsNumber(precision) && precision->valuedouble == 32)) {
        snprintf(why, why_size, "\"precision\" must be 32");
        return 0;
    }
    if (!cJSON_IsString(vendor) || !cJSON_IsString(device) || strlen(vendor->valuestring) >= sizeof(t->vendor) ||
        strlen(device->valuestring) >= sizeof(t->device)) {
        snprintf(why, why_size, "\"vendor\" and \"device\" must be strings (of under 128 bytes)");
        return 0;
    }
    snprintf(t->vendor, sizeof(t->vendor), "%s", vendor->valuestring);
    snprintf(t->device, sizeof(t->device), "%s", device->valuestring);
    if (!cJSON_IsObject(params)) {
        snprintf(why, why_size, "entry for '%s': \"parameters\" must be an object of the 16 Xgemm values", t->device);
        return 0;
    }
    for (int i = 0; i < CLMLA_XGEMM_PARAMETERS; i++) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(params, names[i]);
        if (!p) {
            snprintf(why, why_size, "entry for '%s': parameter %s is missing", t->device, names[i]);
            return 0;
        }
        if (!cJSON_IsNumber(p) || p->valuedouble < 0 || p->valuedouble > 65536 || p->valuedouble != floor(p->valuedouble)) {
            snprintf(why, why_size, "entry for '%s': parameter %s must be a whole number from 0 to 65536", t->device,
                     names[i]);
            return 0;
        }
        t->values[i] = (size_t)p->valuedouble;
    }
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(o, "size");
    const cJSON *gflops = cJSON_GetObjectItemCaseSensitive(o, "gflops");
    const cJSON *dflops = cJSON_GetObjectItemCaseSensitive(o, "default_gflops");
    t->size = cJSON_IsNumber(size) && size->valuedouble > 0 && size->valuedouble < 1e6 ? (int)size->valuedouble : 0;
    t->gflops = cJSON_IsNumber(gflops) ? gflops->valuedouble : 0;
    t->default_gflops = cJSON_IsNumber(dflops) ? dflops->valuedouble : 0;
    return 1;
}

static cJSON *entry_json(const clmla_xgemm_tuning *t)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *p = cJSON_CreateObject();
    if (!o || !p) {
        cJSON_Delete(o);
        cJSON_Delete(p);
        return NULL;
    }
    cJSON_AddStringToObject(o, "kernel", "Xgemm");
    cJSON_AddNumberToObject(o, "precision", 32);
    cJSON_AddStringToObject(o, "vendor", t->vendor);
    cJSON_AddStringToObject(o, "device", t->device);
    for (int i = 0; i < CLMLA_XGEMM_PARAMETERS; i++)
        cJSON_AddNumberToObject(p, names[i], (double)t->values[i]);
    cJSON_AddItemToObject(o, "parameters", p);
    if (t->size > 0)
        cJSON_AddNumberToObject(o, "size", t->size);
    if (t->gflops > 0)
        cJSON_AddNumberToObject(o, "gflops", round(t->gflops * 10) / 10);
    if (t->default_gflops > 0)
        cJSON_AddNumberToObject(o, "default_gflops", round(t->default_gflops * 10) / 10);
    return o;
}

/* Writes `list` (then deleted) as the JSON file at path: a sibling file first, renamed over the
   old one, so that a failure leaves the old file as it was. */
static clmla_status save_json(const char *path, cJSON *list)
{
    char *text = cJSON_Print(list);
    cJSON_Delete(list);
    if (!text)
        return clmla_fail(NULL, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    char tmp[CLMLA_PATH_SIZE + 16];
    snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        const int e = errno;
        free(text);
        return clmla_fail(NULL, CLMLA_ERROR_IO, "cannot write %s: %s", path, strerror(e));
    }
    const size_t len = strlen(text);
    const int ok = fwrite(text, 1, len, f) == len && fputc('\n', f) != EOF;
    const int closed = fclose(f) == 0;
    free(text);
    if (!ok || !closed || rename(tmp, path) != 0) {
        const int e = errno;
        remove(tmp);
        return clmla_fail(NULL, CLMLA_ERROR_IO, "cannot write %s: %s", path, strerror(e));
    }
    return CLMLA_SUCCESS;
}

clmla_status clmla_xgemm_tuning_save(const char *path, const clmla_xgemm_tuning *tuning)
{
    if (!path || !*path || !tuning)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_xgemm_tuning_save: NULL or empty argument");
    cJSON *list = NULL;
    char *old = NULL, err[CLMLA_PATH_SIZE + 256];
    size_t length = 0;
    if (!absent(path)) {
        const clmla_status st =
            clmla_read_file(path, MAX_TUNING_FILE_BYTES, "a tuning file", &old, &length, err, sizeof(err));
        if (st != CLMLA_SUCCESS)
            return clmla_fail(NULL, st, "%s", err);
        list = cJSON_Parse(old);
        free(old);
        char why[512] = "";
        int valid = cJSON_IsArray(list);
        const cJSON *e = NULL;
        clmla_xgemm_tuning scratch;
        if (valid) {
            cJSON_ArrayForEach(e, list)
            {
                if (!parse_entry(e, &scratch, why, sizeof(why))) {
                    valid = 0;
                    break;
                }
            }
        }
        if (!valid) {
            cJSON_Delete(list);
            return clmla_fail(NULL, CLMLA_ERROR_INVALID_FILE, "%s is not a JSON array of tuning entries%s%s; it was left as it is",
                              path, why[0] ? ": " : "", why);
        }
    } else {
        list = cJSON_CreateArray();
    }
    cJSON *entry = entry_json(tuning);
    if (!list || !entry) {
        cJSON_Delete(list);
        cJSON_Delete(entry);
        return clmla_fail(NULL, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    /* Replace the entry for the same vendor and device, else append. */
    int index = 0, replaced = 0;
    const cJSON *item = NULL;
    cJSON_ArrayForEach(item, list)
    {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(item, "vendor");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(item, "device");
        if (cJSON_IsString(v) && cJSON_IsString(d) && strcmp(v->valuestring, tuning->vendor) == 0 &&
            strcmp(d->valuestring, tuning->device) == 0) {
            cJSON_ReplaceItemInArray(list, index, entry);
            replaced = 1;
            break;
        }
        index++;
    }
    if (!replaced)
        cJSON_AddItemToArray(list, entry);
    return save_json(path, list);
}

/* ---- applied at context creation ----------------------------------------------------------- */

static int same_device(const clmla_xgemm_tuning *t, const clmla_context *ctx)
{
    return strcmp(t->vendor, ctx->info.vendor) == 0 && strcmp(t->device, ctx->info.name) == 0;
}

static CLBlastStatusCode override(clmla_context *ctx, const size_t *values)
{
    const char *list[CLMLA_XGEMM_PARAMETERS]; /* CLBlast's prototype takes them as non-const */
    memcpy(list, names, sizeof(list));
    return CLBlastOverrideParameters(ctx->device, "Xgemm", CLBlastPrecisionSingle, CLMLA_XGEMM_PARAMETERS, list, values);
}

int clmla_tuning_parse(const char *text, const clmla_device_info *device, clmla_xgemm_tuning *found, char *why,
                       size_t why_size)
{
    cJSON *list = cJSON_Parse(text);
    if (!cJSON_IsArray(list)) {
        cJSON_Delete(list);
        snprintf(why, why_size, "not a JSON array of entries");
        return -1;
    }
    int result = 0;
    const cJSON *item = NULL;
    cJSON_ArrayForEach(item, list)
    {
        clmla_xgemm_tuning t;
        if (!parse_entry(item, &t, why, why_size)) {
            result = -1;
            break;
        }
        if (strcmp(t.vendor, device->vendor) != 0 || strcmp(t.device, device->name) != 0)
            continue;
        const char *bad = check_values(t.values, device->max_work_group_size, device->local_mem_bytes);
        if (bad) {
            snprintf(why, why_size, "entry for '%s': %s", t.device, bad);
            result = -1;
            break;
        }
        *found = t;
        result = 1;
        break;
    }
    cJSON_Delete(list);
    return result;
}

/* The matching entry of a file: 1 found, 0 none (or no file), -1 error (recorded for the thread). */
static int from_file(clmla_context *ctx, const char *path, clmla_xgemm_tuning *found, clmla_status *status)
{
    if (absent(path))
        return 0;
    char *text = NULL, err[CLMLA_PATH_SIZE + 256];
    size_t length = 0;
    const clmla_status st =
        clmla_read_file(path, MAX_TUNING_FILE_BYTES, "a tuning file", &text, &length, err, sizeof(err));
    if (st != CLMLA_SUCCESS) {
        *status = clmla_fail(NULL, st, "the CLBlast tuning file %s", err);
        return -1;
    }
    char why[512];
    const int result = clmla_tuning_parse(text, &ctx->info, found, why, sizeof(why));
    free(text);
    if (result < 0)
        *status = clmla_fail(NULL, CLMLA_ERROR_INVALID_FILE,
                             "the CLBlast tuning file %s: %s (fix or remove it, or set CLMLA_CLBLAST_TUNING=off)", path,
                             why);
    return result;
}

clmla_status clmla_tuning_apply(clmla_context *ctx)
{
    snprintf(ctx->tuning_source, sizeof(ctx->tuning_source), "none");
    ctx->tuning_applied = 0;
    /* Opt-in: CLBlast's parameters belong to the process, so nothing is applied unless asked for
       ("auto" or a file). */
    if (!ctx->env.clblast_tuning[0] || strcmp(ctx->env.clblast_tuning, "off") == 0)
        return CLMLA_SUCCESS;
    char path[CLMLA_PATH_SIZE + 32];
    if (strcmp(ctx->env.clblast_tuning, "auto") != 0)
        snprintf(path, sizeof(path), "%s", ctx->env.clblast_tuning);
    else if (ctx->env.cache_dir[0])
        snprintf(path, sizeof(path), "%s/clblast-tuning.json", ctx->env.cache_dir);
    else
        path[0] = '\0';

    clmla_xgemm_tuning t;
    clmla_status status = CLMLA_SUCCESS;
    const int in_file = path[0] ? from_file(ctx, path, &t, &status) : 0;
    if (in_file < 0)
        return status;
    if (in_file) {
        const CLBlastStatusCode st = override(ctx, t.values);
        if (st != CLBlastSuccess)
            return clmla_fail(NULL, CLMLA_ERROR_INVALID_FILE,
                              "the CLBlast tuning file %s: CLBlast refused the entry for '%s': %s (a CLBlast other "
                              "than 1.5?)",
                              path, t.device, clmla_status_string(st));
        ctx->tuning = t;
        ctx->tuning_applied = 1;
        snprintf(ctx->tuning_source, sizeof(ctx->tuning_source), "file %s", path);
        clmla_log(ctx, CLMLA_LOG_INFO, "CLBlast's SGEMM parameters for this device set from %s", path);
        return CLMLA_SUCCESS;
    }
    for (size_t i = 0; i < sizeof(builtin) / sizeof(builtin[0]); i++) {
        if (!same_device(&builtin[i], ctx) ||
            check_values(builtin[i].values, ctx->info.max_work_group_size, ctx->info.local_mem_bytes))
            continue;
        /* A CLBlast that refuses the built-in names just keeps its own values. */
        if (override(ctx, builtin[i].values) == CLBlastSuccess) {
            ctx->tuning = builtin[i];
            ctx->tuning_applied = 1;
            snprintf(ctx->tuning_source, sizeof(ctx->tuning_source), "built-in table");
            clmla_log(ctx, CLMLA_LOG_INFO, "CLBlast's SGEMM parameters for this device set from the built-in table");
        }
        break;
    }
    return CLMLA_SUCCESS;
}

clmla_status clmla_context_xgemm_tuning(const clmla_context *ctx, clmla_xgemm_tuning *tuning, const char **source)
{
    if (source)
        *source = ctx ? ctx->tuning_source : "none";
    if (!ctx)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_context_xgemm_tuning: NULL context");
    if (!ctx->tuning_applied)
        return CLMLA_ERROR_UNSUPPORTED;
    if (tuning)
        *tuning = ctx->tuning;
    return CLMLA_SUCCESS;
}

/* ---- the search -------------------------------------------------------------------------------- */

/* Candidate value sets, most promising first for the device type: square tiles, tiles in local
   memory (SA = SB = 1), work-groups of 64 items on CPUs / 256 on GPUs, wide vectors on CPUs. */
typedef struct candidate {
    size_t v[CLMLA_XGEMM_PARAMETERS];
    int rank;
} candidate;

static int by_rank(const void *a, const void *b)
{
    const int x = ((const candidate *)a)->rank, y = ((const candidate *)b)->rank;
    return (x > y) - (x < y);
}

static int ilog2(size_t v)
{
    int l = 0;
    while (v > 1) {
        v >>= 1;
        l++;
    }
    return l;
}

static size_t candidates(const clmla_context *ctx, candidate **out)
{
    static const size_t tiles[] = {16, 32, 64, 128}, dims[] = {4, 8, 16, 32}, widths[] = {1, 2, 4, 8}, kwgs[] = {16, 32};
    const int cpu = ctx->info.kind == CLMLA_DEVICE_KIND_CPU;
    const size_t cap = 4 * 4 * 4 * 4 * 4 * 4 * 2 * 2 * 2;
    candidate *c = malloc(cap * sizeof(*c));
    size_t n = 0;
    if (!c)
        return 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int md = 0; md < 4; md++)
                for (int nd = 0; nd < 4; nd++)
                    for (int vm = 0; vm < 4; vm++)
                        for (int vn = 0; vn < 4; vn++)
                            for (int kw = 0; kw < 2; kw++)
                                for (int s = 1; s >= 0; s--)
                                    for (int str = 1; str >= 0; str--) {
                                        size_t *v = c[n].v;
                                        memset(v, 0, sizeof(c[n].v));
                                        v[GEMMK] = 0;
                                        v[KREG] = 1;
                                        v[KWG] = kwgs[kw];
                                        v[KWI] = 2;
                                        v[MWG] = tiles[a];
                                        v[NWG] = tiles[b];
                                        v[MDIMC] = v[MDIMA] = dims[md];
                                        v[NDIMC] = v[NDIMB] = dims[nd];
                                        v[VWM] = widths[vm];
                                        v[VWN] = widths[vn];
                                        v[SA] = v[SB] = (size_t)s;
                                        v[STRM] = v[STRN] = (size_t)str;
                                        if (check_values(v, ctx->info.max_work_group_size, ctx->info.local_mem_bytes))
                                            continue;
                                        const int threads = ilog2(v[MDIMC] * v[NDIMC]);
                                        const int want_threads = cpu ? 6 : 8, want_width = cpu ? 3 : 2;
                                        c[n].rank = 8 * abs(threads - want_threads) + 4 * abs(a - b) +
                                                    2 * (abs(ilog2(v[VWM]) - want_width) + abs(ilog2(v[VWN]) - want_width)) +
                                                    3 * (1 - s) + 2 * abs(a - 2) + (1 - str) + (1 - kw) +
                                                    abs(md - nd);
                                        n++;
                                    }
    qsort(c, n, sizeof(*c), by_rank);
    *out = c;
    return n;
}

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct tune_run {
    clmla_context *ctx;
    size_t n;
    cl_mem a, b, c;
    float *host_c;
    const float *host_a, *host_b;
} tune_run;

/* One SGEMM of the run's matrices: 0 on success. */
static CLBlastStatusCode sgemm(tune_run *r)
{
    return CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, r->n, r->n, r->n, 1.0f, r->a, 0,
                        r->n, r->b, 0, r->n, 0.0f, r->c, 0, r->n, &r->ctx->queue, NULL);
}

/* GFLOP/s of the values in effect (the best of 3 timed calls after one checked call); 0 when
   CLBlast fails or the result is not exact, with the reason in *note. */
static double measure(tune_run *r, char *note, size_t note_size)
{
    note[0] = '\0';
    CLBlastStatusCode st = sgemm(r);
    cl_int err = st == CLBlastSuccess ? clFinish(r->ctx->queue) : CL_SUCCESS;
    if (st != CLBlastSuccess || err != CL_SUCCESS) {
        snprintf(note, note_size, "CLBlast failed: %s", clmla_status_string(st != CLBlastSuccess ? st : err));
        return 0;
    }
    if (clmla_cl_read(r->ctx, r->c, 0, r->n * r->n * sizeof(float), r->host_c) != CL_SUCCESS) {
        snprintf(note, note_size, "reading the result failed");
        return 0;
    }
    /* Integer inputs in [-2, 2]: every sum is exact in float, so any difference is a wrong kernel. */
    const size_t n = r->n;
    for (size_t s = 0; s < 97; s++) {
        const size_t i = (s * 7919) % n, j = (s * 104729 + 13) % n;
        long want = 0;
        for (size_t k = 0; k < n; k++)
            want += (long)r->host_a[i * n + k] * (long)r->host_b[k * n + j];
        if (r->host_c[i * n + j] != (float)want) {
            snprintf(note, note_size, "wrong result at [%zu, %zu]: %g, want %ld", i, j, r->host_c[i * n + j], want);
            return 0;
        }
    }
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        const double t0 = seconds();
        st = sgemm(r);
        err = st == CLBlastSuccess ? clFinish(r->ctx->queue) : CL_SUCCESS;
        const double dt = seconds() - t0;
        if (st != CLBlastSuccess || err != CL_SUCCESS) {
            snprintf(note, note_size, "CLBlast failed: %s", clmla_status_string(st != CLBlastSuccess ? st : err));
            return 0;
        }
        if (dt > 0 && (best == 0 || dt < best))
            best = dt;
    }
    return best > 0 ? 2.0 * (double)n * (double)n * (double)n / best * 1e-9 : 0;
}

clmla_status clmla_tune_xgemm(clmla_context *ctx, const clmla_tune_options *options, clmla_xgemm_tuning *best)
{
    if (!ctx || !best)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_tune_xgemm: NULL argument");
    clmla_tune_options o;
    memset(&o, 0, sizeof(o));
    if (options)
        o = *options;
    if (o.size < 0 || o.size > 8192 || o.max_candidates < 0 || o.max_seconds < 0)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_tune_xgemm: size must be 0..8192 (got %d), max_candidates and max_seconds >= 0",
                          o.size);
    const size_t n = o.size ? (size_t)o.size : 1024;
    const int most = o.max_candidates ? o.max_candidates : 40;

    candidate *cands = NULL;
    const size_t count = candidates(ctx, &cands);
    if (!cands)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    const int total = 1 + (int)((size_t)most < count ? (size_t)most : count);

    tune_run r;
    memset(&r, 0, sizeof(r));
    r.ctx = ctx;
    r.n = n;
    float *ha = malloc(n * n * sizeof(float)), *hb = malloc(n * n * sizeof(float));
    r.host_c = malloc(n * n * sizeof(float));
    clmla_status status = CLMLA_SUCCESS;
    if (!ha || !hb || !r.host_c) {
        status = clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory for %zu x %zu matrices", n, n);
        goto done;
    }
    uint32_t seed = 12345;
    for (size_t i = 0; i < n * n; i++) {
        seed = seed * 1664525u + 1013904223u;
        ha[i] = (float)((int)(seed >> 29) % 5 - 2);
        seed = seed * 1664525u + 1013904223u;
        hb[i] = (float)((int)(seed >> 29) % 5 - 2);
    }
    r.host_a = ha;
    r.host_b = hb;
    cl_int err = CL_SUCCESS;
    r.a = clmla_cl_buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * n * sizeof(float), ha, &err);
    if (r.a)
        r.b = clmla_cl_buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * n * sizeof(float), hb, &err);
    if (r.b)
        r.c = clmla_cl_buffer(ctx, CL_MEM_READ_WRITE, n * n * sizeof(float), NULL, &err);
    if (!r.c) {
        status = clmla_fail_cl(ctx, err, "clCreateBuffer (tuning matrices)");
        goto done;
    }

    /* CLBlast runs the Xgemm kernel only from XGEMM_MIN_INDIRECT_SIZE^3 (704 on PoCL, up to 1984
       on GPUs in its tables) and its direct kernel, which these values do not tune, below: the
       search makes it run Xgemm at every size, which the process keeps (hence its own process). */
    {
        const char *routine[1] = {"XGEMM_MIN_INDIRECT_SIZE"};
        const size_t always[1] = {1};
        const CLBlastStatusCode st =
            CLBlastOverrideParameters(ctx->device, "GemmRoutine", CLBlastPrecisionSingle, 1, routine, always);
        if (st != CLBlastSuccess) {
            status = clmla_fail(ctx, CLMLA_ERROR_UNSUPPORTED,
                                "CLBlast refused to run its Xgemm kernel at every size (GemmRoutine): %s",
                                clmla_status_string(st));
            goto done;
        }
    }
    /* What is in effect now: CLBlast's own values, or the entry the context applied. */
    char note[256];
    const double start = seconds();
    const double current = measure(&r, note, sizeof(note));
    if (o.progress)
        o.progress(o.user, 0, total, ctx->tuning_applied ? ctx->tuning.values : NULL, current, note);
    memset(best, 0, sizeof(*best));
    snprintf(best->vendor, sizeof(best->vendor), "%s", ctx->info.vendor);
    snprintf(best->device, sizeof(best->device), "%s", ctx->info.name);
    best->size = (int)n;
    best->default_gflops = current;
    int found = 0;
    for (int i = 0; i + 1 < total; i++) {
        if (o.max_seconds > 0 && seconds() - start > o.max_seconds)
            break;
        const CLBlastStatusCode st = override(ctx, cands[i].v);
        double g = 0;
        if (st != CLBlastSuccess)
            snprintf(note, sizeof(note), "CLBlast refused the values: %s", clmla_status_string(st));
        else
            g = measure(&r, note, sizeof(note));
        if (o.progress)
            o.progress(o.user, i + 1, total, cands[i].v, g, note);
        if (g > best->gflops) {
            memcpy(best->values, cands[i].v, sizeof(best->values));
            best->gflops = g;
            found = 1;
        }
    }
    if (!found) {
        status = clmla_fail(ctx, CLMLA_ERROR_UNSUPPORTED, "no Xgemm candidate ran correctly on '%s' (last: %s)",
                            ctx->info.name, note);
        goto done;
    }
    /* Leave the winner in effect: the best candidate, or the context's own entry if that won. */
    if (current > best->gflops && ctx->tuning_applied)
        override(ctx, ctx->tuning.values);
    else
        override(ctx, best->values);

done:
    if (r.a)
        clReleaseMemObject(r.a);
    if (r.b)
        clReleaseMemObject(r.b);
    if (r.c)
        clReleaseMemObject(r.c);
    free(ha);
    free(hb);
    free(r.host_c);
    free(cands);
    return status;
}

/* ---- latent attention kernel parameters (include/clmla.h, "Latent attention kernel tuning") --- */

/* group_query_layout 1 since the H100 measured it (2026-11-26): 0.72-0.88 of layout 0's time at 16 and
   128 heads; the bank layout it avoids is that of most GPUs' local memory (32 four-byte banks) */
static const clmla_latent_tuning latent_defaults = {16, 8, 4, 16, 4, 128, 8, 1, 16, 0, 4};

/* Entries measured with `clmla tune --kernels` on the developers' machines (CHANGELOG.md,
   docs/DESIGN.md "Kernel tuning"). platform / driver "" = any. */
struct latent_entry {
    char vendor[128], device[128], platform[128], driver[128];
    int heads; /* 0 = any */
    clmla_latent_tuning t;
};

static const latent_entry latent_builtin[] = {
    /* PoCL 3.1 (Debian 12), 2-core AMD EPYC (Zen 3): `clmla tune --kernels`, 16 heads, rkv 512,
       dr 64, ctx 4096, 18 candidates in 18 s; the defaults won (batch 1 1098 us, batch 8 9589 us;
       the next best, rows_keys 16, 1162 and 10417 us) */
    {"AuthenticAMD", "pthread-haswell-AMD EPYC", "Portable Computing Language", "", 16, {16, 8, 4, 16, 4, 128, 8, 0, 16, 0, 4}},
    /* PoCL 3.1 (Debian 12), 2-core AMD EPYC with AVX-512 (2026-11-26): 18 candidates, 16 heads, ctx
       4096, four runs; each run's grid winner (rows_keys 4, 8 or 16, 2 to 8 items per compute unit)
       was 0.86-1.24 of the defaults when timed again beside them, three times out of four slower:
       the defaults */
    {"AuthenticAMD", "pthread-skylake-avx512-AMD EPYC", "Portable Computing Language", "", 16, {16, 8, 4, 16, 4, 128, 8, 0, 16, 0, 4}},
    /* NVIDIA H100 80GB HBM3, driver 580.159.04 (2026-11-26): 72 candidates each, rkv 512, dr 64, ctx
       4096, confirmed by 3 alternations with the defaults of then (query layout 0). 16 heads: batch 1
       59.8 us, batch 8 109.3 us against 69.9 and 120.4 (0.88); 128 heads: 76.8 and 590.0 us against
       103.8 and 832.8 (0.72). Both chose query layout 1; 128 heads also 256 items per group. Any
       driver: the kernel's limits are the chip's. */
    {"NVIDIA Corporation", "NVIDIA H100 80GB HBM3", "NVIDIA CUDA", "", 16, {16, 8, 4, 16, 4, 128, 4, 1, 16, 0, 4}},
    {"NVIDIA Corporation", "NVIDIA H100 80GB HBM3", "NVIDIA CUDA", "", 128, {16, 8, 4, 16, 4, 256, 8, 1, 16, 0, 4}},
};

static const struct {
    const char *name;
    size_t offset;
} latent_names[] = {
    {"rows_heads", offsetof(clmla_latent_tuning, rows_heads)},
    {"rows_keys", offsetof(clmla_latent_tuning, rows_keys)},
    {"rows_groups_per_cu", offsetof(clmla_latent_tuning, rows_groups_per_cu)},
    {"group_heads", offsetof(clmla_latent_tuning, group_heads)},
    {"group_keys", offsetof(clmla_latent_tuning, group_keys)},
    {"group_max_items", offsetof(clmla_latent_tuning, group_max_items)},
    {"group_groups_per_cu", offsetof(clmla_latent_tuning, group_groups_per_cu)},
    {"group_query_layout", offsetof(clmla_latent_tuning, group_query_layout)},
    {"group_fold", offsetof(clmla_latent_tuning, group_fold)},
    {"prefill_tiled", offsetof(clmla_latent_tuning, prefill_tiled)},
    {"group_decode_heads", offsetof(clmla_latent_tuning, group_decode_heads)},
};
#define LATENT_PARAMETERS (sizeof(latent_names) / sizeof(latent_names[0]))

void clmla_latent_tuning_defaults(clmla_latent_tuning *tuning)
{
    if (tuning)
        *tuning = latent_defaults;
}

/* The kernels' constraints (cl/attn_latent.cl): attn_latent_rows walks heads two at a time and keys
   four at a time (HGC even, KTC a multiple of 4), its private arrays bound both; attn_latent pads
   heads to 4, 8 or 16 and needs NT a power of two >= the padded heads (the fit takes the largest
   that the device allows, down to that), whence TK = KPT * NT / HQ whole and a multiple of 4 for
   any KPT. */
static const char *latent_check(const clmla_latent_tuning *t)
{
    if (t->rows_heads < 2 || t->rows_heads > 16 || t->rows_heads % 2)
        return "rows_heads must be even, from 2 to 16";
    if (t->rows_keys < 4 || t->rows_keys > 32 || t->rows_keys % 4)
        return "rows_keys must be a multiple of 4, from 4 to 32";
    if (t->rows_groups_per_cu < 1 || t->rows_groups_per_cu > 64)
        return "rows_groups_per_cu must be from 1 to 64";
    if (t->group_heads < 1 || t->group_heads > 16)
        return "group_heads must be from 1 to 16";
    if (t->group_keys < 1 || t->group_keys > 8)
        return "group_keys must be from 1 to 8";
    if (t->group_max_items < 4 || t->group_max_items > 1024 || (t->group_max_items & (t->group_max_items - 1)))
        return "group_max_items must be a power of two from 4 to 1024";
    if (t->group_groups_per_cu < 1 || t->group_groups_per_cu > 64)
        return "group_groups_per_cu must be from 1 to 64";
    if (t->group_query_layout < 0 || t->group_query_layout > 1)
        return "group_query_layout must be 0 or 1";
    if (t->group_fold < 1 || t->group_fold > 16)
        return "group_fold must be from 1 to 16";
    if (t->prefill_tiled < 0 || t->prefill_tiled > 1)
        return "prefill_tiled must be 0 or 1";
    if (t->group_decode_heads != 4 && t->group_decode_heads != 8 && t->group_decode_heads != 16)
        return "group_decode_heads must be 4, 8 or 16";
    return NULL;
}

clmla_status clmla_latent_tuning_check(const clmla_latent_tuning *tuning, const char **why)
{
    const char *w = tuning ? latent_check(tuning) : "NULL argument";
    if (why)
        *why = w;
    return w ? clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "latent attention parameters refused: %s", w)
             : CLMLA_SUCCESS;
}

static int copy_key(char *dst, size_t size, const cJSON *v, int required)
{
    if (!v)
        return !required && (dst[0] = '\0', 1);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= size)
        return 0;
    snprintf(dst, size, "%s", v->valuestring);
    return 1;
}

/* 1 when o is an entry of a kernel-tuning file for another of clmla's kernels than `mine` (the
   file holds "attn_latent" entries, whose "kernel" may be left out, and "products" ones). */
static int other_kernel(const cJSON *o, const char *mine)
{
    static const char *const known[] = {"attn_latent", "products"};
    const cJSON *kernel = cJSON_GetObjectItemCaseSensitive(o, "kernel");
    const char *name = cJSON_IsString(kernel) ? kernel->valuestring : kernel ? NULL : "attn_latent";
    if (!name)
        return 0;
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strcmp(name, known[i]) == 0)
            return strcmp(name, mine) != 0;
    return 0; /* an unknown kernel: refused by the parser of `mine` */
}

/* One entry of a kernel-tuning file: 1 parsed and legal, 0 not (why says what, naming the value). */
static int latent_parse_entry(const cJSON *o, latent_entry *e, char *why, size_t why_size)
{
    memset(e, 0, sizeof(*e));
    e->t = latent_defaults;
    if (!cJSON_IsObject(o)) {
        snprintf(why, why_size, "an entry is not a JSON object");
        return 0;
    }
    const cJSON *kernel = cJSON_GetObjectItemCaseSensitive(o, "kernel");
    if (kernel && !(cJSON_IsString(kernel) && strcmp(kernel->valuestring, "attn_latent") == 0)) {
        snprintf(why, why_size, "\"kernel\" must be \"attn_latent\" or \"products\"");
        return 0;
    }
    if (!copy_key(e->vendor, sizeof(e->vendor), cJSON_GetObjectItemCaseSensitive(o, "vendor"), 1) ||
        !copy_key(e->device, sizeof(e->device), cJSON_GetObjectItemCaseSensitive(o, "device"), 1) ||
        !copy_key(e->platform, sizeof(e->platform), cJSON_GetObjectItemCaseSensitive(o, "platform"), 0) ||
        !copy_key(e->driver, sizeof(e->driver), cJSON_GetObjectItemCaseSensitive(o, "driver"), 0)) {
        snprintf(why, why_size, "\"vendor\" and \"device\" (and \"platform\", \"driver\" where given) must be strings "
                                "of under 128 bytes");
        return 0;
    }
    const cJSON *heads = cJSON_GetObjectItemCaseSensitive(o, "heads");
    if (!heads || (cJSON_IsString(heads) && strcmp(heads->valuestring, "any") == 0))
        e->heads = 0;
    else if (cJSON_IsNumber(heads) && heads->valuedouble >= 1 && heads->valuedouble <= 65536 &&
             heads->valuedouble == floor(heads->valuedouble))
        e->heads = (int)heads->valuedouble;
    else {
        snprintf(why, why_size, "entry for '%s': \"heads\" must be a head count or \"any\"", e->device);
        return 0;
    }
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (!cJSON_IsObject(params)) {
        snprintf(why, why_size, "entry for '%s': \"parameters\" must be an object", e->device);
        return 0;
    }
    const cJSON *p = NULL;
    cJSON_ArrayForEach(p, params)
    {
        size_t i = 0;
        while (i < LATENT_PARAMETERS && strcmp(latent_names[i].name, p->string) != 0)
            i++;
        if (i == LATENT_PARAMETERS) {
            snprintf(why, why_size, "entry for '%s': unknown parameter \"%s\"", e->device, p->string);
            return 0;
        }
        if (!cJSON_IsNumber(p) || p->valuedouble < -1e6 || p->valuedouble > 1e6 || p->valuedouble != floor(p->valuedouble)) {
            snprintf(why, why_size, "entry for '%s': %s must be a whole number", e->device, p->string);
            return 0;
        }
        *(int *)((char *)&e->t + latent_names[i].offset) = (int)p->valuedouble;
    }
    const char *bad = latent_check(&e->t);
    if (bad) {
        snprintf(why, why_size, "entry for '%s': %s", e->device, bad);
        return 0;
    }
    return 1;
}

static int latent_matches(const latent_entry *e, const clmla_device_info *d)
{
    return strcmp(e->vendor, d->vendor) == 0 && strcmp(e->device, d->name) == 0 &&
           (!e->platform[0] || strcmp(e->platform, d->platform_name) == 0) &&
           (!e->driver[0] || strcmp(e->driver, d->driver_version) == 0);
}

/* The best entry of a list for the device and heads: exact heads over "any", the first of each. */
static const latent_entry *latent_best(const latent_entry *list, size_t n, const clmla_device_info *d, int heads)
{
    const latent_entry *any = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!latent_matches(&list[i], d))
            continue;
        if (heads > 0 && list[i].heads == heads)
            return &list[i];
        if (list[i].heads == 0 && !any)
            any = &list[i];
    }
    return any;
}

int clmla_latent_tuning_parse(const char *text, latent_entry_list *out, char *why, size_t why_size)
{
    memset(out, 0, sizeof(*out));
    why[0] = '\0';
    cJSON *list = cJSON_Parse(text);
    if (!cJSON_IsArray(list)) {
        cJSON_Delete(list);
        snprintf(why, why_size, "not a JSON array of entries");
        return -1;
    }
    const int n = cJSON_GetArraySize(list);
    out->entries = calloc(n > 0 ? (size_t)n : 1, sizeof(latent_entry));
    if (!out->entries) {
        cJSON_Delete(list);
        snprintf(why, why_size, "out of host memory");
        return -1;
    }
    int refused = 0;
    const cJSON *item = NULL;
    cJSON_ArrayForEach(item, list)
    {
        char one[512];
        if (other_kernel(item, "attn_latent")) /* a product entry: clmla_product_tuning_parse's */
            continue;
        if (latent_parse_entry(item, &out->entries[out->count], one, sizeof(one)))
            out->count++;
        else if (!refused++)
            snprintf(why, why_size, "%s", one); /* the first refusal; the others are refused too */
    }
    cJSON_Delete(list);
    return refused;
}

void clmla_latent_tuning_list_free(latent_entry_list *list)
{
    free(list->entries);
    memset(list, 0, sizeof(*list));
}

clmla_status clmla_latent_tuning_path(char *buf, size_t size)
{
    if (!buf || size == 0)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_latent_tuning_path: no buffer");
    clmla_env env;
    clmla_env_read(&env);
    const char *v = getenv("CLMLA_KERNEL_TUNING");
    int n = 0;
    if (v && strcmp(v, "off") == 0)
        buf[0] = '\0';
    else if (v && *v && strcmp(v, "auto") != 0)
        n = snprintf(buf, size, "%s", v);
    else if (env.cache_dir[0])
        n = snprintf(buf, size, "%s/kernel-tuning.json", env.cache_dir);
    else
        buf[0] = '\0';
    if (n < 0 || (size_t)n >= size) {
        buf[0] = '\0';
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "the kernel tuning path needs %d bytes, the buffer has %zu",
                          n + 1, size);
    }
    return CLMLA_SUCCESS;
}

/* The user file, read once per process. */
static pthread_once_t user_once = PTHREAD_ONCE_INIT;
static latent_entry_list user_entries;
static product_entry_list user_products;
static char user_source[CLMLA_PATH_SIZE + 8] = "";
static char user_problem[2 * CLMLA_PATH_SIZE + 1024] = ""; /* what was wrong with it, "" when nothing */

static void user_load(void)
{
    char path[CLMLA_PATH_SIZE];
    if (clmla_latent_tuning_path(path, sizeof(path)) != CLMLA_SUCCESS || !path[0] || absent(path))
        return;
    char *text = NULL, err[CLMLA_PATH_SIZE + 256];
    size_t length = 0;
    if (clmla_read_file(path, MAX_TUNING_FILE_BYTES, "a kernel tuning file", &text, &length, err, sizeof(err)) !=
        CLMLA_SUCCESS) {
        snprintf(user_problem, sizeof(user_problem), "kernel tuning file %s ignored: %s", path, err);
    } else {
        char why[512], why_products[512];
        int refused = clmla_latent_tuning_parse(text, &user_entries, why, sizeof(why));
        const int refused_products = clmla_product_tuning_parse(text, &user_products, why_products, sizeof(why_products));
        free(text);
        if (refused >= 0 && refused_products > 0) {
            if (!refused)
                snprintf(why, sizeof(why), "%s", why_products);
            refused += refused_products;
        }
        if (refused < 0)
            snprintf(user_problem, sizeof(user_problem), "kernel tuning file %s ignored: %s", path, why);
        else if (refused > 0)
            snprintf(user_problem, sizeof(user_problem), "kernel tuning file %s: %d entr%s refused (%s)", path, refused,
                     refused == 1 ? "y" : "ies", why);
    }
    snprintf(user_source, sizeof(user_source), "file %s", path);
}
static atomic_int user_problem_logged;

const char *clmla_latent_tuning_problem(void)
{
    pthread_once(&user_once, user_load);
    return user_problem;
}

int clmla_latent_tuning_resolve(const latent_entry_list *user, const char *user_src, const clmla_device_info *device,
                                int num_heads, clmla_latent_tuning *tuning, const char **source)
{
    const latent_entry *e = user ? latent_best(user->entries, user->count, device, num_heads) : NULL;
    if (e) {
        *tuning = e->t;
        *source = user_src;
        return 2;
    }
    e = latent_best(latent_builtin, sizeof(latent_builtin) / sizeof(latent_builtin[0]), device, num_heads);
    if (e) {
        *tuning = e->t;
        *source = "built-in table";
        return 1;
    }
    *tuning = latent_defaults;
    *source = "defaults";
    return 0;
}

clmla_status clmla_latent_tuning_lookup(const clmla_device_info *device, int num_heads, clmla_latent_tuning *tuning,
                                        const char **source)
{
    if (!device || !tuning || num_heads < 0)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_latent_tuning_lookup: NULL argument or heads < 0");
    pthread_once(&user_once, user_load);
    const char *s = NULL;
    clmla_latent_tuning_resolve(&user_entries, user_source, device, num_heads, tuning, &s);
    if (source)
        *source = s;
    return user_problem[0] ? clmla_fail(NULL, CLMLA_ERROR_INVALID_FILE, "%s", user_problem) : CLMLA_SUCCESS;
}

clmla_status clmla_context_set_latent_tuning(clmla_context *ctx, const clmla_latent_tuning *tuning)
{
    if (!ctx)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_context_set_latent_tuning: NULL context");
    const char *bad = tuning ? latent_check(tuning) : NULL;
    if (bad)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "latent attention parameters refused: %s", bad);
    if (tuning)
        ctx->latent_forced = *tuning;
    ctx->latent_forced_set = tuning != NULL;
    return CLMLA_SUCCESS;
}

void clmla_latent_tuning_for(const clmla_context *ctx, int num_heads, clmla_latent_tuning *tuning)
{
    if (ctx->latent_forced_set) {
        *tuning = ctx->latent_forced;
        return;
    }
    pthread_once(&user_once, user_load);
    if (user_problem[0] && atomic_exchange(&user_problem_logged, 1) == 0)
        clmla_log((clmla_context *)ctx, CLMLA_LOG_WARNING, "%s", user_problem);
    const char *source = NULL;
    clmla_latent_tuning_resolve(&user_entries, user_source, &ctx->info, num_heads, tuning, &source);
}

/* The entries of the kernel tuning file at path, to add one to: an empty list when there is no
   file; CLMLA_ERROR_INVALID_FILE when it is not a valid one (every entry legal, of either kernel). */
static clmla_status load_for_save(const char *path, cJSON **list)
{
    *list = NULL;
    if (absent(path)) {
        *list = cJSON_CreateArray();
        return CLMLA_SUCCESS;
    }
    char *old = NULL, err[CLMLA_PATH_SIZE + 256];
    size_t length = 0;
    const clmla_status st =
        clmla_read_file(path, MAX_TUNING_FILE_BYTES, "a kernel tuning file", &old, &length, err, sizeof(err));
    if (st != CLMLA_SUCCESS)
        return clmla_fail(NULL, st, "%s", err);
    latent_entry_list check;
    product_entry_list check_products;
    char why[512], why_products[512];
    const int refused = clmla_latent_tuning_parse(old, &check, why, sizeof(why));
    const int refused_products = clmla_product_tuning_parse(old, &check_products, why_products, sizeof(why_products));
    clmla_latent_tuning_list_free(&check);
    clmla_product_tuning_list_free(&check_products);
    *list = refused == 0 && refused_products == 0 ? cJSON_Parse(old) : NULL;
    free(old);
    if (!*list)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_FILE,
                          "%s is not a JSON array of kernel tuning entries: %s; it was left as it is", path,
                          refused ? why : why_products);
    return CLMLA_SUCCESS;
}

clmla_status clmla_latent_tuning_save(const char *path, const clmla_device_info *device, int num_heads,
                                      const clmla_latent_tuning *tuning, const char *note)
{
    if (!path || !*path || !device || !tuning || num_heads < 0)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_latent_tuning_save: NULL or empty argument");
    const char *bad = latent_check(tuning);
    if (bad)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "latent attention parameters refused: %s", bad);
    cJSON *list = NULL;
    clmla_status st = load_for_save(path, &list);
    if (st != CLMLA_SUCCESS)
        return st;
    cJSON *o = cJSON_CreateObject(), *p = cJSON_CreateObject();
    if (!list || !o || !p) {
        cJSON_Delete(list);
        cJSON_Delete(o);
        cJSON_Delete(p);
        return clmla_fail(NULL, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    cJSON_AddStringToObject(o, "kernel", "attn_latent");
    cJSON_AddStringToObject(o, "platform", device->platform_name);
    cJSON_AddStringToObject(o, "vendor", device->vendor);
    cJSON_AddStringToObject(o, "device", device->name);
    cJSON_AddStringToObject(o, "driver", device->driver_version);
    if (num_heads > 0)
        cJSON_AddNumberToObject(o, "heads", num_heads);
    else
        cJSON_AddStringToObject(o, "heads", "any");
    for (size_t i = 0; i < LATENT_PARAMETERS; i++)
        cJSON_AddNumberToObject(p, latent_names[i].name, *(const int *)((const char *)tuning + latent_names[i].offset));
    cJSON_AddItemToObject(o, "parameters", p);
    if (note && *note)
        cJSON_AddStringToObject(o, "measured", note);
    /* Replace the entry with the same key, else append. */
    latent_entry mine;
    char why[512];
    latent_parse_entry(o, &mine, why, sizeof(why));
    int index = 0, replaced = 0;
    const cJSON *item = NULL;
    cJSON_ArrayForEach(item, list)
    {
        latent_entry e;
        if (latent_parse_entry(item, &e, why, sizeof(why)) && e.heads == mine.heads && strcmp(e.vendor, mine.vendor) == 0 &&
            strcmp(e.device, mine.device) == 0 && strcmp(e.platform, mine.platform) == 0 &&
            strcmp(e.driver, mine.driver) == 0) {
            cJSON_ReplaceItemInArray(list, index, o);
            replaced = 1;
            break;
        }
        index++;
    }
    if (!replaced)
        cJSON_AddItemToArray(list, o);
    return save_json(path, list);
}

/* ---- product kernel parameters (include/clmla.h, "Product kernel tuning") ---------------------- */

static const clmla_product_tuning product_defaults = {128, 2, 4, 64, 8, 8, 4, 3, 1, 256, 48, 3, 1024, 0, 4};

struct product_entry {
    char vendor[128], device[128], platform[128], driver[128];
    int k_class; /* clmla_product_k_class: 0 = any */
    clmla_product_tuning t;
};

/* Entries measured on the developers' machines (docs/BENCHMARKS.md, "Product kernel tuning"). On
   PoCL with AVX2 (2-core EPYC) the defaults won. */
static const product_entry product_builtin[] = {
    /* PoCL 3.1 (Debian 12), 2-core AMD EPYC with AVX-512 (2026-11-26): fp8 block sums, 4
       alternations of clmla-bench's V3 products at 1 row, medians: q_b_proj 1.54 / 1.63 ms,
       qkv_a_proj 0.72 / 0.75, o_proj 4.49 / 4.92 (on / off); 4 and 8 rows slower with them (16.1 /
       14.6-18.4 ms for o_proj at 8), hence 1 and 2 rows only. The rest: the defaults. */
    {"AuthenticAMD", "pthread-skylake-avx512-AMD EPYC", "Portable Computing Language", "", 0,
     {128, 2, 4, 64, 8, 8, 4, 3, 1, 256, 48, 3, 1024, 1, 4}},
    /* NVIDIA H100 80GB HBM3, driver 580.159.04 (2026-11-26): gemm_skinny_nt at 1 row, 29 candidates
       per K class on V2-Lite's and V3's projections in f32, bf16 and fp8; the defaults won both
       classes (next best 1.006-1.036 of their time; skinny_vector 8 and 16, 1.27 and 1.92). An
       entry, so that `clmla devices --verbose` says the device was measured. */
    {"NVIDIA Corporation", "NVIDIA H100 80GB HBM3", "NVIDIA CUDA", "", 0,
     {128, 2, 4, 64, 8, 8, 4, 3, 1, 256, 48, 3, 1024, 0, 4}},
};
static const size_t product_builtin_count = sizeof(product_builtin) / sizeof(product_builtin[0]);

static const char *const k_class_names[] = {"any", "small", "large"};

static const struct {
    const char *name;
    size_t offset;
} product_names[] = {
    {"skinny_items", offsetof(clmla_product_tuning, skinny_items)},
    {"skinny_unroll", offsetof(clmla_product_tuning, skinny_unroll)},
    {"skinny_columns", offsetof(clmla_product_tuning, skinny_columns)},
    {"skinny_nn_items", offsetof(clmla_product_tuning, skinny_nn_items)},
    {"cpu_items_per_cu", offsetof(clmla_product_tuning, cpu_items_per_cu)},
    {"packed_streams_1", offsetof(clmla_product_tuning, packed_streams_1)},
    {"packed_streams_2", offsetof(clmla_product_tuning, packed_streams_2)},
    {"packed_streams_4", offsetof(clmla_product_tuning, packed_streams_4)},
    {"cpu_prefetch", offsetof(clmla_product_tuning, cpu_prefetch)},
    {"tiled_rows", offsetof(clmla_product_tuning, tiled_rows)},
    {"tiled_columns", offsetof(clmla_product_tuning, tiled_columns)},
    {"tiled_weight_rows", offsetof(clmla_product_tuning, tiled_weight_rows)},
    {"tiled_k_chunk", offsetof(clmla_product_tuning, tiled_k_chunk)},
    {"cpu_fp8_block_sums", offsetof(clmla_product_tuning, cpu_fp8_block_sums)},
    {"skinny_vector", offsetof(clmla_product_tuning, skinny_vector)},
};
#define PRODUCT_PARAMETERS (sizeof(product_names) / sizeof(product_names[0]))

void clmla_product_tuning_defaults(clmla_product_tuning *tuning)
{
    if (tuning)
        *tuning = product_defaults;
}

int clmla_product_k_class(size_t k)
{
    return k == 0 ? 0 : k <= CLMLA_PRODUCT_SMALL_K ? 1 : 2;
}

static int power_of_two(int v)
{
    return v > 0 && (v & (v - 1)) == 0;
}

/* The kernels' constraints (cl/gemm_skinny.cl): gemm_skinny_nt's tree over local memory needs a
   power-of-two group, its kernel slots hold up to 8 columns; gemm_packed_rows keeps MRP x STREAMS
   float8 accumulators in registers (the bounds keep that at most 16); gemm_tiled_rows walks its
   rows 4 at a time and reads a block scale once per 128 values of K (W_BLOCK: KC a multiple). */
const char *clmla_product_tuning_problem(const clmla_product_tuning *t)
{
    if (!power_of_two(t->skinny_items) || t->skinny_items < 16 || t->skinny_items > 1024)
        return "skinny_items must be a power of two from 16 to 1024";
    if (t->skinny_unroll < 1 || t->skinny_unroll > 8)
        return "skinny_unroll must be from 1 to 8";
    if (!power_of_two(t->skinny_columns) || t->skinny_columns > 8)
        return "skinny_columns must be 1, 2, 4 or 8";
    if (!power_of_two(t->skinny_nn_items) || t->skinny_nn_items < 16 || t->skinny_nn_items > 1024)
        return "skinny_nn_items must be a power of two from 16 to 1024";
    if (t->cpu_items_per_cu < 1 || t->cpu_items_per_cu > 64)
        return "cpu_items_per_cu must be from 1 to 64";
    if (t->packed_streams_1 < 1 || t->packed_streams_1 > 8)
        return "packed_streams_1 must be from 1 to 8";
    if (t->packed_streams_2 < 1 || t->packed_streams_2 > 8)
        return "packed_streams_2 must be from 1 to 8";
    if (t->packed_streams_4 < 1 || t->packed_streams_4 > 4)
        return "packed_streams_4 must be from 1 to 4";
    if (t->cpu_prefetch != 0 && t->cpu_prefetch != 1)
        return "cpu_prefetch must be 0 or 1";
    if (t->tiled_rows < 4 || t->tiled_rows > 1024 || t->tiled_rows % 4)
        return "tiled_rows must be a multiple of 4, from 4 to 1024";
    if (t->tiled_columns < 1 || t->tiled_columns > 512)
        return "tiled_columns must be from 1 to 512";
    if (t->tiled_weight_rows < 1 || t->tiled_weight_rows > 4)
        return "tiled_weight_rows must be from 1 to 4";
    if (t->tiled_k_chunk < 128 || t->tiled_k_chunk > 16384 || t->tiled_k_chunk % 128)
        return "tiled_k_chunk must be a multiple of 128, from 128 to 16384";
    if (t->cpu_fp8_block_sums != 0 && t->cpu_fp8_block_sums != 1)
        return "cpu_fp8_block_sums must be 0 or 1";
    if (t->skinny_vector != 4 && t->skinny_vector != 8 && t->skinny_vector != 16)
        return "skinny_vector must be 4, 8 or 16";
    return NULL;
}

clmla_status clmla_product_tuning_check(const clmla_product_tuning *tuning, const char **why)
{
    const char *w = tuning ? clmla_product_tuning_problem(tuning) : "NULL argument";
    if (why)
        *why = w;
    return w ? clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "product kernel parameters refused: %s", w)
             : CLMLA_SUCCESS;
}

/* One "products" entry: 1 parsed and legal, 0 not (why says what, naming the value). */
static int product_parse_entry(const cJSON *o, product_entry *e, char *why, size_t why_size)
{
    memset(e, 0, sizeof(*e));
    e->t = product_defaults;
    if (!copy_key(e->vendor, sizeof(e->vendor), cJSON_GetObjectItemCaseSensitive(o, "vendor"), 1) ||
        !copy_key(e->device, sizeof(e->device), cJSON_GetObjectItemCaseSensitive(o, "device"), 1) ||
        !copy_key(e->platform, sizeof(e->platform), cJSON_GetObjectItemCaseSensitive(o, "platform"), 0) ||
        !copy_key(e->driver, sizeof(e->driver), cJSON_GetObjectItemCaseSensitive(o, "driver"), 0)) {
        snprintf(why, why_size, "\"vendor\" and \"device\" (and \"platform\", \"driver\" where given) must be strings "
                                "of under 128 bytes");
        return 0;
    }
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(o, "k_class");
    e->k_class = -1;
    if (!cls)
        e->k_class = 0;
    else if (cJSON_IsString(cls))
        for (int i = 0; i < 3; i++)
            if (strcmp(cls->valuestring, k_class_names[i]) == 0)
                e->k_class = i;
    if (e->k_class < 0) {
        snprintf(why, why_size, "entry for '%s': \"k_class\" must be \"small\", \"large\" or \"any\"", e->device);
        return 0;
    }
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (!cJSON_IsObject(params)) {
        snprintf(why, why_size, "entry for '%s': \"parameters\" must be an object", e->device);
        return 0;
    }
    const cJSON *p = NULL;
    cJSON_ArrayForEach(p, params)
    {
        size_t i = 0;
        while (i < PRODUCT_PARAMETERS && strcmp(product_names[i].name, p->string) != 0)
            i++;
        if (i == PRODUCT_PARAMETERS) {
            snprintf(why, why_size, "entry for '%s': unknown parameter \"%s\"", e->device, p->string);
            return 0;
        }
        if (!cJSON_IsNumber(p) || p->valuedouble < -1e6 || p->valuedouble > 1e6 || p->valuedouble != floor(p->valuedouble)) {
            snprintf(why, why_size, "entry for '%s': %s must be a whole number", e->device, p->string);
            return 0;
        }
        *(int *)((char *)&e->t + product_names[i].offset) = (int)p->valuedouble;
    }
    const char *bad = clmla_product_tuning_problem(&e->t);
    if (bad) {
        snprintf(why, why_size, "entry for '%s': %s", e->device, bad);
        return 0;
    }
    return 1;
}

static int is_products(const cJSON *o)
{
    const cJSON *kernel = cJSON_GetObjectItemCaseSensitive(o, "kernel");
    return cJSON_IsObject(o) && cJSON_IsString(kernel) && strcmp(kernel->valuestring, "products") == 0;
}

int clmla_product_tuning_parse(const char *text, product_entry_list *out, char *why, size_t why_size)
{
    memset(out, 0, sizeof(*out));
    why[0] = '\0';
    cJSON *list = cJSON_Parse(text);
    if (!cJSON_IsArray(list)) {
        cJSON_Delete(list);
        snprintf(why, why_size, "not a JSON array of entries");
        return -1;
    }
    const int n = cJSON_GetArraySize(list);
    out->entries = calloc(n > 0 ? (size_t)n : 1, sizeof(product_entry));
    if (!out->entries) {
        cJSON_Delete(list);
        snprintf(why, why_size, "out of host memory");
        return -1;
    }
    int refused = 0;
    const cJSON *item = NULL;
    cJSON_ArrayForEach(item, list)
    {
        char one[512];
        if (!is_products(item)) /* attn_latent's, or refused by its parser */
            continue;
        if (product_parse_entry(item, &out->entries[out->count], one, sizeof(one)))
            out->count++;
        else if (!refused++)
            snprintf(why, why_size, "%s", one);
    }
    cJSON_Delete(list);
    return refused;
}

void clmla_product_tuning_list_free(product_entry_list *list)
{
    free(list->entries);
    memset(list, 0, sizeof(*list));
}

static int product_matches(const product_entry *e, const clmla_device_info *d)
{
    return strcmp(e->vendor, d->vendor) == 0 && strcmp(e->device, d->name) == 0 &&
           (!e->platform[0] || strcmp(e->platform, d->platform_name) == 0) &&
           (!e->driver[0] || strcmp(e->driver, d->driver_version) == 0);
}

/* The best entry of a list for the device and class: the exact class over "any", the first of each. */
static const product_entry *product_best(const product_entry *list, size_t n, const clmla_device_info *d, int k_class)
{
    const product_entry *any = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!product_matches(&list[i], d))
            continue;
        if (k_class > 0 && list[i].k_class == k_class)
            return &list[i];
        if (list[i].k_class == 0 && !any)
            any = &list[i];
    }
    return any;
}

int clmla_product_tuning_resolve(const product_entry_list *user, const char *user_src, const clmla_device_info *device,
                                 size_t k, clmla_product_tuning *tuning, const char **source)
{
    const int cls = clmla_product_k_class(k);
    const product_entry *e = user ? product_best(user->entries, user->count, device, cls) : NULL;
    if (e) {
        *tuning = e->t;
        *source = user_src;
        return 2;
    }
    e = product_best(product_builtin, product_builtin_count, device, cls);
    if (e) {
        *tuning = e->t;
        *source = "built-in table";
        return 1;
    }
    *tuning = product_defaults;
    *source = "defaults";
    return 0;
}

clmla_status clmla_product_tuning_lookup(const clmla_device_info *device, size_t k, clmla_product_tuning *tuning,
                                         const char **source)
{
    if (!device || !tuning)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_product_tuning_lookup: NULL argument");
    pthread_once(&user_once, user_load);
    const char *s = NULL;
    clmla_product_tuning_resolve(&user_products, user_source, device, k, tuning, &s);
    if (source)
        *source = s;
    return user_problem[0] ? clmla_fail(NULL, CLMLA_ERROR_INVALID_FILE, "%s", user_problem) : CLMLA_SUCCESS;
}

void clmla_product_tuning_for(const clmla_context *ctx, size_t k, clmla_product_tuning *tuning)
{
    if (ctx->product_forced_set) {
        *tuning = ctx->product_forced;
        return;
    }
    pthread_once(&user_once, user_load);
    if (user_problem[0] && atomic_exchange(&user_problem_logged, 1) == 0)
        clmla_log((clmla_context *)ctx, CLMLA_LOG_WARNING, "%s", user_problem);
    const char *source = NULL;
    clmla_product_tuning_resolve(&user_products, user_source, &ctx->info, k, tuning, &source);
}

clmla_status clmla_product_tuning_save(const char *path, const clmla_device_info *device, size_t k,
                                       const clmla_product_tuning *tuning, const char *note)
{
    if (!path || !*path || !device || !tuning)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_product_tuning_save: NULL or empty argument");
    const char *bad = clmla_product_tuning_problem(tuning);
    if (bad)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "product kernel parameters refused: %s", bad);
    cJSON *list = NULL;
    clmla_status st = load_for_save(path, &list);
    if (st != CLMLA_SUCCESS)
        return st;
    cJSON *o = cJSON_CreateObject(), *p = cJSON_CreateObject();
    if (!list || !o || !p) {
        cJSON_Delete(list);
        cJSON_Delete(o);
        cJSON_Delete(p);
        return clmla_fail(NULL, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    cJSON_AddStringToObject(o, "kernel", "products");
    cJSON_AddStringToObject(o, "platform", device->platform_name);
    cJSON_AddStringToObject(o, "vendor", device->vendor);
    cJSON_AddStringToObject(o, "device", device->name);
    cJSON_AddStringToObject(o, "driver", device->driver_version);
    cJSON_AddStringToObject(o, "k_class", k_class_names[clmla_product_k_class(k)]);
    for (size_t i = 0; i < PRODUCT_PARAMETERS; i++)
        cJSON_AddNumberToObject(p, product_names[i].name, *(const int *)((const char *)tuning + product_names[i].offset));
    cJSON_AddItemToObject(o, "parameters", p);
    if (note && *note)
        cJSON_AddStringToObject(o, "measured", note);
    /* Replace the "products" entry with the same key, else append. */
    product_entry mine;
    char why[512];
    product_parse_entry(o, &mine, why, sizeof(why));
    int index = 0, replaced = 0;
    const cJSON *item = NULL;
    cJSON_ArrayForEach(item, list)
    {
        product_entry e;
        if (is_products(item) && product_parse_entry(item, &e, why, sizeof(why)) && e.k_class == mine.k_class &&
            strcmp(e.vendor, mine.vendor) == 0 && strcmp(e.device, mine.device) == 0 &&
            strcmp(e.platform, mine.platform) == 0 && strcmp(e.driver, mine.driver) == 0) {
            cJSON_ReplaceItemInArray(list, index, o);
            replaced = 1;
            break;
        }
        index++;
    }
    if (!replaced)
        cJSON_AddItemToArray(list, o);
    return save_json(path, list);
}
