/* Context creation on the real device list, the program caches (memory and disk), build errors
   and status strings. Runs on whatever OpenCL device there is (PoCL in CI). */
#include "check.h"
#include "clmla.h"
#include "clmla_tuning.h"
#include "attention.h"
#include "gemm.h"
#include "program.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char cache_dir[256];

static clmla_context *open_ctx(const char *spec)
{
    clmla_context *ctx = NULL;
    clmla_status st = clmla_context_create(spec, &ctx);
    CHECK(st == CLMLA_SUCCESS && ctx, "context for '%s': %s", spec ? spec : "(default)", clmla_last_error(NULL));
    return ctx;
}

static clmla_program_stats stats_of(clmla_context *ctx)
{
    clmla_program_stats s;
    memset(&s, 0, sizeof(s));
    clmla_context_program_stats(ctx, &s);
    return s;
}

/* Paths of the cache files (not temporaries) in cache_dir; returns how many. */
static int cache_files(char paths[][512], int max)
{
    int n = 0;
    DIR *d = opendir(cache_dir);
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 6 && strcmp(e->d_name + len - 6, ".clbin") == 0 && n < max)
            snprintf(paths[n++], 512, "%s/%s", cache_dir, e->d_name);
    }
    closedir(d);
    return n;
}

/* Runs the rmsnorm kernel built with `options` on a small odd-shaped matrix and compares with a
   double-precision computation, so a program from any cache path is shown to work. */
static void run_rmsnorm(clmla_context *ctx, const char *options, int wg)
{
    enum { ROWS = 3, COLS = 37, STRIDE = 41 };
    float x[ROWS * STRIDE], w[COLS];
    for (int i = 0; i < ROWS * STRIDE; i++)
        x[i] = (float)((i * 7919) % 113) / 50.0f - 1.1f;
    for (int i = 0; i < COLS; i++)
        w[i] = 0.5f + (float)i / COLS;
    cl_kernel k = NULL;
    clmla_status st = clmla_kernel_create(ctx, "rmsnorm", options, "rmsnorm", &k);
    CHECK(st == CLMLA_SUCCESS, "rmsnorm kernel: %s", clmla_last_error(ctx));
    if (st != CLMLA_SUCCESS)
        return;
    cl_int err;
    cl_context c = clmla_context_cl_context(ctx);
    cl_command_queue q = clmla_context_queue(ctx);
    cl_mem xb = clCreateBuffer(c, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof(x), x, &err);
    cl_mem wb = clCreateBuffer(c, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(w), w, &err);
    int off = 0, stride = STRIDE, cols = COLS;
    float eps = 1e-6f;
    clSetKernelArg(k, 0, sizeof(cl_mem), &xb);
    clSetKernelArg(k, 1, sizeof(int), &off);
    clSetKernelArg(k, 2, sizeof(int), &stride);
    clSetKernelArg(k, 3, sizeof(int), &cols);
    clSetKernelArg(k, 4, sizeof(cl_mem), &wb);
    clSetKernelArg(k, 5, sizeof(float), &eps);
    size_t local = (size_t)wg, global = (size_t)wg * ROWS;
    err = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, NULL);
    CHECK(err == CL_SUCCESS, "enqueue rmsnorm: %d", err);
    float y[ROWS * STRIDE];
    err = clEnqueueReadBuffer(q, xb, CL_TRUE, 0, sizeof(y), y, 0, NULL, NULL);
    CHECK(err == CL_SUCCESS, "read back: %d", err);
    double worst = 0;
    for (int r = 0; r < ROWS; r++) {
        double ss = 0;
        for (int i = 0; i < COLS; i++)
            ss += (double)x[r * STRIDE + i] * x[r * STRIDE + i];
        double inv = 1.0 / sqrt(ss / COLS + 1e-6);
        for (int i = 0; i < STRIDE; i++) {
            double want = i < COLS ? w[i] * x[r * STRIDE + i] * inv : x[r * STRIDE + i];
            double e = fabs(y[r * STRIDE + i] - want);
            if (e > worst)
                worst = e;
        }
    }
    CHECK(worst < 1e-5, "rmsnorm max abs error %g", worst);
    clReleaseMemObject(xb);
    clReleaseMemObject(wb);
    clReleaseKernel(k);
}

