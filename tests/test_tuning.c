/* CLBlast tuning (include/clmla_tuning.h, "CLBlast tuning"): the 16 Xgemm parameter names, the kernel's
   constraints, saving entries to a tuning file, which file context creation applies and which it
   refuses, the default file path, and one small tune. Runs on whatever OpenCL device there is
   (PoCL in CI); every file lies in a temp folder of the test's own, removed at the end.

   CLBlast keeps the Xgemm values per device for the whole process (the last context created, or
   the last tune, wins), so every part that runs an SGEMM first creates the context whose values it
   checks. */
#include "check.h"
#include "checkpoint_writer.h"
#include "clmla.h"
#include "clmla_tuning.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <clblast_c.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static clmla_context *ctx;          /* the default device's, made by tu_run_parts */
static clmla_device_info device;    /* its vendor, name and limits */
static char base_dir[256];          /* mkdtemp: every file of the test lies under it */
static char empty_cache[320];       /* base_dir/cache: CLMLA_CACHE_DIR between parts, no tuning file */

/* The parameters in clmla_xgemm_parameter_name order. */
enum { GEMMK, KREG, KWG, KWI, MDIMA, MDIMC, MWG, NDIMB, NDIMC, NWG, SA, SB, STRM, STRN, VWM, VWN, NPARAMS };

static const char *const expected_names[NPARAMS] = {"GEMMK", "KREG",  "KWG",   "KWI", "MDIMA", "MDIMC",
                                                    "MWG",   "NDIMB", "NDIMC", "NWG", "SA",    "SB",
                                                    "STRM",  "STRN",  "VWM",   "VWN"};

/* Two value sets CLBlast 1.5's Xgemm takes on CPUs: 64x64 tiles of 8x8 work-items with 8-wide
   vectors and both tiles in local memory, and 32x32 tiles of 4x4 work-items from global memory. */
static const size_t good_a[NPARAMS] = {0, 1, 32, 2, 8, 8, 64, 8, 8, 64, 1, 1, 1, 1, 8, 8};
static const size_t good_b[NPARAMS] = {0, 1, 16, 2, 4, 4, 32, 4, 4, 32, 0, 0, 0, 0, 8, 8};

/* ---- environment ------------------------------------------------------------------------------ */

