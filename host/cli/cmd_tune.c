/* clmla tune: searches CLBlast's Xgemm parameters (clmla_tune_xgemm) or clmla's own kernels'
   (clmla_tune_latent, clmla_tune_prefill, clmla_tune_products) for a device, prints the search as it
   goes, and saves the fastest as an entry that every later context on that device applies
   (include/clmla_tuning.h). The searches are the library's; this file parses, prints and saves. */
#include "args.h"
#include "clmla.h"
#include "clmla_tuning.h"
#include "commands.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* What clmla tune --help says of the command. */
static const char summary[] =
    "Searches the 16 parameters of CLBlast's Xgemm kernel (its SGEMM above the direct-kernel\n"
    "size) for a device: times the SGEMM with CLBlast's own values, then with each candidate\n"
    "(every candidate compiles once: seconds each on a CPU), keeps only exact results, and adds\n"
    "the fastest to a tuning file. Every later clmla context on that device applies it (set\n"
    "CLMLA_CLBLAST_TUNING=off to stop that). Nothing is written when CLBlast's own values win.";

static void print_values(const size_t *v)
{
    for (int i = 0; i < CLMLA_XGEMM_PARAMETERS; i++)
        printf("%s%s=%zu", i ? " " : "", clmla_xgemm_parameter_name(i), v[i]);
}

static void progress(void *user, int index, int total, const size_t *values, double gflops, const char *note)
{
    (void)user;
    printf("[%2d/%d] ", index, total);
    if (values)
        print_values(values);
    else
        printf("CLBlast's own values");
    if (gflops > 0)
        printf(": %.1f GFLOP/s\n", gflops);
    else
        printf(": skipped (%s)\n", note && *note ? note : "failed");
    fflush(stdout);
}

/* ---- clmla tune --kernels: the searches of clmla_tuning.h, printed as they go --------------------- */

#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* What the progress printer needs besides the event: the device, for the headers of the latent and
   prefill searches. */
typedef struct tune_print {
    const clmla_device_info *info;
    int products; /* the product searches' headers */
} tune_print;

static void kernel_progress(void *user, const clmla_tune_event *e)
{
    const tune_print *p = user;
    const int confirming = strcmp(e->stage, "confirmation") == 0;
    if (e->kind == CLMLA_TUNE_STAGE) {
        if (confirming)
            printf("confirmation (%d alternation%s):\n", e->total / 2, e->total > 2 ? "s" : "");
        else if (p->products)
            printf("\n%s: %d candidates, %s\n", e->stage, e->total, e->detail);
        else
            printf("\ntuning %s on %s (%s, %s, driver %s): %s, %d candidates\n", e->stage, p->info->name, p->info->vendor,
                   p->info->platform_name, p->info->driver_version, e->detail, e->total);
    } else if (e->kind == CLMLA_TUNE_CANDIDATE) {
        printf("[%2d/%d] %s", e->index, e->total, e->label);
        if (!e->timed)
            printf("  refused: %s\n", e->note ? e->note : "failed");
        else {
            const int current = confirming ? e->index % 2 == 1 : e->index == 1;
            char err[32]; /* the difference from the default parameters' output; 0 where it is the same */
            snprintf(err, sizeof(err), e->error > 0 ? "%.1e" : "0", e->error);
            if (e->time_names) {
                printf("  err %s", err);
                for (int i = 0; i < e->num_times; i++)
                    printf("  %s %9.1f us", e->time_names[i], e->times[i]);
            } else {
                for (int i = 0; i < e->num_times; i++)
                    printf("  %.0f", e->times[i]);
                printf("  err %s", err);
            }
            printf("  (%.3f of the current)%s\n", e->ratio, current ? " current" : "");
        }
    } else
        printf("best: %s (%.3f of the current)\n", e->label, e->ratio);
    fflush(stdout);
}