static void test_device_choice(void)
{
    clmla_device_info *devs = NULL;
    size_t n = 0;
    clmla_status st = clmla_devices_list(&devs, &n);
    CHECK(st == CLMLA_SUCCESS && n > 0, "devices: %s", clmla_last_error(NULL));
    if (st != CLMLA_SUCCESS)
        return;
    size_t def = 0;
    int defaults = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(devs[i].index == (int)i, "flat index %d at %zu", devs[i].index, i);
        if (devs[i].is_default) {
            def = i;
            defaults++;
        }
    }
    CHECK(defaults == 1, "exactly one default device, got %d", defaults);

    clmla_context *ctx = open_ctx(NULL);
    clmla_device_info info;
    if (ctx) {
        clmla_context_device(ctx, &info);
        CHECK(info.device_id == devs[def].device_id, "default context on '%s', expected '%s'", info.name, devs[def].name);
        clmla_context_destroy(ctx);
    }
    /* By name substring (a piece of the real name, in upper case) and by P:D. */
    char piece[8] = {0};
    for (int i = 0; i < 4 && devs[n - 1].name[i]; i++)
        piece[i] = (char)((devs[n - 1].name[i] >= 'a' && devs[n - 1].name[i] <= 'z') ? devs[n - 1].name[i] - 32 : devs[n - 1].name[i]);
    size_t idx = 999;
    st = clmla_device_resolve(piece, &idx);
    CHECK(st == CLMLA_SUCCESS && idx <= n - 1, "resolve '%s': %s", piece, clmla_last_error(NULL));
    char pd[32];
    snprintf(pd, sizeof(pd), "%d:%d", devs[n - 1].platform_index, devs[n - 1].device_index);
    ctx = open_ctx(pd);
    if (ctx) {
        clmla_context_device(ctx, &info);
        CHECK(info.device_id == devs[n - 1].device_id, "P:D %s opened '%s'", pd, info.name);
        clmla_context_destroy(ctx);
    }

    /* A spec that matches nothing: status, no context, and every device named in the message. */
    ctx = (clmla_context *)0x1;
    st = clmla_context_create("nosuch-device-xyz", &ctx);
    CHECK(st == CLMLA_ERROR_DEVICE_NOT_FOUND && ctx == NULL, "nosuch gave %s", clmla_status_string(st));
    for (size_t i = 0; i < n; i++)
        CHECK(strstr(clmla_last_error(NULL), devs[i].name) != NULL, "message lists '%s': %s", devs[i].name,
              clmla_last_error(NULL));

    /* CLMLA_DEVICE is the default when no argument is given; the argument wins over it. */
    setenv("CLMLA_DEVICE", "nosuch-device-xyz", 1);
    st = clmla_context_create(NULL, &ctx);
    CHECK(st == CLMLA_ERROR_DEVICE_NOT_FOUND && strstr(clmla_last_error(NULL), "CLMLA_DEVICE"),
          "bad CLMLA_DEVICE: %s", clmla_last_error(NULL));
    ctx = open_ctx("0");
    clmla_context_destroy(ctx);
    setenv("CLMLA_DEVICE", pd, 1);
    ctx = open_ctx(NULL);
    if (ctx) {
        clmla_context_device(ctx, &info);
        CHECK(info.device_id == devs[n - 1].device_id, "CLMLA_DEVICE=%s opened '%s'", pd, info.name);
    }
    clmla_context_destroy(ctx);
    unsetenv("CLMLA_DEVICE");

    /* An engine's own queue. */
    ctx = open_ctx(NULL);
    if (ctx) {
        clmla_context *wrapped = NULL;
        st = clmla_context_create_from_queue(clmla_context_queue(ctx), &wrapped);
        CHECK(st == CLMLA_SUCCESS && wrapped, "from queue: %s", clmla_last_error(NULL));
        if (wrapped) {
            clmla_context_device(wrapped, &info);
            CHECK(info.device_id == devs[def].device_id && info.index == (int)def, "wrapped device index %d", info.index);
            run_rmsnorm(wrapped, "-D WG=16", 16);
        }
        clmla_context_destroy(wrapped);
        clmla_context_destroy(ctx);
    }
    clmla_context_destroy(NULL); /* accepted */
    clmla_free(devs);
}