/* The variables the parts change, as the test found them (restored at the end). */
static const char *const saved_names[] = {"CLMLA_CLBLAST_TUNING", "CLMLA_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
static char *saved_values[4];

static void env_save(void)
{
    for (int i = 0; i < 4; i++) {
        const char *v = getenv(saved_names[i]);
        saved_values[i] = v ? strdup(v) : NULL;
    }
}

static void env_restore(void)
{
    for (int i = 0; i < 4; i++) {
        if (saved_values[i])
            setenv(saved_names[i], saved_values[i], 1);
        else
            unsetenv(saved_names[i]);
        free(saved_values[i]);
        saved_values[i] = NULL;
    }
}

/* What every part starts and ends with: no CLMLA_CLBLAST_TUNING, and a cache folder of the test's
   own that holds no tuning file, so a clblast-tuning.json in the user's cache never applies. */
static void env_reset(void)
{
    unsetenv("CLMLA_CLBLAST_TUNING");
    setenv("CLMLA_CACHE_DIR", empty_cache, 1);
    for (int i = 2; i < 4; i++) {
        if (saved_values[i])
            setenv(saved_names[i], saved_values[i], 1);
        else
            unsetenv(saved_names[i]);
    }
}

/* ---- files -------------------------------------------------------------------------------------- */

/* base_dir/NAME, created as a folder when dir is set. */
static void test_path(char *buf, size_t size, const char *name, int dir)
{
    snprintf(buf, size, "%s/%s", base_dir, name);
    if (dir)
        CHECK(mkdir(buf, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", buf, strerror(errno));
}

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    const size_t len = strlen(text);
    const int ok = fwrite(text, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* The whole file, NUL-terminated, or NULL. */
static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *text = NULL;
    size_t len = 0, cap = 0, got;
    do {
        if (len + 4097 > cap) {
            cap = cap ? 2 * cap : 8192;
            char *grown = realloc(text, cap);
            if (!grown) {
                free(text);
                fclose(f);
                return NULL;
            }
            text = grown;
        }
        got = fread(text + len, 1, cap - len - 1, f);
        len += got;
    } while (got > 0);
    fclose(f);
    text[len] = '\0';
    return text;
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Number of entries (other than . and ..) in a folder; -1 when it cannot be opened. */
static int folder_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* One entry of a hand-written tuning file (written with cJSON, not with the library's writer). */
typedef struct file_entry {
    const char *vendor, *device;
    const size_t *values;  /* [16] in clmla_xgemm_parameter_name order */
    const char *omit;      /* a parameter left out, or NULL */
    const char *raw_name;  /* a parameter written as the JSON text raw_json instead, or NULL */
    const char *raw_json;
} file_entry;

static int write_tuning_file(const char *path, const file_entry *entries, int n)
{
    cJSON *list = cJSON_CreateArray();
    for (int e = 0; e < n; e++) {
        cJSON *o = cJSON_CreateObject(), *p = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "kernel", "Xgemm");
        cJSON_AddNumberToObject(o, "precision", 32);
        cJSON_AddStringToObject(o, "vendor", entries[e].vendor);
        cJSON_AddStringToObject(o, "device", entries[e].device);
        for (int i = 0; i < NPARAMS; i++) {
            if (entries[e].omit && strcmp(entries[e].omit, expected_names[i]) == 0)
                continue;
            if (entries[e].raw_name && strcmp(entries[e].raw_name, expected_names[i]) == 0)
                cJSON_AddRawToObject(p, expected_names[i], entries[e].raw_json);
            else
                cJSON_AddNumberToObject(p, expected_names[i], (double)entries[e].values[i]);
        }
        cJSON_AddItemToObject(o, "parameters", p);
        cJSON_AddNumberToObject(o, "size", 1024);
        cJSON_AddNumberToObject(o, "gflops", 70.5);
        cJSON_AddNumberToObject(o, "default_gflops", 18.25);
        cJSON_AddItemToArray(list, o);
    }
    char *text = cJSON_Print(list);
    cJSON_Delete(list);
    const int rc = text ? write_text(path, text) : -1;
    free(text);
    CHECK(rc == 0, "writing %s", path);
    return rc;
}

/* ---- contexts and SGEMM --------------------------------------------------------------------------- */

/* A context on the default device, made with the environment as it is now. */
static clmla_context *create(clmla_status *status)
{
    static char not_null;
    clmla_context *c = (clmla_context *)(void *)&not_null; /* a failure must set it to NULL */
    *status = clmla_context_create(NULL, &c);
    if (*status != CLMLA_SUCCESS)
        CHECK(c == NULL, "a failed clmla_context_create left *ctx non-NULL");
    return *status == CLMLA_SUCCESS ? c : NULL;
}

static int same_values(const size_t *a, const size_t *b)
{
    return memcmp(a, b, NPARAMS * sizeof(size_t)) == 0;
}

static void values_text(const size_t *v, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < NPARAMS && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%s=%zu", i ? " " : "", expected_names[i], v[i]);
}

/* CLBlast runs its Xgemm kernel (the one the 16 values tune) only when m*n*k reaches
   XGEMM_MIN_INDIRECT_SIZE^3 (704^3 on CPUs); below that it runs XgemmDirect, which the values do
   not touch. The test lowers that threshold for its process, so that a small SGEMM runs the tuned
   kernel. */
static void force_xgemm(void)
{
    const char *name[1] = {"XGEMM_MIN_INDIRECT_SIZE"};
    const size_t value[1] = {1};
    const CLBlastStatusCode st =
        CLBlastOverrideParameters(device.device_id, "GemmRoutine", CLBlastPrecisionSingle, 1, name, value);
    CHECK(st == CLBlastSuccess, "CLBlastOverrideParameters GemmRoutine: %d", (int)st);
}

/* Row-major C[m, n] = A[m, k] B[k, n] with CLBlast on c's queue; integer inputs in [-3, 3], so
   every float sum is exact and the result must equal the host product bit for bit. */
static void check_sgemm(clmla_context *c, size_t m, size_t n, size_t k, const char *what)
{
    float *a = malloc(m * k * sizeof(float)); /* [m, k] */
    float *b = malloc(k * n * sizeof(float)); /* [k, n] */
    float *got = malloc(m * n * sizeof(float)); /* [m, n] */
    cl_mem da = NULL, db = NULL, dc = NULL;
    if (!a || !b || !got) {
        CHECK(0, "%s: out of host memory", what);
        goto done;
    }
    for (size_t i = 0; i < m * k; i++)
        a[i] = (float)((int)((i * 7919 + 13) % 7) - 3);
    for (size_t i = 0; i < k * n; i++)
        b[i] = (float)((int)((i * 104729 + 5) % 7) - 3);
    for (size_t i = 0; i < m * n; i++)
        got[i] = 12345.0f; /* beta = 0 must overwrite it */
    cl_int err = CL_SUCCESS;
    cl_context cl = clmla_context_cl_context(c);
    cl_command_queue q = clmla_context_queue(c);
    da = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, m * k * sizeof(float), a, &err);
    db = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, k * n * sizeof(float), b, &err);
    dc = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, m * n * sizeof(float), got, &err);
    if (!da || !db || !dc) {
        CHECK(0, "%s: clCreateBuffer: %d", what, err);
        goto done;
    }
    const CLBlastStatusCode st = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, m, n, k,
                                              1.0f, da, 0, k, db, 0, n, 0.0f, dc, 0, n, &q, NULL);
    CHECK(st == CLBlastSuccess, "%s: CLBlastSgemm %zux%zux%zu: %s", what, m, n, k, clmla_status_string(st));
    if (st != CLBlastSuccess)
        goto done;
    err = clEnqueueReadBuffer(q, dc, CL_TRUE, 0, m * n * sizeof(float), got, 0, NULL, NULL);
    CHECK(err == CL_SUCCESS, "%s: read C: %d", what, err);
    size_t wrong = 0, first = 0;
    float first_want = 0;
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) {
            long want = 0;
            for (size_t p = 0; p < k; p++)
                want += (long)a[i * k + p] * (long)b[p * n + j];
            if (got[i * n + j] != (float)want && wrong++ == 0) {
                first = i * n + j;
                first_want = (float)want;
            }
        }
    CHECK(wrong == 0, "%s: %zu of %zu elements differ from the host product, first [%zu, %zu]: %g, want %g", what,
          wrong, m * n, first / n, first % n, (double)got[first], (double)first_want);
done:
    if (da)
        clReleaseMemObject(da);
    if (db)
        clReleaseMemObject(db);
    if (dc)
        clReleaseMemObject(dc);
    free(a);
    free(b);
    free(got);
}

/* ---- 1. parameter names ------------------------------------------------------------------------ */

static void test_names(void)
{
    for (int i = 0; i < NPARAMS; i++) {
        const char *name = clmla_xgemm_parameter_name(i);
        CHECK(name && strcmp(name, expected_names[i]) == 0, "parameter %d: '%s', want '%s'", i, name ? name : "(null)",
              expected_names[i]);
    }
    CHECK(CLMLA_XGEMM_PARAMETERS == NPARAMS, "CLMLA_XGEMM_PARAMETERS %d", CLMLA_XGEMM_PARAMETERS);
    const int outside[] = {-1, NPARAMS, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof(outside) / sizeof(outside[0]); i++)
        CHECK(clmla_xgemm_parameter_name(outside[i]) == NULL, "parameter %d: '%s', want NULL", outside[i],
              clmla_xgemm_parameter_name(outside[i]));
}

/* ---- 2. validity --------------------------------------------------------------------------------- */

/* The values with one changed (param < 0: none) must be refused, with a reason. */
static void expect_invalid(const size_t *base, int param, size_t value, const char *what)
{
    size_t v[NPARAMS];
    memcpy(v, base, sizeof(v));
    if (param >= 0)
        v[param] = value;
    const char *why = NULL;
    const int valid = clmla_xgemm_values_check(ctx, v, &why) == CLMLA_SUCCESS;
    char text[400];
    values_text(v, text, sizeof(text));
    CHECK(!valid, "%s: accepted %s", what, text);
    CHECK(!valid && why && why[0], "%s: no reason given", what);
    if (!valid && why)
        printf("  refused (%s): %s\n", what, why);
    CHECK((clmla_xgemm_values_check(ctx, v, NULL) == CLMLA_SUCCESS) == valid, "%s: a NULL why changed the answer", what);
    if (!valid)
        CHECK(strstr(clmla_last_error(NULL), why) != NULL, "%s: the message '%s' does not give the reason", what,
              clmla_last_error(NULL));
}

