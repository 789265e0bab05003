/* CLMLA_TRACE and clmla_context_options.trace (host/runtime/trace.h): a context that traces writes,
 * by its destruction, one line per command it enqueued, each with 8 columns and timestamps in order;
 * the counts match what was run (clmla_linear_forward: one write of x, its product's kernels, one
 * read of y); past 1024 pending commands the trace is written out mid-run and says so, losing
 * none; the environment variable works as the option does and the option "" turns it off; an
 * unwritable path leaves the context working, with a warning that names CLMLA_TRACE, and so does a
 * caller's queue without profiling; two contexts in two threads tracing into one file leave whole
 * lines.
 * `test_trace PART...` runs the named parts. */
#include "check.h"
#include "clmla.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct trace_counts {
    int lines, kernels, writes, reads, clblast, paused, bad, contexts;
} trace_counts;

/* Reads a trace file; bad counts lines that are not 8 columns with ordered timestamps. */
static trace_counts read_trace(const char *path)
{
    trace_counts c;
    memset(&c, 0, sizeof(c));
    FILE *f = fopen(path, "r");
    if (!f)
        return c;
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#') {
            c.paused += strstr(line, "the host waited here") != NULL;
            c.contexts += strncmp(line, "# context ", 10) == 0 && strstr(line, "kind") == NULL;
            continue;
        }
        int id = -1;
        char kind[16], name[128], size[64];
        unsigned long long q = 0, s = 0, b = 0, e = 0;
        if (sscanf(line, "%d\t%15[^\t]\t%127[^\t]\t%63[^\t]\t%llu\t%llu\t%llu\t%llu", &id, kind, name, size, &q, &s, &b,
                   &e) != 8 ||
            id < 0 || !(q <= s && s <= b && b <= e)) {
            c.bad++;
            if (c.bad <= 3)
                printf("# not a trace line, or timestamps out of order: %s", line);
            continue;
        }
        c.lines++;
        c.kernels += strcmp(kind, "kernel") == 0;
        c.writes += strcmp(kind, "write") == 0;
        c.reads += strcmp(kind, "read") == 0;
        c.clblast += strcmp(kind, "clblast") == 0;
    }
    fclose(f);
    return c;
}

static char path[256];
static char warnings[4096];

static void on_log(void *user, clmla_log_level level, const char *message)
{
    (void)user;
    if (level == CLMLA_LOG_WARNING)
        snprintf(warnings + strlen(warnings), sizeof(warnings) - strlen(warnings), "%s\n", message);
}

/* A context (options.trace = trace, NULL: the environment's), `forwards` products of one row
   through clmla_linear_forward, then destroyed. 0 when there is no device. */
