/* Parity with transformers on every CI run, without torch: for each case under
   tests/fixtures/parity/ (a model folder written by transformers' save_pretrained, hidden states
   X.npy, and Y.npy: transformers' own attention module run in float64 on X, prefill then decode
   one token at a time; all produced by tests/parity/run.sh --write-fixtures, never by clmla),
   `clmla run` is run with an f32 cache on every attention path and with an f16 cache on the auto
   path, and its output compared with
   Y: max |clmla - Y| / max |Y| within the case's tolerance (case.json: 1e-5 with an f32 cache,
   2e-3 with f16). No fixtures: skipped (exit 77). */
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

static void run_case(const char *dir, const char *name)
{
    char path[2048];
    snprintf(path, sizeof(path), "%s/case.json", dir);
    const char *text = read_text(path);
    CHECK(text != NULL, "%s: cannot read case.json", name);
    if (!text)
        return;
    cJSON *c = cJSON_Parse(text);
    double layer = 0, sublayer = 0, prefill = -1, tol32 = 1e-5, tol16 = 2e-3;
    const int ok = c && number(c, "layer", 0, &layer) && number(c, "sublayer", 0, &sublayer) &&
                   number(c, "prefill", -1, &prefill) && number(c, "tol_f32", 1e-5, &tol32) &&
                   number(c, "tol_f16", 2e-3, &tol16);
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

    static const char *const dtypes[] = {"f32", "f16"}, *const paths[] = {"auto", "absorbed", "decompressed"};
    for (int d = 0; d < 2; d++)
        for (int p = 0; p < (d ? 1 : 3); p++) { /* f16: the auto path only, to keep CI short */
            char out[700], log[700], cmd[8192];
            snprintf(out, sizeof(out), "%s/out.npy", work);
            snprintf(log, sizeof(log), "%s/log.txt", work);
            remove(out);
            snprintf(cmd, sizeof(cmd),
                     "'%s' run --model '%s' --layer %d --sublayer %d --input '%s/X.npy' --output '%s' --prefill %d "
                     "--cache-dtype %s --path %s >'%s' 2>&1",
                     CLMLA_CLI_PATH, dir, (int)layer, (int)sublayer, dir, out, (int)prefill, dtypes[d], paths[p], log);
            const int rc = system(cmd);
            const int status = rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
            CHECK(status == 0, "%s (%s cache, %s path): clmla run exited with %d: %s", name, dtypes[d], paths[p], status,
                  read_text(log) ? read_text(log) : "");
            if (status != 0)
                continue;
            float *got = NULL;
            int64_t gshape[2] = {0, 0};
            int gndim = 0;
            const clmla_status st = clmla_npy_read_f32(out, &got, gshape, &gndim);
            CHECK(st == CLMLA_SUCCESS && gndim == 2 && gshape[0] == shape[0] && gshape[1] == shape[1],
                  "%s: the output has another shape", name);
            if (st == CLMLA_SUCCESS && gndim == 2 && gshape[0] == shape[0] && gshape[1] == shape[1]) {
                const double err = rel_err(got, want, n);
                const double tol = d ? tol16 : tol32;
                CHECK(err <= tol, "%s (%s cache, %s path): relative error %.3g > %.3g", name, dtypes[d], paths[p], err, tol);
                printf("%-40s %s %-12s %.3g\n", name, dtypes[d], paths[p], err);
            }
            clmla_free(got);
        }
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