static void expect_valid(const size_t *v, const char *what)
{
    const char *why = NULL;
    char text[400];
    values_text(v, text, sizeof(text));
    CHECK(clmla_xgemm_values_check(ctx, v, &why) == CLMLA_SUCCESS, "%s: %s refused: %s", what, text, why ? why : "(no reason)");
}

static void test_valid(void)
{
    expect_valid(good_a, "known-good set A");
    expect_valid(good_b, "known-good set B");
    CHECK(clmla_xgemm_values_check(ctx, good_a, NULL) == CLMLA_SUCCESS, "known-good set A with a NULL why");
    /* The constraints are divisibility, not powers of two: CLBlast 1.5 computes this set's SGEMM
       exactly (MWG 192 = 3 * MDIMC * VWM, NWG 96 = 3 * NDIMC * VWN, KWG 24 = 8 * KWI 3). */
    const size_t not_pow2[NPARAMS] = {0, 1, 24, 3, 8, 8, 192, 8, 8, 96, 1, 1, 1, 1, 8, 4};
    expect_valid(not_pow2, "tiles that are not powers of two");

    /* Each constraint broken alone: the rest of the set still satisfies every other one. */
    expect_invalid(good_a, KREG, 2, "KREG 2 (must be 1 with GEMMK 0)");
    expect_invalid(good_a, VWM, 3, "VWM 3");
    expect_invalid(good_a, VWN, 3, "VWN 3");
    expect_invalid(good_a, VWM, 16, "VWM 16 (widths are 1, 2, 4, 8)");
    expect_invalid(good_a, SA, 2, "SA 2");
    expect_invalid(good_a, SB, 2, "SB 2");
    expect_invalid(good_a, STRM, 2, "STRM 2");
    expect_invalid(good_a, STRN, 2, "STRN 2");
    expect_invalid(good_a, KWI, 64, "KWG 32 % KWI 64");
    expect_invalid(good_a, MWG, 48, "MWG 48 % (MDIMC * VWM = 64)");
    expect_invalid(good_a, NWG, 32, "NWG 32 % (NDIMC * VWN = 64)");
    expect_invalid(good_a, MDIMA, 16, "MWG 64 % (MDIMA * VWM = 128)");
    expect_invalid(good_a, NDIMB, 16, "NWG 64 % (NDIMB * VWN = 128)");
    expect_invalid(good_a, MDIMA, 1, "KWG 32 % (MDIMC * NDIMC / MDIMA = 64)");
    expect_invalid(good_a, NDIMB, 1, "KWG 32 % (MDIMC * NDIMC / NDIMB = 64)");

    /* MDIMC * NDIMC = 64 is not a multiple of MDIMA = 128 (so 64 / MDIMA is 0: no division by it). */
    size_t v[NPARAMS];
    memcpy(v, good_a, sizeof(v));
    v[VWM] = 1;
    v[MWG] = 128;
    expect_valid(v, "MDIMA control (VWM 1, MWG 128)");
    expect_invalid(v, MDIMA, 128, "MDIMC * NDIMC 64 % MDIMA 128");
    memcpy(v, good_a, sizeof(v));
    v[VWN] = 1;
    v[NWG] = 128;
    expect_valid(v, "NDIMB control (VWN 1, NWG 128)");
    expect_invalid(v, NDIMB, 128, "MDIMC * NDIMC 64 % NDIMB 128");

    /* Work-groups of d x d items, d the smallest power of two over the device's limit. */
    size_t d = 2;
    while (d * d <= device.max_work_group_size && d <= 1024)
        d *= 2;
    const size_t square[NPARAMS] = {0, 1, 8, 2, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 1, 1};
    memcpy(v, square, sizeof(v));
    if (64 <= device.max_work_group_size)
        expect_valid(v, "8 x 8 work-items control");
    if (d <= 1024) {
        v[KWG] = v[MWG] = v[NWG] = v[MDIMC] = v[NDIMC] = v[MDIMA] = v[NDIMB] = d;
        char what[128];
        snprintf(what, sizeof(what), "MDIMC * NDIMC = %zu x %zu > max work-group size %zu", d, d,
                 device.max_work_group_size);
        expect_invalid(v, -1, 0, what);
    } else {
        printf("  skipped: the work-group limit (%zu) admits every tile of up to 1024 x 1024 items\n",
               device.max_work_group_size);
    }

    /* Both tiles in local memory, KWG = MWG = NWG = L, 2 L^2 floats over the device's local memory. */
    size_t l = 64;
    while ((uint64_t)(2 * l * l * sizeof(float)) <= device.local_mem_bytes && l <= 1024)
        l *= 2;
    if (l <= 1024) {
        memcpy(v, good_a, sizeof(v));
        v[KWG] = v[MWG] = v[NWG] = l;
        v[SA] = v[SB] = 0;
        expect_valid(v, "large tiles in global memory (control)");
        v[SA] = v[SB] = 1;
        char what[160];
        snprintf(what, sizeof(what), "SA = SB = 1 with KWG = MWG = NWG = %zu: %zu bytes of local memory > %llu", l,
                 2 * l * l * sizeof(float), (unsigned long long)device.local_mem_bytes);
        expect_invalid(v, -1, 0, what);
    } else {
        printf("  skipped: local memory (%llu bytes) holds tiles of 1024 x 1024\n",
               (unsigned long long)device.local_mem_bytes);
    }

    /* Sizes whose byte count overflows size_t: (SA*KWG*MWG + SB*KWG*NWG) * 4 wraps to 0. */
    memcpy(v, good_a, sizeof(v));
    v[MWG] = v[NWG] = (size_t)1 << 62;
    expect_invalid(v, -1, 0, "MWG = NWG = 2^62 with SA = SB = 1 (local memory overflows)");
    memcpy(v, good_a, sizeof(v));
    v[KWG] = (size_t)1 << 62;
    expect_invalid(v, -1, 0, "KWG = 2^62 with SA = SB = 1 (local memory overflows)");
    expect_invalid(good_a, MWG, SIZE_MAX, "MWG SIZE_MAX");

    /* Zeros, divisors of the constraints included: refused, not a division by zero. */
    const int divisors[] = {KWG, KWI, MDIMA, MDIMC, MWG, NDIMB, NDIMC, NWG, VWM, VWN};
    for (size_t i = 0; i < sizeof(divisors) / sizeof(divisors[0]); i++) {
        char what[64];
        snprintf(what, sizeof(what), "%s 0", expected_names[divisors[i]]);
        expect_invalid(good_a, divisors[i], 0, what);
    }
    const size_t zeros[NPARAMS] = {0};
    expect_invalid(zeros, -1, 0, "all zero");

    /* NULL arguments: not valid, no crash. */
    const char *why = NULL;
    CHECK_STATUS(clmla_xgemm_values_check(NULL, good_a, &why), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_xgemm_values_check(ctx, NULL, &why), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
}

/* ---- 3. saving ------------------------------------------------------------------------------------ */

static const cJSON *find_entry(const cJSON *list, const char *vendor, const char *name)
{
    const cJSON *item = NULL;
    cJSON_ArrayForEach(item, list)
    {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(item, "vendor");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(item, "device");
        if (cJSON_IsString(v) && cJSON_IsString(d) && strcmp(v->valuestring, vendor) == 0 &&
            strcmp(d->valuestring, name) == 0)
            return item;
    }
    return NULL;
}

/* A saved entry: the format's fields, the 16 parameters and nothing else in "parameters". */
static void check_saved_entry(const cJSON *o, const clmla_xgemm_tuning *t)
{
    CHECK(o != NULL, "no entry for '%s' / '%s' in the file", t->vendor, t->device);
    if (!o)
        return;
    const cJSON *kernel = cJSON_GetObjectItemCaseSensitive(o, "kernel");
    const cJSON *precision = cJSON_GetObjectItemCaseSensitive(o, "precision");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(o, "size");
    const cJSON *gflops = cJSON_GetObjectItemCaseSensitive(o, "gflops");
    const cJSON *dflops = cJSON_GetObjectItemCaseSensitive(o, "default_gflops");
    CHECK(cJSON_IsString(kernel) && strcmp(kernel->valuestring, "Xgemm") == 0, "'%s': \"kernel\" is not \"Xgemm\"",
          t->device);
    CHECK(cJSON_IsNumber(precision) && precision->valuedouble == 32, "'%s': \"precision\" is not 32", t->device);
    CHECK(cJSON_IsObject(params) && cJSON_GetArraySize(params) == NPARAMS,
          "'%s': \"parameters\" is not an object of 16 members", t->device);
    for (int i = 0; i < NPARAMS && cJSON_IsObject(params); i++) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(params, expected_names[i]);
        CHECK(cJSON_IsNumber(p) && p->valuedouble == (double)t->values[i], "'%s': %s is %g, want %zu", t->device,
              expected_names[i], cJSON_IsNumber(p) ? p->valuedouble : -1.0, t->values[i]);
    }
    if (t->size > 0)
        CHECK(cJSON_IsNumber(size) && size->valuedouble == t->size, "'%s': \"size\" is not %d", t->device, t->size);
    if (t->gflops > 0)
        CHECK(cJSON_IsNumber(gflops) && fabs(gflops->valuedouble - t->gflops) <= 0.1,
              "'%s': \"gflops\" is not %g", t->device, t->gflops);
    if (t->default_gflops > 0)
        CHECK(cJSON_IsNumber(dflops) && fabs(dflops->valuedouble - t->default_gflops) <= 0.1,
              "'%s': \"default_gflops\" is not %g", t->device, t->default_gflops);
}