/* Builds (or fetches from the caches) the program of cl/<name>.cl with these options. */
static clmla_status build_program(clmla_context *ctx, const char *name, const char *options)
{
    cl_program program = NULL;
    return clmla_program_get(ctx, name, options, &program);
}

static void test_disk_cache(void)
{
    snprintf(cache_dir, sizeof(cache_dir), "/tmp/clmla-test-cache-XXXXXX");
    CHECK(mkdtemp(cache_dir) != NULL, "mkdtemp");
    setenv("CLMLA_CACHE_DIR", cache_dir, 1);
    const char *opts = "-D WG=32 -D CLMLA_TEST_CACHE=1";

    /* First build: from source, written to disk; second request: from memory. */
    clmla_context *ctx = open_ctx(NULL);
    if (!ctx)
        return;
    CHECK(build_program(ctx, "rmsnorm", opts) == CLMLA_SUCCESS, "%s", clmla_last_error(ctx));
    CHECK(build_program(ctx, "rmsnorm", opts) == CLMLA_SUCCESS, "%s", clmla_last_error(ctx));
    clmla_program_stats s = stats_of(ctx);
    CHECK(s.built_from_source == 1 && s.disk_written == 1 && s.memory_hits == 1 && s.loaded_from_disk == 0,
          "first context: built %llu written %llu hits %llu loaded %llu", (unsigned long long)s.built_from_source,
          (unsigned long long)s.disk_written, (unsigned long long)s.memory_hits, (unsigned long long)s.loaded_from_disk);
    run_rmsnorm(ctx, opts, 32);
    clmla_context_destroy(ctx);
    char files[4][512];
    CHECK(cache_files(files, 4) == 1, "one cache file after one build");

    /* A new context loads the binary from disk and it works. */
    ctx = open_ctx(NULL);
    run_rmsnorm(ctx, opts, 32);
    s = stats_of(ctx);
    CHECK(s.loaded_from_disk == 1 && s.built_from_source == 0 && s.disk_rejected == 0,
          "second context: loaded %llu built %llu", (unsigned long long)s.loaded_from_disk,
          (unsigned long long)s.built_from_source);
    /* Other options are another program. */
    CHECK(build_program(ctx, "rmsnorm", "-D WG=8 -D CLMLA_TEST_CACHE=1") == CLMLA_SUCCESS, "WG=8");
    s = stats_of(ctx);
    CHECK(s.built_from_source == 1, "different options built anew (%llu)", (unsigned long long)s.built_from_source);
    clmla_context_destroy(ctx);

    /* Damaged files: truncated, flipped payload byte, garbage, empty. Each is rebuilt. */
    static const char *damage[] = {"truncate", "flip", "garbage", "empty"};
    for (int d = 0; d < 4; d++) {
        int nf = cache_files(files, 4);
        CHECK(nf == 2, "two cache files, got %d", nf);
        for (int f = 0; f < nf; f++) {
            FILE *fp = fopen(files[f], "r+b");
            if (!fp)
                continue;
            fseek(fp, 0, SEEK_END);
            long len = ftell(fp);
            if (d == 0) {
                CHECK(truncate(files[f], len / 2) == 0, "truncate");
            } else if (d == 1) {
                fseek(fp, len - 5, SEEK_SET);
                int c = fgetc(fp);
                fseek(fp, len - 5, SEEK_SET);
                fputc(c ^ 0x55, fp);
            } else if (d == 2) {
                fseek(fp, 0, SEEK_SET);
                for (long i = 0; i < len; i++)
                    fputc((int)((i * 31) & 0xff), fp);
            } else {
                CHECK(truncate(files[f], 0) == 0, "truncate to 0");
            }
            fclose(fp);
        }
        ctx = open_ctx(NULL);
        run_rmsnorm(ctx, opts, 32);
        s = stats_of(ctx);
        CHECK(s.disk_rejected == 1 && s.built_from_source == 1 && s.disk_written == 1,
              "%s file: rejected %llu built %llu written %llu", damage[d], (unsigned long long)s.disk_rejected,
              (unsigned long long)s.built_from_source, (unsigned long long)s.disk_written);
        /* Keep the second file equally damaged or fresh: build it too so both are rewritten. */
        build_program(ctx, "rmsnorm", "-D WG=8 -D CLMLA_TEST_CACHE=1");
        clmla_context_destroy(ctx);
        ctx = open_ctx(NULL);
        run_rmsnorm(ctx, opts, 32);
        s = stats_of(ctx);
        CHECK(s.loaded_from_disk == 1 && s.disk_rejected == 0, "after %s: rewritten file loads (%llu)", damage[d],
              (unsigned long long)s.loaded_from_disk);
        clmla_context_destroy(ctx);
    }

    /* "off" disables the disk cache. */
    setenv("CLMLA_CACHE_DIR", "off", 1);
    ctx = open_ctx(NULL);
    build_program(ctx, "rmsnorm", opts);
    s = stats_of(ctx);
    CHECK(s.built_from_source == 1 && s.loaded_from_disk == 0 && s.disk_written == 0, "cache off: built %llu",
          (unsigned long long)s.built_from_source);
    clmla_context_destroy(ctx);

    /* An unwritable cache directory is not fatal. */
    setenv("CLMLA_CACHE_DIR", "/proc/clmla-cannot-exist", 1);
    ctx = open_ctx(NULL);
    CHECK(build_program(ctx, "rmsnorm", opts) == CLMLA_SUCCESS, "unwritable cache dir: %s",
          clmla_last_error(ctx));
    clmla_context_destroy(ctx);

    int nf = cache_files(files, 4);
    for (int f = 0; f < nf; f++)
        remove(files[f]);
    rmdir(cache_dir);
    unsetenv("CLMLA_CACHE_DIR");
}

