/* Command-line options shared by every clmla subcommand: --name VALUE, --name=VALUE, --flag. */
#ifndef CLMLA_CLI_ARGS_H
#define CLMLA_CLI_ARGS_H
#include "clmla.h"

#include <stddef.h>

typedef enum { CLI_FLAG, CLI_STRING, CLI_INT, CLI_DOUBLE } cli_kind;

typedef struct cli_option {
    const char *name;  /* without the dashes: "device" */
    cli_kind kind;
    void *value;       /* int* for FLAG and INT, const char** for STRING, double* for DOUBLE */
    const char *help;  /* "SPEC  device to use (see clmla devices)" */
} cli_option;

/* Parses a subcommand's arguments, argv[2..argc), against opts (a {NULL}-terminated array; --device
   is expected among them) and --help, which prints the usage: `summary`, then every option. Returns
   0 when the command goes on, else 1 with the status the command exits with in *exit_code: 0 after
   the usage, 2 after a message on stderr. */
int cli_start(const char *command, const char *summary, cli_option *opts, int argc, char **argv, int *exit_code);
/* A context on the device spec (NULL: the default), with CLBlast's parameters overridden from
   the tuning entries ("auto") unless CLMLA_CLBLAST_TUNING says otherwise: a clmla command is a
   process of its own, so nobody else's CLBlast parameters are at stake. Its device's description
   goes to *info (unless NULL). Returns 0, or says why not ("clmla COMMAND: ...") and returns 1. */
int cli_context_create(const char *command, const char *device, clmla_context **ctx, clmla_device_info *info);

/* The cache dtype named "f32", "f16", "bf16" or "fp8"; -1 for any other name. */
int cli_cache_dtype(const char *name);
/* The name of a clmla_cache_dtype ("?" for none). */
const char *cli_cache_dtype_name(int dtype);

/* Whether the device runs the row-walking attention kernels (attn_latent_rows, attn_prefill_rows):
   CLMLA_ATTENTION_KERNELS, which the commands' contexts take, when it names "rows" or "group", else
   whether the device is a CPU (the library's "auto"). */
int cli_runs_row_kernels(const clmla_device_info *info);
/* The same for the products (the CPU forms or the work-group ones), from CLMLA_PRODUCT_KERNELS. */
int cli_runs_row_products(const clmla_device_info *info);
#define CLI_CACHE_DTYPES "f32|f16|bf16|fp8"

/* The weights dtype named "auto" (CLMLA_WEIGHTS_AS_GIVEN: a checkpoint's own dtype; random
   weights are float32, so auto is f32 there), "f32", "f16", "bf16" or "fp8"; -1 for any other name. */
int cli_weights_dtype(const char *name);
#define CLI_WEIGHTS_DTYPES "auto|f32|f16|bf16|fp8"
#endif
