/* The clmla command: a thin client of the public API. */
#include "clmla.h"
#include "commands.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"devices", cmd_devices, "list the OpenCL devices and the one the default spec picks"},
    {"run", cmd_run, "one attention layer of a Hugging Face model folder: X.npy in, Y.npy out"},
    {"demo", cmd_demo, "DeepSeek-V2-Lite attention with random weights: prefill, decode, check"},
    {"tune", cmd_tune, "search CLBlast's SGEMM parameters for a device and save the fastest"},
    {"kernels", cmd_kernels, "the programs and build options clmla would build on a profiled device"},
};

static void usage(FILE *out)
{
    fprintf(out, "clmla %s: Multi-head Latent Attention on OpenCL devices\n\nusage: clmla COMMAND [options]\n\ncommands:\n",
            clmla_version_string());
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nEvery command takes --device SPEC and --help. SPEC is P:D, an index, gpu/cpu/accelerator,\n"
                 "or part of a platform, vendor or device name; CLMLA_DEVICE sets the default.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("clmla %s\n", clmla_version_string());
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc, argv);
    fprintf(stderr, "clmla: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
