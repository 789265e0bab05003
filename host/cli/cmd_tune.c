/* clmla tune: searches CLBlast's Xgemm parameters for a device and saves the fastest as an entry
   that every later context on that device applies (include/clmla.h, "CLBlast tuning"). */
#include "args.h"
#include "clmla.h"
#include "commands.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

int cmd_tune(int argc, char **argv)
{
    int help = 0, size = 1024, candidates = 40, dry_run = 0;
    double max_seconds = 0;
    const char *device = NULL, *out = NULL;
    cli_option opts[] = {
        {"device", CLI_STRING, &device, "SPEC  device to tune (see clmla devices)"},
        {"size", CLI_INT, &size, "N  time the row-major N x N x N SGEMM (default 1024)"},
        {"candidates", CLI_INT, &candidates, "K  parameter sets to try, most promising first (default 40)"},
        {"max-seconds", CLI_DOUBLE, &max_seconds, "S  try no new candidate after S seconds (default: no limit)"},
        {"out", CLI_STRING, &out, "FILE  tuning file to add the entry to (default: CLMLA_CLBLAST_TUNING, else\n"
                                  "                       <cache dir>/clblast-tuning.json, which contexts read)"},
        {"dry-run", CLI_FLAG, &dry_run, "measure and print, write nothing"},
        {"help", CLI_FLAG, &help, "this text"},
        {NULL, CLI_FLAG, NULL, NULL},
    };
    if (cli_parse("tune", opts, argc, argv, 2))
        return 2;
    if (help) {
        cli_usage("tune",
                  "Searches the 16 parameters of CLBlast's Xgemm kernel (its SGEMM above the direct-kernel\n"
                  "size) for a device: times the SGEMM with CLBlast's own values, then with each candidate\n"
                  "(every candidate compiles once: seconds each on a CPU), keeps only exact results, and adds\n"
                  "the fastest to a tuning file. Every later clmla context on that device applies it (set\n"
                  "CLMLA_CLBLAST_TUNING=off to stop that). Nothing is written when CLBlast's own values win.",
                  opts);
        return 0;
    }
    if (size < 16 || size > 8192 || candidates < 1) {
        fprintf(stderr, "clmla tune: --size must be 16..8192 and --candidates at least 1\n");
        return 2;
    }
    char path[4096];
    if (out)
        snprintf(path, sizeof(path), "%s", out);
    else if (clmla_xgemm_tuning_path(path, sizeof(path)) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        return 1;
    }
    if (!dry_run && !path[0]) {
        fprintf(stderr, "clmla tune: no tuning file to write (no cache folder: set --out, CLMLA_CLBLAST_TUNING or "
                        "CLMLA_CACHE_DIR), or use --dry-run\n");
        return 2;
    }
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
    if (cli_context_create(device, &ctx) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        return 1;
    }
    clmla_device_info info;
    clmla_context_device(ctx, &info);
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