/* The tuning file `clmla tune` writes into path: --out, else the one the library reads (xgemm:
   CLMLA_CLBLAST_TUNING's for CLBlast's parameters, else CLMLA_KERNEL_TUNING's for clmla's kernels;
   else the cache folder's). 0, else the command's exit code (the reason printed): 1 the path is too
   long, 2 there is none and this is no dry run. */
static int tuning_target(const char *out, int dry_run, int xgemm, char *path, size_t size)
{
    if (out)
        snprintf(path, size, "%s", out);
    else if ((xgemm ? clmla_xgemm_tuning_path(path, size) : clmla_latent_tuning_path(path, size)) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        return 1;
    }
    if (!dry_run && !path[0]) {
        fprintf(stderr, "clmla tune: %s, or use --dry-run\n",
                xgemm ? "no tuning file to write (no cache folder: set --out, CLMLA_CLBLAST_TUNING or CLMLA_CACHE_DIR)"
                      : "no kernel tuning file to write (set --out, CLMLA_KERNEL_TUNING or CLMLA_CACHE_DIR)");
        return 2;
    }
    return 0;
}

/* The exit code for a search's failure (said): 2 for a refused option, else 1. */
static int tune_failed(clmla_context *ctx, clmla_status st)
{
    fprintf(stderr, "clmla tune: %s\n", clmla_last_error(ctx));
    return st == CLMLA_ERROR_INVALID_ARGUMENT ? 2 : 1;
}

typedef struct kernel_job {
    const char *device, *out;
    int heads, ctx_len, quick, dry_run;
} kernel_job;

static void job_options(const kernel_job *j, tune_print *p, clmla_kernel_tune_options *o)
{
    memset(o, 0, sizeof(*o));
    o->quick = j->quick;
    o->heads = j->heads;
    o->ctx_len = j->ctx_len;
    o->progress = kernel_progress;
    o->user = p;
}

/* Creates the job's context (1, said, where it cannot) and the options of its searches, which
   report through *p (products: the product searches' form). */
static int job_start(const kernel_job *j, int products, clmla_context **ctx, clmla_device_info *info, tune_print *p,
                     clmla_kernel_tune_options *o)
{
    if (cli_context_create("tune", j->device, ctx, info))
        return 1;
    *p = (tune_print){info, products};
    job_options(j, p, o);
    return 0;
}

/* Ends a search's context: 0 where the search succeeded, else its exit code (said). */
static int job_end(clmla_context *ctx, clmla_status st)
{
    const int rc = st == CLMLA_SUCCESS ? 0 : tune_failed(ctx, st);
    clmla_context_destroy(ctx);
    return rc;
}

/* A latent_job's device, result and the time its search began. */
typedef struct latent_run {
    clmla_device_info info;
    clmla_latent_tune_result r;
    double start;
} latent_run;

/* Runs the latent kernel's search (clmla_tune_latent at cache dtype `dtype`) or, where `prefill`,
   the prefill tiles' (clmla_tune_prefill from `from`) on the job's device: 0 with *run filled, else
   the exit code (said). */
static int latent_job(const kernel_job *j, int prefill, clmla_cache_dtype dtype, const clmla_latent_tuning *from,
                      latent_run *run)
{
    clmla_context *ctx = NULL;
    tune_print p;
    clmla_kernel_tune_options o;
    run->start = 0;
    if (job_start(j, 0, &ctx, &run->info, &p, &o))
        return 1;
    if (prefill)
        o.from = from;
    else
        o.cache_dtype = dtype;
    run->start = now_s();
    const clmla_status st = prefill ? clmla_tune_prefill(ctx, &o, &run->r) : clmla_tune_latent(ctx, &o, &run->r);
    return job_end(ctx, st);
}

/* Saves the latent entry `best` for the job's head count, with `note`, to path: 0, or 1 (said). */
static int save_latent(const kernel_job *j, const char *path, const clmla_device_info *info,
                       const clmla_latent_tuning *best, const char *note)
{
    if (clmla_latent_tuning_save(path, info, j->heads, best, note) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        return 1;
    }
    printf("saved to %s\n", path);
    return 0;
}