static void test_build_errors(void)
{
    char dir[] = "/tmp/clmla-test-kernels-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[512];
    snprintf(path, sizeof(path), "%s/broken.cl", dir);
    FILE *f = fopen(path, "w");
    fputs("__kernel void broken(__global float *x) { x[0] = undeclared_identifier_42 + ; }\n", f);
    fclose(f);
    setenv("CLMLA_KERNEL_DIR", dir, 1);
    setenv("CLMLA_CACHE_DIR", "off", 1);
    clmla_context *ctx = open_ctx(NULL);
    if (ctx) {
        CHECK_STATUS(build_program(ctx, "broken", "-D X=1"), CLMLA_ERROR_BUILD_FAILED, ctx);
        const char *msg = clmla_last_error(ctx);
        CHECK(strstr(msg, "broken.cl") && strstr(msg, "undeclared_identifier_42"), "build log in message: %s", msg);
        /* The context is still usable afterwards... for files that exist in the directory. */
        CHECK_STATUS(build_program(ctx, "rmsnorm", ""), CLMLA_ERROR_KERNEL_NOT_FOUND, ctx);
        CHECK(strstr(clmla_last_error(ctx), "rmsnorm.cl") != NULL, "names the file: %s", clmla_last_error(ctx));
        CHECK_STATUS(build_program(ctx, "../etc/passwd", ""), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    }
    clmla_context_destroy(ctx);
    remove(path);
    rmdir(dir);
    unsetenv("CLMLA_KERNEL_DIR");

    ctx = open_ctx(NULL);
    if (ctx) {
        CHECK_STATUS(build_program(ctx, "no_such_kernel", ""), CLMLA_ERROR_KERNEL_NOT_FOUND, ctx);
        CHECK_STATUS(build_program(ctx, "rmsnorm", "-D WG=4"), CLMLA_SUCCESS, ctx);
    }
    clmla_context_destroy(ctx);
    unsetenv("CLMLA_CACHE_DIR");
}

/* clmla_context_options win over the environment variables they stand for. */
/* A log callback that keeps the messages it is given. */
typedef struct log_record {
    int count[3]; /* by level */
    char text[4096];
} log_record;

static void keep_log(void *user, clmla_log_level level, const char *message)
{
    log_record *r = user;
    if (level >= 0 && level < 3)
        r->count[level]++;
    const size_t used = strlen(r->text);
    snprintf(r->text + used, sizeof(r->text) - used, "%d %s\n", (int)level, message);
}

/* A context with options o builds (or loads) rmsnorm with `options`, into a fresh record r. */
static void log_build(const clmla_context_options *o, const char *options, log_record *r)
{
    memset(r, 0, sizeof(*r));
    clmla_context *ctx = NULL;
    CHECK_STATUS(clmla_context_create_opts(o, &ctx), CLMLA_SUCCESS, NULL);
    if (ctx)
        CHECK_STATUS(build_program(ctx, "rmsnorm", options), CLMLA_SUCCESS, ctx);
    clmla_context_destroy(ctx);
}

/* clmla_context_options.log: what setup did, at the level asked for, and nothing without it. */
static void test_log(void)
{
    char dir[] = "/tmp/clmla-test-log-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    log_record r;
    clmla_context_options o = {.cache_dir = dir, .clblast_tuning = "auto", .log = keep_log, .log_user = &r,
                               .log_level = CLMLA_LOG_INFO};
    const char *opts = "-D WG=8 -D CLMLA_TEST_LOG=1";
    log_build(&o, opts, &r);
    CHECK(strstr(r.text, "kernel rmsnorm.cl [-D WG=8 -D CLMLA_TEST_LOG=1]: built from source") != NULL,
          "no build message at INFO:\n%s", r.text);
    /* A second context loads it from the cache folder, and says so. */
    log_build(&o, opts, &r);
    CHECK(strstr(r.text, "loaded from the program cache") != NULL, "no cache message:\n%s", r.text);
    /* A corrupt cache file is a warning, and WARNING leaves the INFO messages out. */
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "find '%s' -type f -exec sh -c 'printf garbage > \"$1\"' _ {} \\;", dir);
    CHECK(system(cmd) == 0, "corrupting the cache");
    o.log_level = CLMLA_LOG_WARNING;
    log_build(&o, opts, &r);
    CHECK(r.count[CLMLA_LOG_WARNING] == 1 && r.count[CLMLA_LOG_INFO] == 0 && strstr(r.text, "program cache"),
          "at WARNING with a corrupt file: %d warnings, %d info:\n%s", r.count[CLMLA_LOG_WARNING],
          r.count[CLMLA_LOG_INFO], r.text);
    /* Level 0: nothing. */
    o.log_level = CLMLA_LOG_OFF;
    log_build(&o, "-D WG=8 -D CLMLA_TEST_LOG=2", &r);
    CHECK(r.text[0] == '\0', "level 0 logged:\n%s", r.text);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

static void test_options(void)
{
    char env_dir[] = "/tmp/clmla-test-env-XXXXXX", opt_dir[] = "/tmp/clmla-test-opt-XXXXXX";
    char kdir[] = "/tmp/clmla-test-nokernels-XXXXXX";
    CHECK(mkdtemp(env_dir) && mkdtemp(opt_dir) && mkdtemp(kdir), "mkdtemp");
    setenv("CLMLA_CACHE_DIR", env_dir, 1);
    clmla_context_options o;
    memset(&o, 0, sizeof(o));
    o.cache_dir = opt_dir;
    o.clblast_tuning = "off";
    clmla_context *ctx = NULL;
    CHECK_STATUS(clmla_context_create_opts(&o, &ctx), CLMLA_SUCCESS, NULL);
    if (ctx) {
        CHECK_STATUS(build_program(ctx, "rmsnorm", "-D WG=16 -D CLMLA_TEST_OPTIONS=1"), CLMLA_SUCCESS, ctx);
        clmla_program_stats s = stats_of(ctx);
        CHECK(s.disk_written == 1, "options.cache_dir: %llu binaries written", (unsigned long long)s.disk_written);
        clmla_xgemm_tuning t;
        const char *source = NULL;
        CHECK(clmla_context_xgemm_tuning(ctx, &t, &source) == CLMLA_ERROR_UNSUPPORTED && source && strcmp(source, "none") == 0,
              "options.clblast_tuning \"off\" applied %s", source ? source : "(null)");
        clmla_context_destroy(ctx);
    }
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "test -n \"$(ls -A %s)\" && test -z \"$(ls -A %s)\"", opt_dir, env_dir);
    CHECK(system(cmd) == 0, "the binary went to options.cache_dir %s, not CLMLA_CACHE_DIR %s", opt_dir, env_dir);

    /* kernel_dir: a folder without kernels, whatever CLMLA_KERNEL_DIR says (unset here). */
    memset(&o, 0, sizeof(o));
    o.kernel_dir = kdir;
    o.cache_dir = "off";
    CHECK_STATUS(clmla_context_create_opts(&o, &ctx), CLMLA_SUCCESS, NULL);
    if (ctx)
        CHECK_STATUS(build_program(ctx, "rmsnorm", "-D WG=16"), CLMLA_ERROR_KERNEL_NOT_FOUND, ctx);
    clmla_context_destroy(ctx);
    /* attention_kernels and product_kernels: the option over CLMLA_ATTENTION_KERNELS or
       CLMLA_PRODUCT_KERNELS over "auto"; a bad value names itself and the choices, and no context
       is made. */
    char saved[2][32] = {"", ""}; /* the suite may run under either variable: put back at the end */
    const char *const vars[2] = {"CLMLA_ATTENTION_KERNELS", "CLMLA_PRODUCT_KERNELS"};
    for (int v = 0; v < 2; v++) {
        const char *e = getenv(vars[v]);
        snprintf(saved[v], sizeof(saved[v]), "%s", e ? e : "");
        unsetenv(vars[v]);
    }
    for (int products = 0; products < 2; products++) {
        static const struct {
            const char *env, *option;
            int want; /* -1: refused */
        } cases[] = {{NULL, "rows", CLMLA_LATENT_ROWS},    {NULL, "group", CLMLA_LATENT_GROUP},
                     {"rows", NULL, CLMLA_LATENT_ROWS},    {"group", "rows", CLMLA_LATENT_ROWS},
                     {"rows", "auto", CLMLA_LATENT_AUTO},  {NULL, "gpu", -1},
                     {"Rows", NULL, -1},                   {"", NULL, CLMLA_LATENT_AUTO}};
        const char *var = products ? "CLMLA_PRODUCT_KERNELS" : "CLMLA_ATTENTION_KERNELS";
        const char *what = products ? "product kernels" : "attention kernels";
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            if (cases[i].env)
                setenv(var, cases[i].env, 1);
            memset(&o, 0, sizeof(o));
            o.cache_dir = "off";
            if (products)
                o.product_kernels = cases[i].option;
            else
                o.attention_kernels = cases[i].option;
            ctx = NULL;
            const clmla_status st = clmla_context_create_opts(&o, &ctx);
            if (cases[i].want < 0) {
                const char *bad = cases[i].option ? cases[i].option : cases[i].env;
                CHECK(st == CLMLA_ERROR_INVALID_ARGUMENT && !ctx && strstr(clmla_last_error(NULL), bad) &&
                          strstr(clmla_last_error(NULL), what) && strstr(clmla_last_error(NULL), "auto, rows or group"),
                      "%s '%s': status %d, message: %s", what, bad, st, clmla_last_error(NULL));
            } else if (ctx) {
                const int want = cases[i].want != CLMLA_LATENT_AUTO ? cases[i].want
                                 : ctx->info.kind == CLMLA_DEVICE_KIND_CPU ? CLMLA_LATENT_ROWS
                                                                                        : CLMLA_LATENT_GROUP;
                const int got = products ? (clmla_products_rows(ctx) ? CLMLA_LATENT_ROWS : CLMLA_LATENT_GROUP)
                                         : clmla_attention_variant(ctx);
                CHECK(got == want, "%s env '%s' option '%s': variant %d, not %d", what,
                      cases[i].env ? cases[i].env : "(unset)", cases[i].option ? cases[i].option : "(NULL)", got, want);
                /* the other kind's choice is its own: still by device type */
                const int other = products ? clmla_attention_variant(ctx)
                                           : (clmla_products_rows(ctx) ? CLMLA_LATENT_ROWS : CLMLA_LATENT_GROUP);
                CHECK(other == (ctx->info.kind == CLMLA_DEVICE_KIND_CPU ? CLMLA_LATENT_ROWS : CLMLA_LATENT_GROUP),
                      "%s case %zu changed the other kind's choice", what, i);
            } else
                CHECK(0, "%s case %zu: %s", what, i, clmla_last_error(NULL));
            clmla_context_destroy(ctx);
            unsetenv(var);
        }
    }
    /* "auto" on Mesa's rusticl (its platform name): the work-group products on its CPU device, whose
       row-walking products computed wrong; "rows" still runs them; PoCL's CPU device keeps the
       row forms. The device's reported names are set on a context of this device. */
    memset(&o, 0, sizeof(o));
    o.cache_dir = "off";
    ctx = NULL;
    CHECK_STATUS(clmla_context_create_opts(&o, &ctx), CLMLA_SUCCESS, NULL);
    if (ctx) {
        const clmla_device_info real = ctx->info;
        ctx->info.kind = CLMLA_DEVICE_KIND_CPU;
        snprintf(ctx->info.platform_name, sizeof(ctx->info.platform_name), "rusticl");
        CHECK(!clmla_products_rows(ctx), "rusticl's CPU device: auto chose the row-walking products");
        ctx->product_variant = CLMLA_LATENT_ROWS;
        CHECK(clmla_products_rows(ctx), "rusticl's CPU device: product_kernels rows not honoured");
        ctx->product_variant = CLMLA_LATENT_AUTO;
        snprintf(ctx->info.platform_name, sizeof(ctx->info.platform_name), "Portable Computing Language");
        CHECK(clmla_products_rows(ctx), "PoCL's CPU device: auto did not choose the row-walking products");
        ctx->info.kind = CLMLA_DEVICE_KIND_GPU;
        snprintf(ctx->info.platform_name, sizeof(ctx->info.platform_name), "rusticl");
        CHECK(!clmla_products_rows(ctx), "rusticl's GPU device: auto chose the row-walking products");
        ctx->info = real;
    }
    clmla_context_destroy(ctx);
    for (int v = 0; v < 2; v++)
        if (saved[v][0])
            setenv(vars[v], saved[v], 1);
    /* NULL options: the defaults, like clmla_context_create(NULL). */
    ctx = NULL;
    CHECK_STATUS(clmla_context_create_opts(NULL, &ctx), CLMLA_SUCCESS, NULL);
    clmla_context_destroy(ctx);
    unsetenv("CLMLA_CACHE_DIR");
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s' '%s'", env_dir, opt_dir, kdir);
    CHECK(system(cmd) == 0, "cleanup");
}

