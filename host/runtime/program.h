/* Kernel programs: source lookup (embedded or CLMLA_KERNEL_DIR), build, and the two caches. */
#ifndef CLMLA_PROGRAM_H
#define CLMLA_PROGRAM_H
#include "internal.h"

/* The built program of cl/<name>.cl with build options; owned by the context's cache (do not
   release). On a compile error returns CLMLA_ERROR_BUILD_FAILED with the log in ctx's message. */
clmla_status clmla_program_get(clmla_context *ctx, const char *name, const char *options, cl_program *program);

/* The fp8 decoder a context's kernels use (cl/prelude.cl; a test hook forces one: hooks.h):
   on CPUs the one through half precision, whose smallest codes never become float denormals (a
   CPU core may take a microcode assist on each vector that holds one: docs/perf-log.md); elsewhere
   the branch-free shift, or, where the device flushes float denormals, the rebiasing one. */
/* 1 where the device keeps float denormals (CL_DEVICE_SINGLE_FP_CONFIG), which the shift needs. */
int clmla_device_denormals(const clmla_context *ctx);
enum { CLMLA_FP8_DECODER_AUTO = 0, CLMLA_FP8_DECODER_SHIFT = 1, CLMLA_FP8_DECODER_HALF = 2, CLMLA_FP8_DECODER_REBIAS = 3 };
int clmla_fp8_decoder(const clmla_context *ctx);

/* The build option every kernel that decodes fp8 codes (the cache's and the weights') needs for
   that decoder: "", " -D CLMLA_FP8_HALF" or " -D CLMLA_NO_DENORMS". */
const char *clmla_fp8_option(const clmla_context *ctx);

/* A new kernel object (the caller releases it) from clmla_program_get's program. */
clmla_status clmla_kernel_create(clmla_context *ctx, const char *name, const char *options,
                                 const char *kernel_name, cl_kernel *kernel);

/* A kernel whose work-group size is a build option: `define` (e.g. "NT") is set to the number of
   items, tried from max_items down to min_items by halving, skipping sizes above the device's
   work-group limit or whose local memory, local_bytes(items, arg) when given, is more than the
   device has, and sizes the built kernel itself does not take (CL_KERNEL_WORK_GROUP_SIZE: its
   registers on a GPU). */
typedef struct clmla_kernel_fit {
    const char *file;        /* cl/<file>.cl */
    const char *kernel_name;
    const char *options;     /* the other build options */
    const char *define;
    int max_items, min_items;
    size_t (*local_bytes)(int items, const void *arg); /* NULL: no local-memory bound */
    const void *arg;
} clmla_kernel_fit;

/* The kernel (the caller releases it) and its items, or *kernel NULL (and success) where no size
   fits; a build failure returns its status. */
clmla_status clmla_kernel_create_fitted(clmla_context *ctx, const clmla_kernel_fit *fit, cl_kernel *kernel, int *items);

void clmla_program_cache_release(clmla_context *ctx);
#endif
