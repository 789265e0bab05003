/* Parity with transformers on every CI run, without torch: for each case under
   tests/fixtures/parity/ (a model folder written by transformers' save_pretrained, hidden states
   X.npy, and Y.npy: transformers' own attention module run in float64 on X, prefill then decode
   one token at a time; all produced by tests/parity/run.sh --write-fixtures, never by clmla),
   `clmla run` is run with an f32 cache on every attention path and with an f16 cache, and the cache
   dtypes the case lists (bf16, fp8), on the auto path, then (where the heads split in two) as two
   tensor-parallel shards whose outputs are added, and its output compared with Y:
   max |clmla - Y| / max |Y| within the case's tolerance for that cache (case.json: 1e-5 with an
   f32 cache, 2e-3 with f16). A folder stored in BF16 or FP8 also gives the most bytes its weights
   may take on the device ("weights_bytes_max": the folder's bytes of the layer's tensors, plus
   float32 norms and the FP8 query projection's padding to whole blocks, plus 1%), which the
   device bytes that `clmla run` prints must not pass. No fixtures: skipped (exit 77).
   CLMLA_TEST_SWEEPS=short (ci/sanitize.sh): the f32 cache on the auto path and the shards only; the
   other paths and cache dtypes run other kernels over the same host code, which the ctest stage
   has checked against the fixtures. */
#include "check.h"
#include "clmla.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#ifndef CLMLA_CLI_PATH
#error "CLMLA_CLI_PATH must name the clmla executable"
#endif
#ifndef CLMLA_SOURCE_DIR
#error "CLMLA_SOURCE_DIR must name the source tree"
#endif

static char work[512];

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    static char text[65536];
    const size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    return text;
}

static int number(const cJSON *obj, const char *key, double fallback, double *value)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it || cJSON_IsNull(it)) {
        *value = fallback;
        return 1;
    }
    if (!cJSON_IsNumber(it))
        return 0;
    *value = it->valuedouble;
    return 1;
}

/* max |a - b| / max |b| */
static double rel_err(const float *a, const float *b, size_t n)
{
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= diff))
            diff = d; /* NaN sticks */
        if (fabs(b[i]) > scale)
            scale = fabs(b[i]);
    }
    return scale > 0 ? diff / scale : diff;
}

/* `clmla run` on the fixture folder dir (more arguments in extra), its output into *got (clmla_free
   it) when it ran and has Y's shape; *log_text the run's messages. 1 on success. */
static int run_cli(const char *dir, const char *name, int layer, int sublayer, int prefill, const char *dtype,
                   const char *run_path, const char *extra, const int64_t shape[2], float **got, const char **log_text)
{
    char out[700], log[700], cmd[8192];
    snprintf(out, sizeof(out), "%s/out.npy", work);
    snprintf(log, sizeof(log), "%s/log.txt", work);
    remove(out);
    snprintf(cmd, sizeof(cmd),
             "'%s' run --model '%s' --layer %d --sublayer %d --input '%s/X.npy' --output '%s' --prefill %d "
             "--cache-dtype %s --path %s%s >'%s' 2>&1",
             CLMLA_CLI_PATH, dir, layer, sublayer, dir, out, prefill, dtype, run_path, extra, log);
    const int rc = system(cmd);
    const int status = rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
    *log_text = read_text(log) ? read_text(log) : "";
    *got = NULL;
    CHECK(status == 0, "%s (%s cache, %s path%s): clmla run exited with %d: %s", name, dtype, run_path, extra, status,
          *log_text);
    if (status != 0)
        return 0;
    int64_t gshape[2] = {0, 0};
    int gndim = 0;
    const clmla_status st = clmla_npy_read_f32(out, got, gshape, &gndim);
    const int same = st == CLMLA_SUCCESS && gndim == 2 && gshape[0] == shape[0] && gshape[1] == shape[1];
    CHECK(same, "%s (%s cache, %s path%s): the output has another shape", name, dtype, run_path, extra);
    if (!same) {
        clmla_free(*got);
        *got = NULL;
    }
    return same;
}

/* The model's attention heads (config.json, or its text_config), 0 when not found. */
static int config_heads(const char *dir)
{
    char path[2048];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    const char *text = read_text(path);
    cJSON *c = text ? cJSON_Parse(text) : NULL;
    const cJSON *tc = c ? cJSON_GetObjectItemCaseSensitive(c, "text_config") : NULL;
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(tc) ? tc : c, "num_attention_heads");
    const int heads = cJSON_IsNumber(h) ? h->valueint : 0;
    cJSON_Delete(c);
    return heads;
}