static void test_status_strings(void)
{
    for (int code = -5099; code <= -5000; code++) {
        const char *s = clmla_status_string(code);
        int known = strncmp(s, "CLMLA_ERROR_", 12) == 0;
        int unknown = strncmp(s, "unknown status", 14) == 0;
        CHECK(known || unknown, "code %d: '%s'", code, s);
    }
    static const int own[] = {
        CLMLA_SUCCESS, CLMLA_ERROR_INVALID_ARGUMENT, CLMLA_ERROR_OUT_OF_HOST_MEMORY, CLMLA_ERROR_NO_PLATFORM,
        CLMLA_ERROR_NO_DEVICE, CLMLA_ERROR_DEVICE_NOT_FOUND, CLMLA_ERROR_KERNEL_NOT_FOUND, CLMLA_ERROR_BUILD_FAILED,
        CLMLA_ERROR_INVALID_CONFIG, CLMLA_ERROR_SHAPE_MISMATCH, CLMLA_ERROR_MISSING_TENSOR, CLMLA_ERROR_CACHE_FULL,
        CLMLA_ERROR_UNKNOWN_SEQUENCE, CLMLA_ERROR_UNSUPPORTED, CLMLA_ERROR_IO, CLMLA_ERROR_INVALID_FILE,
        CLMLA_ERROR_INTERNAL};
    for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
        CHECK(strncmp(clmla_status_string(own[i]), "unknown", 7) != 0, "own code %d is named", own[i]);
    CHECK(strcmp(clmla_status_string(CLMLA_ERROR_CACHE_FULL), "CLMLA_ERROR_CACHE_FULL") == 0, "cache full name");
    /* OpenCL and CLBlast codes pass through with their own names. */
    for (int code = -1; code >= -70; code--) {
        if (code < -19 && code > -30)
            continue; /* unassigned in OpenCL */
        CHECK(strncmp(clmla_status_string(code), "CL_", 3) == 0, "OpenCL code %d: %s", code, clmla_status_string(code));
    }
    CHECK(strcmp(clmla_status_string(CL_OUT_OF_RESOURCES), "CL_OUT_OF_RESOURCES") == 0, "CL_OUT_OF_RESOURCES");
    CHECK(strcmp(clmla_status_string(-1017), "CLBlastInvalidDimension") == 0, "CLBlast code");
    for (int code = -1024; code <= -1007; code++)
        if (code != -1023)
            CHECK(strncmp(clmla_status_string(code), "CLBlast", 7) == 0, "CLBlast code %d", code);
    CHECK(strcmp(clmla_status_string(12345), "unknown status 12345") == 0, "unknown: %s", clmla_status_string(12345));
    CHECK(strcmp(clmla_version_string(), "0.1.0") >= 0 && strchr(clmla_version_string(), '.'), "version %s",
          clmla_version_string());
    clmla_clear_error(NULL);
}