/* Saving over a file that is not a tuning file: refused, and the file keeps its bytes. */
static void expect_save_refused(const char *dir, const char *name, const char *contents, const clmla_xgemm_tuning *t)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    CHECK(write_text(path, contents) == 0, "writing %s", path);
    CHECK_STATUS(clmla_xgemm_tuning_save(path, t), CLMLA_ERROR_INVALID_FILE, NULL);
    CHECK(clmla_last_error(NULL)[0] != '\0', "saving over %s: no message", name);
    char *after = read_text(path);
    CHECK(after && strcmp(after, contents) == 0, "saving over %s changed it to: %s", name, after ? after : "(gone)");
    free(after);
}

static void test_save(void)
{
    char dir[320], path[512];
    test_path(dir, sizeof(dir), "save", 1);
    snprintf(path, sizeof(path), "%s/clblast-tuning.json", dir);

    clmla_xgemm_tuning a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    snprintf(a.vendor, sizeof(a.vendor), "V1");
    snprintf(a.device, sizeof(a.device), "D1");
    memcpy(a.values, good_a, sizeof(a.values));
    a.size = 512;
    a.gflops = 70.5;
    a.default_gflops = 18.25;
    snprintf(b.vendor, sizeof(b.vendor), "V2");
    snprintf(b.device, sizeof(b.device), "D2 \"quoted\" \\ name"); /* JSON escapes survive */
    memcpy(b.values, good_a, sizeof(b.values));

    CHECK_STATUS(clmla_xgemm_tuning_save(path, &a), CLMLA_SUCCESS, NULL);
    CHECK_STATUS(clmla_xgemm_tuning_save(path, &b), CLMLA_SUCCESS, NULL);
    clmla_xgemm_tuning a2 = a; /* the same vendor and device, new values */
    memcpy(a2.values, good_b, sizeof(a2.values));
    a2.size = 1024;
    a2.gflops = 81.5;
    a2.default_gflops = 20.5;
    CHECK_STATUS(clmla_xgemm_tuning_save(path, &a2), CLMLA_SUCCESS, NULL);

    char *text = read_text(path);
    cJSON *list = text ? cJSON_Parse(text) : NULL;
    CHECK(cJSON_IsArray(list), "%s is not a JSON array: %s", path, text ? text : "(unreadable)");
    if (cJSON_IsArray(list)) {
        CHECK(cJSON_GetArraySize(list) == 2, "%d entries, want 2 (A replaced, B kept): %s", cJSON_GetArraySize(list),
              text);
        check_saved_entry(find_entry(list, "V1", "D1"), &a2);
        check_saved_entry(find_entry(list, "V2", b.device), &b);
    }
    cJSON_Delete(list);
    free(text);
    CHECK(folder_entries(dir) == 1, "%d files in %s after saving, want only the tuning file", folder_entries(dir), dir);

    /* Files that are not a JSON array of entries: left as they were. */
    expect_save_refused(dir, "garbage.json", "{not json", &a);
    expect_save_refused(dir, "object.json", "{\"kernel\": \"Xgemm\"}\n", &a);

    /* A folder that does not exist: an error, and nothing created. */
    char missing[512], missing_file[600];
    snprintf(missing, sizeof(missing), "%s/no-such-folder", dir);
    snprintf(missing_file, sizeof(missing_file), "%s/clblast-tuning.json", missing);
    const clmla_status st = clmla_xgemm_tuning_save(missing_file, &a);
    CHECK(st != CLMLA_SUCCESS, "saving into a missing folder succeeded");
    CHECK(st == CLMLA_ERROR_IO, "saving into a missing folder: %s (%d), expected CLMLA_ERROR_IO: %s",
          clmla_status_string(st), st, clmla_last_error(NULL));
    CHECK(!file_exists(missing), "saving into a missing folder created %s", missing);
    CHECK(folder_entries(dir) == 3, "%d files in %s, want 3 (no temporary left behind)", folder_entries(dir), dir);

    /* A folder as the path, and NULL or empty arguments: errors, no crash. */
    CHECK(clmla_xgemm_tuning_save(dir, &a) != CLMLA_SUCCESS, "saving to a folder's path succeeded");
    CHECK_STATUS(clmla_xgemm_tuning_save(NULL, &a), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_xgemm_tuning_save("", &a), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_xgemm_tuning_save(path, NULL), CLMLA_ERROR_INVALID_ARGUMENT, NULL);

    /* Not asserted (the header does not say): an array whose items are not entries. */
    char odd[512];
    snprintf(odd, sizeof(odd), "%s/odd.json", dir);
    write_text(odd, "[1, \"two\"]");
    const clmla_status odd_st = clmla_xgemm_tuning_save(odd, &a);
    char *odd_text = read_text(odd);
    printf("  note: saving into [1, \"two\"] gives %s; the file is then %zu bytes\n", clmla_status_string(odd_st),
           odd_text ? strlen(odd_text) : 0);
    free(odd_text);
}