static void run_case(const char *dir, const char *name)
{
    char path[2048];
    snprintf(path, sizeof(path), "%s/case.json", dir);
    const char *text = read_text(path);
    CHECK(text != NULL, "%s: cannot read case.json", name);
    if (!text)
        return;
    cJSON *c = cJSON_Parse(text);
    double layer = 0, sublayer = 0, prefill = -1, bytes_max = -1;
    /* the runs: an f32 cache on every path, then each other cache dtype on the auto path (f16, and
       those the case lists in "cache_dtypes": bf16, fp8), each with its case.json tolerance */
    struct {
        char dtype[8], path[16];
        double tol;
    } runs[8] = {{"f32", "auto", 1e-5}, {"f32", "absorbed", 1e-5}, {"f32", "decompressed", 1e-5}, {"f16", "auto", 2e-3}};
    int nruns = 4;
    int ok = c && number(c, "layer", 0, &layer) && number(c, "sublayer", 0, &sublayer) &&
             number(c, "prefill", -1, &prefill) && number(c, "weights_bytes_max", -1, &bytes_max);
    const cJSON *more = c ? cJSON_GetObjectItemCaseSensitive(c, "cache_dtypes") : NULL;
    for (const cJSON *d = more ? more->child : NULL; ok && d && nruns < 8; d = d->next) {
        ok = cJSON_IsString(d) && strlen(d->valuestring) < sizeof(runs[0].dtype);
        if (ok) {
            snprintf(runs[nruns].dtype, sizeof(runs[nruns].dtype), "%s", d->valuestring);
            snprintf(runs[nruns].path, sizeof(runs[nruns].path), "auto");
            runs[nruns++].tol = -1; /* case.json must give it */
        }
    }
    for (int r = 0; ok && r < nruns; r++) {
        char key[32];
        snprintf(key, sizeof(key), "tol_%.7s", runs[r].dtype);
        ok = number(c, key, runs[r].tol, &runs[r].tol) && runs[r].tol > 0;
    }
    cJSON_Delete(c);
    CHECK(ok, "%s: case.json is malformed", name);
    if (!ok)
        return;

    float *want = NULL;
    int64_t shape[2] = {0, 0};
    int ndim = 0;
    snprintf(path, sizeof(path), "%s/Y.npy", dir);
    CHECK(clmla_npy_read_f32(path, &want, shape, &ndim) == CLMLA_SUCCESS && ndim == 2, "%s: Y.npy: %s", name,
          clmla_last_error(NULL));
    if (!want)
        return;
    const size_t n = (size_t)shape[0] * (size_t)shape[1];

    const char *sweeps = getenv("CLMLA_TEST_SWEEPS");
    if (sweeps && strcmp(sweeps, "short") == 0)
        nruns = 1;
    for (int r = 0; r < nruns; r++) {
        const char *dtype = runs[r].dtype, *run_path = runs[r].path, *log_text = "";
        float *got = NULL;
        if (!run_cli(dir, name, (int)layer, (int)sublayer, (int)prefill, dtype, run_path, "", shape, &got, &log_text))
            continue;
        if (r == 0 && bytes_max >= 0) {
            /* a BF16 or FP8 folder: its weights stay as stored, so the device holds about the
               folder's bytes (the bound comes from the folder, written with the fixture) */
            const char *at = strstr(log_text, " bytes on the device)");
            while (at && at > log_text && at[-1] >= '0' && at[-1] <= '9')
                at--;
            const double held = at ? strtod(at, NULL) : -1;
            CHECK(held > 0 && held <= bytes_max, "%s: the weights take %.0f bytes on the device, more than the %.0f "
                  "the folder's tensors allow", name, held, bytes_max);
            printf("%-40s weights %.0f bytes on the device (at most %.0f)\n", name, held, bytes_max);
        }
        const double err = rel_err(got, want, n), tol = runs[r].tol;
        CHECK(err <= tol, "%s (%s cache, %s path): relative error %.3g > %.3g", name, dtype, run_path, err, tol);
        printf("%-40s %-4s %-12s %.3g\n", name, dtype, run_path, err);
        clmla_free(got);
    }
    /* as two tensor-parallel shards (f32 cache, auto path): their outputs, o_proj's partial sums,
       add up to the layer's; skipped where the heads do not split in two */
    const int heads = config_heads(dir);
    float *sum = heads > 0 && heads % 2 == 0 ? calloc(n, sizeof(float)) : NULL;
    int shards = 0;
    for (int rank = 0; sum && rank < 2; rank++) {
        char extra[64];
        const char *log_text = "";
        float *got = NULL;
        snprintf(extra, sizeof(extra), " --tp-rank %d --tp-size 2", rank);
        if (!run_cli(dir, name, (int)layer, (int)sublayer, (int)prefill, "f32", "auto", extra, shape, &got, &log_text))
            break;
        for (size_t i = 0; i < n; i++)
            sum[i] += got[i];
        clmla_free(got);
        shards++;
    }
    if (shards == 2) {
        const double err = rel_err(sum, want, n), tol = runs[0].tol;
        CHECK(err <= tol, "%s (two shards, f32 cache, auto path): relative error %.3g > %.3g", name, err, tol);
        printf("%-40s %-4s %-12s %.3g\n", name, "f32", "auto, 2 shards", err);
    }
    free(sum);
    clmla_free(want);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void)
{
    const char *root = CLMLA_SOURCE_DIR "/tests/fixtures/parity";
    DIR *dir = opendir(root);
    if (!dir) {
        printf("skipped: no fixtures in %s\n", root);
        return 77;
    }
    char *names[256];
    int count = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL && count < 256;) {
        char path[1024];
        struct stat sb;
        snprintf(path, sizeof(path), "%s/%s/case.json", root, e->d_name);
        if (e->d_name[0] != '.' && stat(path, &sb) == 0)
            names[count++] = strdup(e->d_name);
    }
    closedir(dir);
    if (count == 0) {
        printf("skipped: no fixtures in %s\n", root);
        return 77;
    }
    qsort(names, (size_t)count, sizeof(names[0]), by_name);
    const char *tmp = getenv("TMPDIR");
    snprintf(work, sizeof(work), "%s/clmla-parity-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(work)) {
        printf("cannot make a temporary folder\n");
        return 1;
    }
    char version[256] = "";
    const char *v = read_text(CLMLA_SOURCE_DIR "/tests/fixtures/parity/VERSIONS");
    if (v) {
        const size_t len = strlen(v) < sizeof(version) - 1 ? strlen(v) : sizeof(version) - 1;
        memcpy(version, v, len);
        version[len] = '\0';
    }
    printf("fixtures from %s", version[0] ? version : "(no VERSIONS file)\n");
    for (int i = 0; i < count; i++) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/%.256s", root, names[i]);
        run_case(path, names[i]);
        free(names[i]);
    }
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", work);
    if (system(cmd) != 0)
        printf("could not remove %s\n", work);
    return check_summary();
}