/* The latent kernel's parameters (clmla_tune_latent), what it chose (saved or not) in *chosen. */
static int tune_kernels(const kernel_job *j, clmla_cache_dtype dtype, clmla_latent_tuning *chosen)
{
    char path[4096];
    const int bad = tuning_target(j->out, j->dry_run, 0, path, sizeof(path));
    if (bad)
        return bad;
    latent_run run;
    const int failed = latent_job(j, 0, dtype, NULL, &run);
    if (failed)
        return failed;
    printf("%.0f s; batch 1 %.1f us, batch 8 %.1f us against %.1f and %.1f with the current parameters (%s)\n",
           now_s() - run.start, run.r.best_us[0], run.r.best_us[1], run.r.base_us[0], run.r.base_us[1], run.r.source);
    *chosen = run.r.best;
    if (j->dry_run)
        return 0;
    char note[256];
    snprintf(note, sizeof(note), "ctx %d: batch 1 %.1f us, batch 8 %.1f us; current (%s) %.1f, %.1f us",
             j->quick ? 512 : j->ctx_len, run.r.best_us[0], run.r.best_us[1], run.r.source, run.r.base_us[0],
             run.r.base_us[1]);
    return save_latent(j, path, &run.info, &run.r.best, note);
}

/* The product kernels' parameters (clmla_tune_products), each class of K into its entry. */
static int tune_products(const kernel_job *j)
{
    char path[4096];
    const int bad = tuning_target(j->out, j->dry_run, 0, path, sizeof(path));
    if (bad)
        return bad;
    clmla_context *ctx = NULL;
    clmla_device_info info;
    tune_print p;
    clmla_kernel_tune_options o;
    if (job_start(j, 1, &ctx, &info, &p, &o))
        return 1;
    const int cpu = cli_runs_row_products(&info);
    printf("tuning the product kernels on %s (%s, %s, driver %s): %s\n", info.name, info.vendor, info.platform_name,
           info.driver_version,
           cpu ? "gemm_packed_rows at 1 row, gemm_tiled_rows at prefill rows" : "gemm_skinny_nt at 1 row");
    const double start = now_s();
    int rc = 0;
    for (int cls = 0; cls < (j->quick ? 1 : 2) && rc == 0; cls++) {
        const size_t k = cls == 0 ? 2048 : 7168;
        clmla_product_tune_result r;
        printf("\nK %s 4096 (k_class \"%s\")\n", cls == 0 ? "<=" : ">", cls == 0 ? "small" : "large");
        const clmla_status st = clmla_tune_products(ctx, &o, k, &r);
        if (st != CLMLA_SUCCESS) {
            rc = tune_failed(ctx, st);
            break;
        }
        printf("current parameters from %s\n", r.source);
        if (j->dry_run)
            continue;
        char note[512];
        int len = snprintf(note, sizeof(note), "batch 1: %.3f of the current (%s)", r.ratio, r.source);
        if (r.tiled_rows > 0 && len > 0 && (size_t)len < sizeof(note))
            snprintf(note + len, sizeof(note) - (size_t)len, "; %d rows: %.3f", r.tiled_rows, r.tiled_ratio);
        len = (int)strlen(note);
        if (r.nn_ratio > 0 && (size_t)len < sizeof(note))
            snprintf(note + len, sizeof(note) - (size_t)len, "; per-head x W^UK in a decode step: %.3f", r.nn_ratio);
        if (clmla_product_tuning_save(path, &info, k, &r.best, note) != CLMLA_SUCCESS) {
            fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
            rc = 1;
        } else
            printf("saved the \"%s\" entry to %s\n", cls == 0 ? "small" : "large", path);
    }
    printf("\n%.0f s\n", now_s() - start);
    clmla_context_destroy(ctx);
    return rc;
}

