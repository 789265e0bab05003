/* Kernel programs: source lookup (embedded or CLMLA_KERNEL_DIR), build, and the two caches. */
#ifndef CLMLA_PROGRAM_H
#define CLMLA_PROGRAM_H
#include "internal.h"

/* The built program of cl/<name>.cl with build options; owned by the context's cache (do not
   release). On a compile error returns CLMLA_ERROR_BUILD_FAILED with the log in ctx's message. */
clmla_status clmla_program_get(clmla_context *ctx, const char *name, const char *options, cl_program *program);

/* A new kernel object (the caller releases it) from clmla_program_get's program. */
clmla_status clmla_kernel_create(clmla_context *ctx, const char *name, const char *options,
                                 const char *kernel_name, cl_kernel *kernel);

void clmla_program_cache_release(clmla_context *ctx);
#endif
