/* CLBlast Xgemm tuning: the entries context creation applies (a JSON file, else the built-in
   table), saving entries, and the search behind `clmla tune`. See include/clmla_tuning.h. The parameters
   of clmla's own kernels: kernel_tuning.c. */
#include "tuning.h"
#include "clcall.h"
#include "fileio.h"
#include "gemm.h"
#include "tuning_data.h"

#include <clblast_c.h>
#include <cjson/cJSON.h>
#include <stddef.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const names[CLMLA_XGEMM_PARAMETERS] = {"GEMMK", "KREG",  "KWG", "KWI", "MDIMA", "MDIMC",
                                                          "MWG",   "NDIMB", "NDIMC", "NWG", "SA",    "SB",
                                                          "STRM",  "STRN",  "VWM", "VWN"};
enum { GEMMK, KREG, KWG, KWI, MDIMA, MDIMC, MWG, NDIMB, NDIMC, NWG, SA, SB, STRM, STRN, VWM, VWN };

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

/* CLMLA_CLBLAST_TUNING's path: "" (the cache folder's file) for "off" and "auto". */
static const char *xgemm_file_given(const clmla_env *env)
{
    const char *v = env->clblast_tuning;
    return strcmp(v, "off") != 0 && strcmp(v, "auto") != 0 ? v : "";
}

clmla_status clmla_xgemm_tuning_path(char *buf, size_t size)
{
    return clmla_tuning_file_path(buf, size, "clmla_xgemm_tuning_path", xgemm_file_given, "clblast-tuning.json",
                                  "tuning");
}

clmla_status clmla_tuning_file_path(char *buf, size_t size, const char *fn, const char *(*given)(const clmla_env *env),
                                    const char *file, const char *what)
{
    if (!buf || size == 0)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "%s: no buffer", fn);
    clmla_env env;
    clmla_env_read(&env);
    const char *path = given(&env);
    int n = 0;
    if (path && *path)
        n = snprintf(buf, size, "%s", path);
    else if (path && env.cache_dir[0])
        n = snprintf(buf, size, "%s/%s", env.cache_dir, file);
    else
        buf[0] = '\0';
    if (n < 0 || (size_t)n >= size) {
        buf[0] = '\0';
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "the %s path needs %d bytes, the buffer has %zu", what,
                          n + 1, size);
    }
    return CLMLA_SUCCESS;
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

clmla_status clmla_tuning_save_json(const char *path, cJSON *list, cJSON *entry,
                                    int (*same)(const cJSON *item, const void *key), const void *key)
{
    int index = 0, replaced = 0;
    const cJSON *item = NULL;
    cJSON_ArrayForEach(item, list)
    {
        if (same(item, key)) {
            cJSON_ReplaceItemInArray(list, index, entry);
            replaced = 1;
            break;
        }
        index++;
    }
    if (!replaced)
        cJSON_AddItemToArray(list, entry);
    char *text = cJSON_Print(list);
    cJSON_Delete(list);
    if (!text)
        return clmla_fail(NULL, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    const size_t len = strlen(text);
    char *with_newline = realloc(text, len + 2);
    if (!with_newline) {
        free(text);
        return clmla_fail(NULL, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    with_newline[len] = '\n';
    with_newline[len + 1] = '\0';
    char err[CLMLA_PATH_SIZE + 256];
    const clmla_status st = clmla_write_file_replacing(path, with_newline, len + 1, err, sizeof(err));
    free(with_newline);
    return st == CLMLA_SUCCESS ? st : clmla_fail(NULL, st, "%s", err);
}

/* Whether the file entry `item` is for the vendor and device of the clmla_xgemm_tuning `key`. */
static int entry_for_device(const cJSON *item, const void *key)
{
    const clmla_xgemm_tuning *tuning = key;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(item, "vendor");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(item, "device");
    return cJSON_IsString(v) && cJSON_IsString(d) && strcmp(v->valuestring, tuning->vendor) == 0 &&
           strcmp(d->valuestring, tuning->device) == 0;
}

clmla_status clmla_xgemm_tuning_save(const char *path, const clmla_xgemm_tuning *tuning)
{
    if (!path || !*path || !tuning)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_xgemm_tuning_save: NULL or empty argument");
    cJSON *list = NULL;
    char *old = NULL, err[CLMLA_PATH_SIZE + 256];
    size_t length = 0;
    if (!clmla_path_absent(path)) {
        const clmla_status st =
            clmla_read_file(path, CLMLA_TUNING_FILE_MAX_BYTES, "a tuning file", &old, &length, err, sizeof(err));
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
    /* the entry for the same vendor and device is replaced */
    return clmla_tuning_save_json(path, list, entry, entry_for_device, tuning);
}

/* ---- the built-in entries ------------------------------------------------------------------- */

const char *clmla_tuning_data_text(const char *name)
{
    for (size_t i = 0; i < clmla_tuning_data_count; i++)
        if (strcmp(clmla_tuning_data[i].name, name) == 0)
            return clmla_tuning_data[i].source;
    return NULL;
}

static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;
static clmla_xgemm_tuning *builtin; /* host/mla/tuning_data/clblast.json's entries, kept for the process */
static size_t builtin_count;

/* The embedded entries through the user files' parser (parse_entry); a refused one is left out
   (test_tuning_data checks that none is). */
static void builtin_load(void)
{
    const char *text = clmla_tuning_data_text("clblast");
    cJSON *list = text ? cJSON_Parse(text) : NULL;
    const int n = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : 0;
    builtin = n > 0 ? calloc((size_t)n, sizeof(*builtin)) : NULL;
    const cJSON *item = NULL;
    char why[512];
    if (builtin) {
        cJSON_ArrayForEach(item, list)
        {
            if (parse_entry(item, &builtin[builtin_count], why, sizeof(why)))
                builtin_count++;
        }
    }
    cJSON_Delete(list);
}

size_t clmla_xgemm_tuning_builtin(const clmla_xgemm_tuning **entries)
{
    pthread_once(&builtin_once, builtin_load);
    *entries = builtin;
    return builtin_count;
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
    cJSON *list = clmla_tuning_json_list(text, why, why_size);
    if (!list)
        return -1;
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
    if (clmla_path_absent(path))
        return 0;
    char *text = NULL, err[CLMLA_PATH_SIZE + 256];
    size_t length = 0;
    const clmla_status st =
        clmla_read_file(path, CLMLA_TUNING_FILE_MAX_BYTES, "a tuning file", &text, &length, err, sizeof(err));
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
    const clmla_xgemm_tuning *table = NULL;
    const size_t n = clmla_xgemm_tuning_builtin(&table);
    for (size_t i = 0; i < n; i++) {
        if (!same_device(&table[i], ctx) ||
            check_values(table[i].values, ctx->info.max_work_group_size, ctx->info.local_mem_bytes))
            continue;
        /* A CLBlast that refuses the built-in names just keeps its own values. */
        if (override(ctx, table[i].values) == CLBlastSuccess) {
            ctx->tuning = table[i];
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