/* The decompressed path's attention tiles (clmla_tune_prefill). `implied`: run because no part was
   named (a head count other than 16 or 128 is then skipped with a note instead of refused).
   `from`: the latent parameters the latent search of the same command just chose, which the saved
   entry keeps (NULL: those in force). */
static int tune_prefill(const kernel_job *j, int implied, const clmla_latent_tuning *from)
{
    char path[4096];
    const int bad = tuning_target(j->out, j->dry_run, 0, path, sizeof(path));
    if (bad)
        return bad;
    if (j->heads != 16 && j->heads != 128 && implied) {
        printf("\nthe prefill tiles: not tuned, --prefill times 16 or 128 heads\n");
        return 0;
    }
    if (j->heads != 16 && j->heads != 128) {
        fprintf(stderr, "clmla tune: --prefill times a V2-Lite (--heads 16) or V3 (--heads 128) layer, not %d heads\n",
                j->heads);
        return 2;
    }
    latent_run run;
    const int failed = latent_job(j, 1, CLMLA_CACHE_F32, from, &run);
    if (failed)
        return failed;
    const char *source = from ? "the latent search's choice" : run.r.source;
    printf("%.0f s; %.3f of the current (%s)\n", now_s() - run.start, run.r.ratio, source);
    if (j->dry_run)
        return 0;
    /* the prompt, chunk and prefix clmla_tune_prefill times (clmla_tuning.h) */
    const int prompt = j->quick ? 80 : (j->ctx_len < 2048 ? j->ctx_len : 2048), chunk = j->quick ? 40 : 512;
    const int prefix = j->quick ? 100 : j->ctx_len;
    char note[256];
    snprintf(note, sizeof(note), "prefill %d tokens %.0f us, %d after %d %.0f us (%.3f of %s)", prompt,
             run.r.best_us[0], chunk, prefix, run.r.best_us[1], run.r.ratio, source);
    return save_latent(j, path, &run.info, &run.r.best, note);
}

/* --export: the parameters that apply to the device now (the user file, the built-in table or the
   defaults), for V2-Lite's 16 heads and V3's 128 and for both shape classes of K, written into the
   tuning file as whole entries, every parameter named: a file to edit and try (CLMLA_KERNEL_TUNING),
   whose entries then hold what the device ran rather than the defaults for what they leave out. */
static int export_kernels(const char *device, int dry_run, const char *out)
{
    char path[4096];
    const int bad = tuning_target(out, dry_run, 0, path, sizeof(path));
    if (bad)
        return bad;
    clmla_device_info *devs = NULL, info;
    size_t count = 0, index = 0;
    if (clmla_devices_list(&devs, &count) != CLMLA_SUCCESS || clmla_device_resolve(device, &index) != CLMLA_SUCCESS ||
        index >= count) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        clmla_free(devs);
        return 1;
    }
    info = devs[index];
    clmla_free(devs);
    static const int heads[] = {16, 128};
    static const size_t ks[] = {2048, 7168};
    for (int i = 0; i < 4; i++) {
        const char *source = NULL;
        char note[256];
        clmla_status st;
        if (i < 2) {
            clmla_latent_tuning t;
            if (clmla_latent_tuning_lookup(&info, heads[i], &t, &source) != CLMLA_SUCCESS)
                printf("warning: %s\n", clmla_last_error(NULL));
            snprintf(note, sizeof(note), "exported from %s", source);
            st = dry_run ? CLMLA_SUCCESS : clmla_latent_tuning_save(path, &info, heads[i], &t, note);
            printf("attn_latent, %d heads: %s\n", heads[i], source);
        } else {
            clmla_product_tuning t;
            if (clmla_product_tuning_lookup(&info, ks[i - 2], &t, &source) != CLMLA_SUCCESS)
                printf("warning: %s\n", clmla_last_error(NULL));
            snprintf(note, sizeof(note), "exported from %s", source);
            st = dry_run ? CLMLA_SUCCESS : clmla_product_tuning_save(path, &info, ks[i - 2], &t, note);
            printf("products, K %s 4096: %s\n", i == 2 ? "<=" : "> ", source);
        }
        if (st != CLMLA_SUCCESS) {
            fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
            return 1;
        }
    }
    if (!dry_run)
        printf("written to %s\n", path);
    return 0;
}