/* program_binaries (option over CLMLA_PROGRAM_BINARIES over "auto"): whether a build goes to the
   disk cache; auto keeps binaries on every device but PoCL's CPU device; a bad value is refused by
   name and makes no context. */
static void test_program_binaries(void)
{
    char dir[] = "/tmp/clmla-test-binaries-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    static const struct {
        const char *env, *option;
        int want; /* 1 stored, 0 not, -1 auto (by device), -2 refused */
    } cases[] = {{NULL, NULL, -1},    {"auto", NULL, -1}, {"", NULL, -1},     {"on", NULL, 1},
                 {"off", NULL, 0},    {NULL, "on", 1},    {"off", "on", 1},   {"on", "off", 0},
                 {"on", "auto", -1},  {NULL, "yes", -2},  {"ON", NULL, -2},   {"off", "1", -2}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (cases[i].env)
            setenv("CLMLA_PROGRAM_BINARIES", cases[i].env, 1);
        else
            unsetenv("CLMLA_PROGRAM_BINARIES");
        clmla_context_options o;
        memset(&o, 0, sizeof(o));
        o.cache_dir = dir;
        o.program_binaries = cases[i].option;
        clmla_context *ctx = NULL;
        const clmla_status st = clmla_context_create_opts(&o, &ctx);
        if (cases[i].want == -2) {
            const char *bad = cases[i].option ? cases[i].option : cases[i].env;
            char quoted[16];
            snprintf(quoted, sizeof(quoted), "'%s'", bad);
            CHECK(st == CLMLA_ERROR_INVALID_ARGUMENT && !ctx && strstr(clmla_last_error(NULL), quoted) &&
                      strstr(clmla_last_error(NULL), "program_binaries") &&
                      strstr(clmla_last_error(NULL), "auto, on or off"),
                  "program binaries '%s': status %d, message: %s", bad, st, clmla_last_error(NULL));
            clmla_context_destroy(ctx);
            continue;
        }
        if (!ctx) {
            CHECK(0, "case %zu: %s", i, clmla_last_error(NULL));
            continue;
        }
        char opts[64];
        snprintf(opts, sizeof(opts), "-D WG=8 -D CLMLA_TEST_BINARIES=%zu", i);
        CHECK_STATUS(build_program(ctx, "rmsnorm", opts), CLMLA_SUCCESS, ctx);
        const int want = cases[i].want >= 0 ? cases[i].want : !clmla_device_pocl_cpu(&ctx->info);
        /* auto is decided when the context is made: a test that plays another kind of device
           afterwards (as test_layer and test_kernel_tuning do) does not change it */
        const clmla_device_kind real = ctx->info.kind;
        ctx->info.kind = real == CLMLA_DEVICE_KIND_CPU ? CLMLA_DEVICE_KIND_GPU : CLMLA_DEVICE_KIND_CPU;
        snprintf(opts, sizeof(opts), "-D WG=16 -D CLMLA_TEST_BINARIES=%zu", i);
        CHECK_STATUS(build_program(ctx, "rmsnorm", opts), CLMLA_SUCCESS, ctx);
        ctx->info.kind = real;
        const clmla_program_stats s = stats_of(ctx);
        CHECK((int)s.disk_written == 2 * want && s.built_from_source == 2,
              "env '%s' option '%s' on %s: %llu binaries written of 2, want %d each", cases[i].env ? cases[i].env : "(unset)",
              cases[i].option ? cases[i].option : "(NULL)", ctx->info.platform_name,
              (unsigned long long)s.disk_written, want);
        clmla_context_destroy(ctx);
    }
    setenv("CLMLA_PROGRAM_BINARIES", "on", 1);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

int main(void)
{
    /* The disk cache's own tests keep binaries on every device (PoCL's CPU device too). */
    setenv("CLMLA_PROGRAM_BINARIES", "on", 1);
    test_program_binaries();
    test_status_strings();
    test_device_choice();
    test_options();
    test_log();
    test_disk_cache();
    test_build_errors();
    return check_summary();
}
