#include "args.h"
#include "clmla.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cli_option *find(cli_option *opts, const char *name, size_t len)
{
    for (cli_option *o = opts; o->name; o++)
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0)
            return o;
    return NULL;
}

/* Parses argv[2..argc) against opts and --help (into *help). Returns 0, or prints a message to stderr
   and returns 2. */
static int parse(const char *command, cli_option *opts, int argc, char **argv, int *help)
{
    cli_option help_option = {"help", CLI_FLAG, help, "this text"};
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(stderr, "clmla %s: unexpected argument '%s' (see --help)\n", command, arg);
            return 2;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        cli_option *o = find(opts, name, len);
        if (!o && len == 4 && strncmp(name, "help", 4) == 0)
            o = &help_option;
        if (!o) {
            fprintf(stderr, "clmla %s: unknown option '%s' (see --help)\n", command, arg);
            return 2;
        }
        if (o->kind == CLI_FLAG) {
            if (eq) {
                fprintf(stderr, "clmla %s: --%s takes no value\n", command, o->name);
                return 2;
            }
            *(int *)o->value = 1;
            continue;
        }
        const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!val) {
            fprintf(stderr, "clmla %s: --%s needs a value\n", command, o->name);
            return 2;
        }
        char *end = NULL;
        errno = 0;
        switch (o->kind) {
        case CLI_STRING:
            *(const char **)o->value = val;
            break;
        case CLI_INT: {
            long v = strtol(val, &end, 10);
            if (errno || end == val || *end || v < -2147483647L || v > 2147483647L) {
                fprintf(stderr, "clmla %s: --%s expects an integer, got '%s'\n", command, o->name, val);
                return 2;
            }
            *(int *)o->value = (int)v;
            break;
        }
        case CLI_DOUBLE: {
            double v = strtod(val, &end);
            if (errno || end == val || *end) {
                fprintf(stderr, "clmla %s: --%s expects a number, got '%s'\n", command, o->name, val);
                return 2;
            }
            *(double *)o->value = v;
            break;
        }
        default:
            break;
        }
    }
    return 0;
}

int cli_start(const char *command, const char *summary, cli_option *opts, int argc, char **argv, int *exit_code)
{
    int help = 0;
    *exit_code = parse(command, opts, argc, argv, &help);
    if (*exit_code || !help)
        return *exit_code != 0;
    printf("usage: clmla %s [options]\n\n%s\n\noptions:\n", command, summary);
    for (const cli_option *o = opts; o->name; o++)
        printf("  --%-14s %s\n", o->name, o->help);
    printf("  --%-14s %s\n", "help", "this text");
    return 1;
}

static const char *const cache_dtype_names[] = {"f32", "f16", "bf16", "fp8"}; /* clmla_cache_dtype's order */

int cli_cache_dtype(const char *name)
{
    static const int dtypes[] = {CLMLA_CACHE_F32, CLMLA_CACHE_F16, CLMLA_CACHE_BF16, CLMLA_CACHE_FP8};
    for (int i = 0; i < 4; i++)
        if (name && strcmp(name, cache_dtype_names[i]) == 0)
            return dtypes[i];
    return -1;
}

const char *cli_cache_dtype_name(int dtype)
{
    return dtype >= 0 && dtype < 4 ? cache_dtype_names[dtype] : "?";
}

/* "rows" or "group" in the variable, else whether the device is a CPU (the library's "auto") */
static int runs_rows(const char *variable, const clmla_device_info *info)
{
    const char *k = getenv(variable);
    if (k && strcmp(k, "rows") == 0)
        return 1;
    if (k && strcmp(k, "group") == 0)
        return 0;
    return info->kind == CLMLA_DEVICE_KIND_CPU;
}

int cli_runs_row_kernels(const clmla_device_info *info)
{
    return runs_rows("CLMLA_ATTENTION_KERNELS", info);
}

int cli_runs_row_products(const clmla_device_info *info)
{
    return runs_rows("CLMLA_PRODUCT_KERNELS", info);
}

int cli_weights_dtype(const char *name)
{
    static const char *const names[] = {"auto", "f32", "f16", "bf16", "fp8"};
    static const int dtypes[] = {CLMLA_WEIGHTS_AS_GIVEN, CLMLA_WEIGHTS_F32, CLMLA_WEIGHTS_F16, CLMLA_WEIGHTS_BF16,
                                 CLMLA_WEIGHTS_FP8};
    for (int i = 0; i < 5; i++)
        if (name && strcmp(name, names[i]) == 0)
            return dtypes[i];
    return -1;
}

int cli_context_create(const char *command, const char *device, clmla_context **ctx, clmla_device_info *info)
{
    const clmla_context_options o = {.device = device,
                                     .clblast_tuning = getenv("CLMLA_CLBLAST_TUNING") ? NULL : "auto"};
    if (clmla_context_create_opts(&o, ctx) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla %s: %s\n", command, clmla_last_error(NULL));
        return 1;
    }
    if (info)
        clmla_context_device(*ctx, info);
    return 0;
}