static int run_logged(const char *trace, int forwards, int logged)
{
    clmla_context_options o;
    memset(&o, 0, sizeof(o));
    o.trace = trace;
    if (logged) {
        o.log = on_log;
        o.log_level = CLMLA_LOG_WARNING;
        warnings[0] = '\0';
    }
    clmla_context *ctx = NULL;
    if (clmla_context_create_opts(&o, &ctx) != CLMLA_SUCCESS)
        return 0;
    enum { N = 24, K = 40 };
    float w[N * K], x[K], y[N];
    for (int i = 0; i < N * K; i++)
        w[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    for (int i = 0; i < K; i++)
        x[i] = (float)i / K;
    const clmla_tensor t = {w, 2, {N, K}, CLMLA_DTYPE_F32, NULL};
    clmla_linear *lin = NULL;
    CHECK_STATUS(clmla_linear_create(ctx, &t, &lin), CLMLA_SUCCESS, ctx);
    for (int i = 0; lin && i < forwards; i++)
        CHECK_STATUS(clmla_linear_forward(lin, 1, x, y), CLMLA_SUCCESS, ctx);
    double want = 0.0;
    for (int k = 0; k < K; k++)
        want += (double)w[k] * x[k];
    CHECK(lin && y[0] > want - 1e-5 && y[0] < want + 1e-5, "y[0] %g, expected %g", y[0], want);
    clmla_linear_destroy(lin);
    clmla_context_destroy(ctx);
    return 1;
}

static int run(const char *trace, int forwards)
{
    return run_logged(trace, forwards, 1);
}

static void *run_thread(void *arg)
{
    (void)arg;
    run_logged(path, 400, 0);
    return NULL;
}

/* Two contexts in two threads tracing into one file: whole lines, none lost. */
static void test_threads(void)
{
    remove(path);
    pthread_t a, b;
    const int ok = pthread_create(&a, NULL, run_thread, NULL) == 0 && pthread_create(&b, NULL, run_thread, NULL) == 0;
    CHECK(ok, "pthread_create");
    if (!ok)
        return;
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    const trace_counts c = read_trace(path);
    printf("# two threads, 400 forwards each: %d lines, %d contexts, %d bad\n", c.lines, c.contexts, c.bad);
    CHECK(c.bad == 0 && c.contexts == 2 && c.reads == 800, "%d bad lines, %d contexts, %d reads for 800 forwards", c.bad,
          c.contexts, c.reads);
}

static int have_device(void)
{
    clmla_context *ctx = NULL;
    if (clmla_context_create(NULL, &ctx) != CLMLA_SUCCESS)
        return 0;
    clmla_context_destroy(ctx);
    return 1;
}

static void test_records(void)
{
    remove(path);
    run(path, 5);
    const trace_counts c = read_trace(path);
    printf("# 5 forwards: %d lines (%d kernels, %d clblast, %d writes, %d reads), %d bad\n", c.lines, c.kernels,
           c.clblast, c.writes, c.reads, c.bad);
    CHECK(c.bad == 0, "%d bad lines", c.bad);
    CHECK(c.contexts == 1, "%d context lines", c.contexts);
    /* the weight's upload is a write too (linear create), so 5 or more */
    CHECK(c.writes >= 5 && c.reads == 5, "%d writes, %d reads for 5 forwards", c.writes, c.reads);
    CHECK(c.kernels + c.clblast >= 5, "%d kernels and %d CLBlast calls for 5 forwards", c.kernels, c.clblast);

    run(path, 2); /* appended, as a second context */
    const trace_counts d = read_trace(path);
    CHECK(d.contexts == 2 && d.reads == 7, "after a second context: %d contexts, %d reads", d.contexts, d.reads);
}

static void test_full(void)
{
    remove(path);
    const int forwards = 700; /* at least 3 commands each: past 1024 pending */
    run(path, forwards);
    const trace_counts c = read_trace(path);
    printf("# %d forwards: %d lines, written out mid-run %d times\n", forwards, c.lines, c.paused);
    CHECK(c.bad == 0, "%d bad lines", c.bad);
    CHECK(c.paused >= 1, "no mid-run write-out in %d lines", c.lines);
    CHECK(c.reads == forwards, "%d reads for %d forwards: commands lost", c.reads, forwards);
}

static void test_env(void)
{
    remove(path);
    setenv("CLMLA_TRACE", path, 1);
    run(NULL, 3);
    const trace_counts c = read_trace(path);
    CHECK(c.reads == 3 && c.bad == 0, "CLMLA_TRACE: %d reads for 3 forwards, %d bad", c.reads, c.bad);
    remove(path);
    run("", 3); /* the option turns the variable off */
    CHECK(access(path, F_OK) != 0, "options.trace \"\" wrote %s all the same", path);
    unsetenv("CLMLA_TRACE");
    run(NULL, 3);
    CHECK(access(path, F_OK) != 0, "no CLMLA_TRACE, no option: %s written", path);
}

static void test_unwritable(void)
{
    run("/nonexistent-directory-for-clmla/trace.tsv", 2);
    printf("# warnings: %s", warnings);
    CHECK(strstr(warnings, "CLMLA_TRACE") && strstr(warnings, "/nonexistent-directory-for-clmla/trace.tsv"),
          "the warning names the variable and the path: \"%s\"", warnings);
}

/* A caller's queue without profiling: no trace (a warning says why), and the context works. */
static void test_no_profiling(void)
{
    clmla_context *owner = NULL;
    if (clmla_context_create(NULL, &owner) != CLMLA_SUCCESS)
        return;
    clmla_device_info info;
    clmla_context_device(owner, &info);
    cl_int err = CL_SUCCESS;
    cl_command_queue q = clCreateCommandQueue(clmla_context_cl_context(owner), info.device_id, 0, &err);
    CHECK(q && err == CL_SUCCESS, "clCreateCommandQueue: %d", err);
    if (q) {
        remove(path);
        clmla_context_options o;
        memset(&o, 0, sizeof(o));
        o.trace = path;
        o.log = on_log;
        o.log_level = CLMLA_LOG_WARNING;
        warnings[0] = '\0';
        clmla_context *ctx = NULL;
        CHECK_STATUS(clmla_context_create_from_queue_opts(q, &o, &ctx), CLMLA_SUCCESS, NULL);
        const float w[6] = {1, 2, 3, 4, 5, 6}, x[3] = {1, 1, 1};
        float y[2] = {0, 0};
        const clmla_tensor t = {w, 2, {2, 3}, CLMLA_DTYPE_F32, NULL};
        clmla_linear *lin = NULL;
        CHECK_STATUS(clmla_linear_create(ctx, &t, &lin), CLMLA_SUCCESS, ctx);
        if (lin)
            CHECK_STATUS(clmla_linear_forward(lin, 1, x, y), CLMLA_SUCCESS, ctx);
        CHECK(y[0] == 6.0f && y[1] == 15.0f, "y %g %g, expected 6 15", y[0], y[1]);
        clmla_linear_destroy(lin);
        clmla_context_destroy(ctx);
        CHECK(strstr(warnings, "CLMLA_TRACE") && strstr(warnings, "profiling"), "the warning: \"%s\"", warnings);
        CHECK(access(path, F_OK) != 0, "a queue without profiling traced into %s", path);
        clReleaseCommandQueue(q);
    }
    clmla_context_destroy(owner);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } parts[] = {{"records", test_records}, {"full", test_full}, {"env", test_env}, {"unwritable", test_unwritable},
                 {"no-profiling", test_no_profiling}, {"threads", test_threads}};
    const int n = (int)(sizeof(parts) / sizeof(parts[0]));
    for (int a = 1; a < argc; a++) {
        int known = 0;
        for (int i = 0; i < n; i++)
            known |= strcmp(argv[a], parts[i].name) == 0;
        if (!known) {
            printf("unknown part '%s'\n", argv[a]);
            return 2;
        }
    }
    if (!have_device()) {
        printf("no OpenCL device: skipped\n");
        return 77;
    }
    snprintf(path, sizeof(path), "test_trace_%d.tsv", (int)getpid());
    for (int i = 0; i < n; i++) {
        int selected = argc == 1;
        for (int a = 1; a < argc; a++)
            selected |= strcmp(argv[a], parts[i].name) == 0;
        if (selected) {
            printf("# part %s\n", parts[i].name);
            parts[i].fn();
        }
    }
    remove(path);
    return check_summary();
}