/* ---- 4. applied at context creation ------------------------------------------------------------ */

/* Creates a context with CLMLA_CLBLAST_TUNING = path; checks it applied the values from that file. */
static clmla_context *expect_applied(const char *path, const size_t *values, const char *what)
{
    clmla_status st;
    clmla_context *c = create(&st);
    CHECK(c != NULL, "%s: clmla_context_create: %s: %s", what, clmla_status_string(st), clmla_last_error(NULL));
    if (!c)
        return NULL;
    clmla_xgemm_tuning t;
    memset(&t, 0, sizeof(t));
    const char *source = NULL;
    CHECK_STATUS(clmla_context_xgemm_tuning(c, &t, &source), CLMLA_SUCCESS, c);
    CHECK(source && strstr(source, path), "%s: source '%s' does not name %s", what, source ? source : "(null)", path);
    CHECK(same_values(t.values, values), "%s: the context applied other values", what);
    CHECK(strcmp(t.vendor, device.vendor) == 0 && strcmp(t.device, device.name) == 0,
          "%s: entry for '%s' / '%s', the device is '%s' / '%s'", what, t.vendor, t.device, device.vendor, device.name);
    CHECK(t.size == 1024 && t.gflops == 70.5 && t.default_gflops == 18.25,
          "%s: size %d gflops %g default_gflops %g, the file says 1024, 70.5, 18.25", what, t.size, t.gflops,
          t.default_gflops);
    return c;
}

/* Creates a context; checks no entry of the file applied (the built-in table may have one). */
static void expect_not_from_file(const char *path, const char *what)
{
    clmla_status st;
    clmla_context *c = create(&st);
    CHECK(c != NULL, "%s: clmla_context_create: %s: %s", what, clmla_status_string(st), clmla_last_error(NULL));
    if (!c)
        return;
    clmla_xgemm_tuning t;
    const char *source = NULL;
    st = clmla_context_xgemm_tuning(c, &t, &source);
    CHECK(source != NULL, "%s: no source", what);
    if (source) {
        CHECK((st == CLMLA_SUCCESS && strcmp(source, "built-in table") == 0) ||
                  (st == CLMLA_ERROR_UNSUPPORTED && strcmp(source, "none") == 0),
              "%s: %s with source '%s', want the built-in table or none", what, clmla_status_string(st), source);
        CHECK(!strstr(source, path), "%s: source '%s' names the file", what, source);
        printf("  %s: source '%s'\n", what, source);
    }
    if (st == CLMLA_SUCCESS)
        CHECK(clmla_xgemm_values_check(c, t.values, NULL) == CLMLA_SUCCESS, "%s: the built-in entry is not valid here", what);
    clmla_context_destroy(c);
}

/* Creates a context; checks it applies no CLBlast tuning at all (status unsupported, source "none"). */
static void expect_no_tuning(const char *what)
{
    clmla_status st;
    clmla_context *c = create(&st);
    CHECK(c != NULL, "%s: %s: %s", what, clmla_status_string(st), clmla_last_error(NULL));
    if (c) {
        clmla_xgemm_tuning t;
        const char *source = NULL;
        CHECK_STATUS(clmla_context_xgemm_tuning(c, &t, &source), CLMLA_ERROR_UNSUPPORTED, c);
        CHECK(source && strcmp(source, "none") == 0, "%s: source '%s', want 'none'", what, source ? source : "(null)");
    }
    clmla_context_destroy(c);
}

/* A part's folder NAME with tuning.json (*path) and a cache folder (*cache) whose tuning file
   would be *cache_file. */
static void part_files(const char *name, char path[512], char cache[512], char cache_file[600])
{
    char dir[320];
    test_path(dir, sizeof(dir), name, 1);
    snprintf(path, 512, "%s/tuning.json", dir);
    snprintf(cache, 512, "%s/cache", dir);
    snprintf(cache_file, 600, "%s/clblast-tuning.json", cache);
    CHECK(mkdir(cache, 0700) == 0, "mkdir %s", cache);
}