int cmd_tune(int argc, char **argv)
{
    int exit_code = 0, size = 1024, candidates = 40, dry_run = 0, kernels = 0, heads = 16, ctx_len = 4096, quick = 0;
    int latent = 0, products = 0, prefill = 0, export_tuning = 0;
    double max_seconds = 0;
    const char *device = NULL, *out = NULL, *cache_dtype = "f32";
    cli_option opts[] = {
        {"device", CLI_STRING, &device, "SPEC  device to tune (see clmla devices)"},
        {"size", CLI_INT, &size, "N  time the row-major N x N x N SGEMM (default 1024)"},
        {"candidates", CLI_INT, &candidates, "K  parameter sets to try, most promising first (default 40)"},
        {"max-seconds", CLI_DOUBLE, &max_seconds, "S  try no new candidate after S seconds (default: no limit)"},
        {"out", CLI_STRING, &out, "FILE  tuning file to add the entry to (default: CLMLA_CLBLAST_TUNING, else\n"
                                  "                       <cache dir>/clblast-tuning.json, which contexts read)"},
        {"dry-run", CLI_FLAG, &dry_run, "measure and print, write nothing"},
        {"kernels", CLI_FLAG, &kernels, "tune clmla's own kernels instead of CLBlast (default file:\n"
                                        "                       CLMLA_KERNEL_TUNING, else <cache dir>/kernel-tuning.json)"},
        {"latent", CLI_FLAG, &latent, "with --kernels: the latent attention kernel (alone unless --products)"},
        {"products", CLI_FLAG, &products, "with --kernels: the product kernels, decode and prefill-sized"},
        {"prefill", CLI_FLAG, &prefill, "with --kernels: the decompressed path's attention tiles (attn_prefill_tiled\n"
                                        "                       or, on CPUs, attn_prefill_rows); none of the three\n"
                                        "                       flags: all three"},
        {"heads", CLI_INT, &heads, "H  with --kernels: attention heads (default 16, V2-Lite; 128: V3)"},
        {"ctx", CLI_INT, &ctx_len, "N  with --kernels: keys per sequence timed (default 4096; --prefill: the\n"
                                   "                       prefix of a 512-token chunk, and a prompt of up to 2048)"},
        {"cache-dtype", CLI_STRING, &cache_dtype, "f16|bf16|fp8  with --kernels --latent: time over a cache of that\n"
                                                  "                       dtype and tune group_decode_heads alone (GPUs)"},
        {"export", CLI_FLAG, &export_tuning, "with --kernels --out FILE: measure nothing, write the parameters that\n"
                                             "                       apply to the device now (16 and 128 heads, both K classes)\n"
                                             "                       into FILE as whole entries, to edit and try"},
        {"quick", CLI_FLAG, &quick, "with --kernels: a small grid (latent: two candidates at ctx 512; products:\n"
                                    "                       V2-Lite's o_proj, f32 and bf16, 128 prefill rows;\n"
                                    "                       prefill: three or four candidates, a prompt of 80)"},
        {NULL, CLI_FLAG, NULL, NULL},
    };
    if (cli_start("tune", summary, opts, argc, argv, &exit_code))
        return exit_code;
    if (export_tuning && !kernels) {
        fprintf(stderr, "clmla tune: --export goes with --kernels\n");
        return 2;
    }
    if (kernels && export_tuning && !out && !dry_run) {
        /* the default file is the one every context reads: whole entries written there would pin the
           parameters of now over the built-in table's later ones without the user having chosen it */
        fprintf(stderr, "clmla tune: --export needs --out FILE: its whole entries would take precedence over the "
                        "built-in table wherever the file is read; try them with CLMLA_KERNEL_TUNING=FILE\n");
        return 2;
    }
    if (kernels && export_tuning)
        return export_kernels(device, dry_run, out);
    if (kernels) {
        if (heads < 1 || heads > 1024 || ctx_len < 64 || ctx_len > 65536) {
            fprintf(stderr, "clmla tune: --heads must be 1..1024 and --ctx 64..65536\n");
            return 2;
        }
        const int dtype = cli_cache_dtype(cache_dtype);
        if (dtype < 0) {
            fprintf(stderr, "clmla tune: --cache-dtype must be f32, f16, bf16 or fp8, not '%s'\n", cache_dtype);
            return 2;
        }
        if (dtype != 0 && (!latent || products || prefill)) {
            fprintf(stderr, "clmla tune: --cache-dtype goes with --kernels --latent alone\n");
            return 2;
        }
        const int implied = !latent && !products && !prefill;
        if (implied)
            latent = products = prefill = 1;
        const kernel_job job = {device, out, heads, ctx_len, quick, dry_run};
        clmla_latent_tuning chosen;
        int rc = latent ? tune_kernels(&job, (clmla_cache_dtype)dtype, &chosen) : 0;
        if (rc == 0 && prefill)
            rc = tune_prefill(&job, implied, latent ? &chosen : NULL);
        if (rc == 0 && products)
            rc = tune_products(&job);
        return rc;
    }
    if (size < 16 || size > 8192 || candidates < 1) {
        fprintf(stderr, "clmla tune: --size must be 16..8192 and --candidates at least 1\n");
        return 2;
    }
    char path[4096];
    const int bad = tuning_target(out, dry_run, 1, path, sizeof(path));
    if (bad)
        return bad;
    if (!dry_run) { /* fail before minutes of tuning, not after */
        char folder[4096];
        snprintf(folder, sizeof(folder), "%s", path);
        char *slash = strrchr(folder, '/');
        if (slash)
            *(slash == folder ? slash + 1 : slash) = '\0';
        else
            snprintf(folder, sizeof(folder), ".");
        struct stat s;
        if (stat(folder, &s) != 0 || !S_ISDIR(s.st_mode)) {
            fprintf(stderr, "clmla tune: cannot write %s: folder %s does not exist\n", path, folder);
            return 1;
        }
    }
    /* Measure against CLBlast's own values, not an entry applied earlier. */
    setenv("CLMLA_CLBLAST_TUNING", "off", 1);
    clmla_context *ctx = NULL;
    clmla_device_info info;
    if (cli_context_create("tune", device, &ctx, &info))
        return 1;
    printf("tuning CLBlast Xgemm on %s (%s, %s), SGEMM %d x %d x %d\n", info.name, info.vendor, info.platform_name,
           size, size, size);
    clmla_tune_options o = {size, candidates, max_seconds, progress, NULL};
    clmla_xgemm_tuning best;
    clmla_status st = clmla_tune_xgemm(ctx, &o, &best);
    if (st != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(ctx));
        clmla_context_destroy(ctx);
        return 1;
    }
    clmla_context_destroy(ctx);
    printf("\nbest: ");
    print_values(best.values);
    printf("\n      %.1f GFLOP/s against %.1f with CLBlast's own values (%.2fx)\n", best.gflops, best.default_gflops,
           best.default_gflops > 0 ? best.gflops / best.default_gflops : 0.0);
    if (best.gflops <= best.default_gflops) {
        printf("CLBlast's own values are faster: nothing written\n");
        return 0;
    }
    if (dry_run)
        return 0;
    if (clmla_xgemm_tuning_save(path, &best) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        return 1;
    }
    printf("saved to %s\n", path);
    return 0;
}