static void test_applied(void)
{
    char path[512], cache[512], cache_file[600];
    part_files("applied", path, cache, cache_file);

    /* 1. The file CLMLA_CLBLAST_TUNING names, with an entry for this device among others. */
    const file_entry entries_a[] = {{"Other vendor", "Other device", good_b, NULL, NULL, NULL},
                                    {device.vendor, device.name, good_a, NULL, NULL, NULL}};
    write_tuning_file(path, entries_a, 2);
    setenv("CLMLA_CLBLAST_TUNING", path, 1);
    clmla_context *c = expect_applied(path, good_a, "set A from CLMLA_CLBLAST_TUNING");
    if (c) {
        force_xgemm();
        check_sgemm(c, 96, 80, 64, "SGEMM with set A");
        /* _from_queue applies the file too. */
        clmla_context *wrapped = NULL;
        CHECK_STATUS(clmla_context_create_from_queue(clmla_context_queue(c), &wrapped), CLMLA_SUCCESS, NULL);
        if (wrapped) {
            clmla_xgemm_tuning t;
            const char *source = NULL;
            CHECK_STATUS(clmla_context_xgemm_tuning(wrapped, &t, &source), CLMLA_SUCCESS, wrapped);
            CHECK(source && strstr(source, path) && same_values(t.values, good_a),
                  "_from_queue: source '%s', set A %s", source ? source : "(null)",
                  same_values(t.values, good_a) ? "applied" : "not applied");
        }
        clmla_context_destroy(wrapped);
    }
    clmla_context_destroy(c);

    /* The other known-good set runs too. */
    const file_entry entries_b[] = {{device.vendor, device.name, good_b, NULL, NULL, NULL}};
    write_tuning_file(path, entries_b, 1);
    c = expect_applied(path, good_b, "set B from CLMLA_CLBLAST_TUNING");
    if (c) {
        force_xgemm();
        check_sgemm(c, 96, 80, 64, "SGEMM with set B");
    }
    clmla_context_destroy(c);

    /* 2. Nothing at all when CLMLA_CLBLAST_TUNING is unset (the override is opt-in: CLBlast's
       parameters are the process's), even with a file in the cache folder ... */
    write_tuning_file(cache_file, entries_b, 1);
    unsetenv("CLMLA_CLBLAST_TUNING");
    setenv("CLMLA_CACHE_DIR", cache, 1);
    expect_no_tuning("unset");
    /* ... <cache dir>/clblast-tuning.json with "auto" (what the clmla commands ask for) ... */
    setenv("CLMLA_CLBLAST_TUNING", "auto", 1);
    c = expect_applied(cache_file, good_b, "set B from the cache folder");
    clmla_context_destroy(c);
    /* ... and CLMLA_CLBLAST_TUNING wins over it. */
    write_tuning_file(path, entries_a, 2);
    setenv("CLMLA_CLBLAST_TUNING", path, 1);
    c = expect_applied(path, good_a, "CLMLA_CLBLAST_TUNING over the cache folder");
    clmla_context_destroy(c);

    /* Entries for other devices only (same vendor other name, same name other vendor): none applies. */
    const file_entry others[] = {{"Other vendor", "Other device", good_b, NULL, NULL, NULL},
                                 {device.vendor, "another device of this vendor", good_b, NULL, NULL, NULL},
                                 {"another vendor", device.name, good_b, NULL, NULL, NULL}};
    write_tuning_file(path, others, 3);
    setenv("CLMLA_CACHE_DIR", empty_cache, 1);
    expect_not_from_file(path, "entries for other devices only");

    clmla_xgemm_tuning t;
    const char *source = NULL;
    CHECK_STATUS(clmla_context_xgemm_tuning(NULL, &t, &source), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    env_reset();
}

/* ---- 5. refused files ----------------------------------------------------------------------------- */

/* Context creation must fail with CLMLA_ERROR_INVALID_FILE, the message holding every word given. */
static void expect_refused(const char *what, const char *word1, const char *word2, const char *word3)
{
    clmla_status st;
    clmla_context *c = create(&st);
    CHECK(st == CLMLA_ERROR_INVALID_FILE, "%s: clmla_context_create gave %s, want CLMLA_ERROR_INVALID_FILE", what,
          clmla_status_string(st));
    clmla_context_destroy(c);
    if (st == CLMLA_SUCCESS)
        return;
    const char *msg = clmla_last_error(NULL);
    const char *words[3] = {word1, word2, word3};
    for (int i = 0; i < 3; i++)
        if (words[i])
            CHECK(strstr(msg, words[i]) != NULL, "%s: the message does not name '%s': %s", what, words[i], msg);
    printf("  refused (%s): %s\n", what, msg);
}

static void test_refused(void)
{
    char path[512], cache[512], cache_file[600];
    part_files("refused", path, cache, cache_file);
    setenv("CLMLA_CLBLAST_TUNING", path, 1);

    write_text(path, "{not json");
    expect_refused("malformed JSON", path, NULL, NULL);
    write_text(path, "{\"kernel\": \"Xgemm\", \"precision\": 32}");
    expect_refused("an object, not an array", path, NULL, NULL);

    size_t v[NPARAMS];
    memcpy(v, good_a, sizeof(v));
    v[VWM] = 3;
    const file_entry vwm3[] = {{device.vendor, device.name, v, NULL, NULL, NULL}};
    write_tuning_file(path, vwm3, 1);
    expect_refused("VWM 3", path, device.name, "VWM");

    memcpy(v, good_a, sizeof(v));
    v[MWG] = 48;
    const file_entry mwg48[] = {{device.vendor, device.name, v, NULL, NULL, NULL}};
    write_tuning_file(path, mwg48, 1);
    expect_refused("MWG 48", path, device.name, "MWG");

    const file_entry missing[] = {{device.vendor, device.name, good_a, "STRN", NULL, NULL}};
    write_tuning_file(path, missing, 1);
    expect_refused("STRN missing", path, "STRN", NULL);

    const file_entry text_value[] = {{device.vendor, device.name, good_a, NULL, "KWG", "\"32\""}};
    write_tuning_file(path, text_value, 1);
    expect_refused("KWG as a string", path, "KWG", NULL);

    const file_entry negative[] = {{device.vendor, device.name, good_a, NULL, "VWN", "-8"}};
    write_tuning_file(path, negative, 1);
    expect_refused("VWN -8", path, "VWN", NULL);

    /* The cache folder's file with CLMLA_CLBLAST_TUNING=auto: refused the same way ... */
    write_text(cache_file, "{not json");
    setenv("CLMLA_CLBLAST_TUNING", "auto", 1);
    setenv("CLMLA_CACHE_DIR", cache, 1);
    expect_refused("malformed file in the cache folder", cache_file, NULL, NULL);

    /* ... and "off" applies nothing at all, not even from the cache folder. */
    setenv("CLMLA_CLBLAST_TUNING", "off", 1);
    expect_no_tuning("CLMLA_CLBLAST_TUNING=off");

    /* CLMLA_CLBLAST_TUNING naming a file that does not exist: it holds no entry, and the cache
       folder's file is not read instead (even with set B for this device in it). */
    char absent[600];
    snprintf(absent, sizeof(absent), "%s/does-not-exist.json", cache);
    setenv("CLMLA_CLBLAST_TUNING", absent, 1);
    for (int with_cache = 0; with_cache < 2; with_cache++) {
        if (with_cache) {
            const file_entry entries_b[] = {{device.vendor, device.name, good_b, NULL, NULL, NULL}};
            write_tuning_file(cache_file, entries_b, 1);
            setenv("CLMLA_CACHE_DIR", cache, 1);
        } else {
            setenv("CLMLA_CACHE_DIR", empty_cache, 1);
        }
        clmla_status st;
        clmla_context *c = create(&st);
        CHECK(c != NULL, "a missing CLMLA_CLBLAST_TUNING file%s: %s", with_cache ? " (cache file present)" : "",
              clmla_last_error(NULL));
        if (!c)
            continue;
        const char *source = "(none)";
        clmla_xgemm_tuning t;
        memset(&t, 0, sizeof(t));
        const clmla_status tst = clmla_context_xgemm_tuning(c, &t, &source);
        CHECK(strcmp(source, "built-in table") == 0 || strcmp(source, "none") == 0,
              "a missing CLMLA_CLBLAST_TUNING file%s: source '%s', want the built-in table or none",
              with_cache ? " (cache file present)" : "", source);
        CHECK(tst != CLMLA_SUCCESS || !same_values(t.values, good_b),
              "a missing CLMLA_CLBLAST_TUNING file: the cache folder's entry was applied instead");
        clmla_context_destroy(c);
    }
    env_reset();
}

/* ---- 6. the default path ------------------------------------------------------------------------ */

static void expect_path(const char *want, const char *what)
{
    char buf[4096];
    memset(buf, 'x', sizeof(buf));
    CHECK_STATUS(clmla_xgemm_tuning_path(buf, sizeof(buf)), CLMLA_SUCCESS, NULL);
    CHECK(memchr(buf, '\0', sizeof(buf)) && strcmp(buf, want) == 0, "%s: '%.200s', want '%s'", what, buf, want);
}

static void test_default_path(void)
{
    setenv("CLMLA_CLBLAST_TUNING", "/some/file", 1);
    setenv("CLMLA_CACHE_DIR", "/tmp/x", 1);
    expect_path("/some/file", "CLMLA_CLBLAST_TUNING set");
    unsetenv("CLMLA_CLBLAST_TUNING");
    expect_path("/tmp/x/clblast-tuning.json", "CLMLA_CACHE_DIR=/tmp/x");
    setenv("CLMLA_CLBLAST_TUNING", "auto", 1);
    expect_path("/tmp/x/clblast-tuning.json", "CLMLA_CLBLAST_TUNING=auto, CLMLA_CACHE_DIR=/tmp/x");
    unsetenv("CLMLA_CLBLAST_TUNING");
    setenv("CLMLA_CACHE_DIR", "off", 1);
    expect_path("", "CLMLA_CACHE_DIR=off");
    setenv("HOME", "/tmp/home", 1);
    setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
    expect_path("", "CLMLA_CACHE_DIR=off with HOME and XDG_CACHE_HOME set");

    /* The default cache folder (README): $XDG_CACHE_HOME/clmla, else ~/.cache/clmla. */
    unsetenv("CLMLA_CACHE_DIR");
    expect_path("/tmp/xdg/clmla/clblast-tuning.json", "XDG_CACHE_HOME=/tmp/xdg");
    unsetenv("XDG_CACHE_HOME");
    expect_path("/tmp/home/.cache/clmla/clblast-tuning.json", "HOME=/tmp/home");

    /* A short buffer is refused and holds ""; size 0 or NULL writes nothing. */
    setenv("CLMLA_CLBLAST_TUNING", "/some/file", 1);
    char small[8];
    memset(small, 'x', sizeof(small));
    CHECK_STATUS(clmla_xgemm_tuning_path(small, sizeof(small)), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK(small[0] == '\0', "8-byte buffer: '%.8s'", small);
    small[0] = 'x';
    CHECK_STATUS(clmla_xgemm_tuning_path(small, 0), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK(small[0] == 'x', "a 0-byte buffer was written");
    CHECK_STATUS(clmla_xgemm_tuning_path(NULL, 16), CLMLA_ERROR_INVALID_ARGUMENT, NULL);

    /* Not asserted (the header does not say): "off" with a cache folder. */
    setenv("CLMLA_CLBLAST_TUNING", "off", 1);
    setenv("CLMLA_CACHE_DIR", "/tmp/x", 1);
    char buf[4096];
    clmla_xgemm_tuning_path(buf, sizeof(buf));
    printf("  note: CLMLA_CLBLAST_TUNING=off, CLMLA_CACHE_DIR=/tmp/x: path '%s'\n", buf);
    env_reset();
}

/* ---- 7. a small tune ---------------------------------------------------------------------------- */

typedef struct progress_log {
    int calls, bad_index, last_index, total;
    size_t values[8][NPARAMS];
    int has_values[8];
    double gflops[8];
} progress_log;

static void on_progress(void *user, int index, int total, const size_t *values, double gflops, const char *note)
{
    progress_log *log = user;
    char text[400] = "CLBlast's own";
    if (values)
        values_text(values, text, sizeof(text));
    printf("  tune %d/%d: %.2f GFLOP/s  %s%s%s\n", index, total, gflops, text, note && note[0] ? "  " : "",
           note ? note : "");
    if (index < 0 || index >= total || index <= log->last_index || (log->calls && total != log->total))
        log->bad_index++;
    log->last_index = index;
    log->total = total;
    if (log->calls < 8) {
        log->has_values[log->calls] = values != NULL;
        if (values)
            memcpy(log->values[log->calls], values, sizeof(log->values[0]));
        log->gflops[log->calls] = gflops;
    }
    log->calls++;
}

static void test_tune(void)
{
    char cache[320], cache_file[400];
    test_path(cache, sizeof(cache), "tune", 1);
    snprintf(cache_file, sizeof(cache_file), "%s/clblast-tuning.json", cache);
    unsetenv("CLMLA_CLBLAST_TUNING");
    setenv("CLMLA_CACHE_DIR", cache, 1);
    clmla_status st;
    clmla_context *c = create(&st);
    CHECK(c != NULL, "clmla_context_create: %s: %s", clmla_status_string(st), clmla_last_error(NULL));
    if (!c) {
        env_reset();
        return;
    }
    force_xgemm();

    /* Bad arguments: refused before anything runs, *best and the context's entry unchanged. */
    clmla_xgemm_tuning before, after, best;
    const char *source_before = NULL, *source_after = NULL;
    memset(&before, 0, sizeof(before));
    memset(&after, 0, sizeof(after));
    const clmla_status had = clmla_context_xgemm_tuning(c, &before, &source_before);
    char source_copy[600];
    snprintf(source_copy, sizeof(source_copy), "%s", source_before ? source_before : "");
    clmla_tune_options bad;
    memset(&bad, 0, sizeof(bad));
    bad.size = 128;
    bad.max_candidates = 2;
    memset(&best, 0x5a, sizeof(best));
    clmla_xgemm_tuning sentinel = best;
    CHECK_STATUS(clmla_tune_xgemm(NULL, &bad, &best), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_tune_xgemm(c, &bad, NULL), CLMLA_ERROR_INVALID_ARGUMENT, c);
    bad.size = -1;
    CHECK_STATUS(clmla_tune_xgemm(c, &bad, &best), CLMLA_ERROR_INVALID_ARGUMENT, c);
    bad.size = 128;
    bad.max_candidates = -1;
    CHECK_STATUS(clmla_tune_xgemm(c, &bad, &best), CLMLA_ERROR_INVALID_ARGUMENT, c);
    bad.max_candidates = 2;
    bad.max_seconds = -1;
    CHECK_STATUS(clmla_tune_xgemm(c, &bad, &best), CLMLA_ERROR_INVALID_ARGUMENT, c);
    CHECK(memcmp(&best, &sentinel, sizeof(best)) == 0, "a refused call wrote *best");
    CHECK(clmla_context_xgemm_tuning(c, &after, &source_after) == had && memcmp(&before, &after, sizeof(after)) == 0 &&
              source_after && strcmp(source_after, source_copy) == 0,
          "a refused call changed the context's entry");

    /* The tune: CLBlast's own (or the applied entry), then 2 candidates, each compiled once. */
    progress_log log;
    memset(&log, 0, sizeof(log));
    log.last_index = -1;
    clmla_tune_options o = {.size = 128, .max_candidates = 2, .progress = on_progress, .user = &log};
    memset(&best, 0, sizeof(best));
    CHECK_STATUS(clmla_tune_xgemm(c, &o, &best), CLMLA_SUCCESS, c);
    CHECK(best.gflops > 0 && best.default_gflops > 0, "gflops %g, default_gflops %g", best.gflops,
          best.default_gflops);
    CHECK(best.size == 128, "size %d", best.size);
    CHECK(strcmp(best.vendor, device.vendor) == 0 && strcmp(best.device, device.name) == 0,
          "best is for '%s' / '%s', the device is '%s' / '%s'", best.vendor, best.device, device.vendor, device.name);
    const char *why = NULL;
    char text[400];
    values_text(best.values, text, sizeof(text));
    CHECK(clmla_xgemm_values_check(c, best.values, &why) == CLMLA_SUCCESS, "best %s refused: %s", text, why ? why : "");
    CHECK(log.calls >= 2 && log.calls <= 3, "progress called %d times, want 2 or 3", log.calls);
    CHECK(log.bad_index == 0, "%d progress calls with an index outside 0..total-1, not increasing, or another total",
          log.bad_index);
    /* best is a candidate the progress callback reported, with the gflops reported for it. */
    int reported = 0;
    for (int i = 0; i < log.calls && i < 8; i++)
        reported |= log.has_values[i] && same_values(log.values[i], best.values) && log.gflops[i] == best.gflops;
    CHECK(reported, "best %s at %g GFLOP/s is no candidate the callback reported", text, best.gflops);
    printf("  best: %.2f GFLOP/s (default %.2f) %s\n", best.gflops, best.default_gflops, text);
    CHECK(!file_exists(cache_file), "the tune wrote %s", cache_file);

    /* The best candidate is left applied: CLBlast's SGEMM still gives the exact product. */
    check_sgemm(c, 96, 80, 64, "SGEMM after the tune");
    clmla_context_destroy(c);
    env_reset();
}

/* ---- main ------------------------------------------------------------------------------------------ */

static void remember_device(void)
{
    memset(&device, 0, sizeof(device));
    CHECK_STATUS(clmla_context_device(ctx, &device), CLMLA_SUCCESS, ctx);
}

/* The parts that need the device's vendor, name and limits read them first. */
static void part_valid(void)
{
    remember_device();
    test_valid();
}

static void part_applied(void)
{
    remember_device();
    test_applied();
}

static void part_refused(void)
{
    remember_device();
    test_refused();
}

static void part_tune(void)
{
    remember_device();
    test_tune();
}

static const tu_part parts[] = {
    {"names", test_names},     {"valid", part_valid},       {"save", test_save}, {"applied", part_applied},
    {"refused", part_refused}, {"path", test_default_path}, {"tune", part_tune},
};

int main(int argc, char **argv)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(base_dir, sizeof(base_dir), "%s/clmla-tuning-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(base_dir)) {
        printf("mkdtemp %s: %s\n", base_dir, strerror(errno));
        return 1;
    }
    snprintf(empty_cache, sizeof(empty_cache), "%s/cache", base_dir);
    mkdir(empty_cache, 0700);
    env_save();
    env_reset(); /* the shared context too is made without the user's tuning file */

    const tu_parts_result ran =
        tu_run_parts(argc, argv, parts, (int)(sizeof(parts) / sizeof(parts[0])), NULL, &ctx, &check_failed);
    env_restore();
    char stray[400];
    snprintf(stray, sizeof(stray), "%s/clblast-tuning.json", empty_cache);
    CHECK(!file_exists(stray), "something wrote %s", stray);
    ckpt_remove_dir(base_dir);
    if (ran == TU_PARTS_UNKNOWN)
        return 2;
    if (ran == TU_PARTS_NO_DEVICE)
        return 77; /* tu_run_parts said why */
    return check_summary();
}
