/* Private declarations shared by the host files: the context and the error helpers. */
#ifndef CLMLA_INTERNAL_H
#define CLMLA_INTERNAL_H

#include "clmla.h"
#include "clmla_tuning.h"
#include "env.h"

#include <stdarg.h>

#define CLMLA_ERRMSG_SIZE 16384

typedef struct clmla_program_entry clmla_program_entry; /* program.c */

/* What the library has made on a context (clcall.h's clmla_cl_counts_get). */
typedef struct clmla_cl_counts {
    long buffers;         /* clCreateBuffer, clCreateSubBuffer (clmla_cl_buffer, clmla_cl_sub_buffer) */
    long programs;        /* clCreateProgramWithSource / WithBinary */
    long builds;          /* clBuildProgram */
    long kernels;         /* clCreateKernel */
    long events;          /* events of the library's own commands (clmla_cl_write_async), not its callers' */
    long events_released; /* of those, released (clmla_cl_event_done) */
    long host_allocs;     /* clmla_host_realloc: the host allocations the step path may make when it grows */
    long clblast_calls;   /* CLBlast routines run (gemm.c); each makes kernel objects of its own, in CLBlast,
                             which the counts above do not see */
    long calls;           /* the counted calls (clcall.h: allocations, transfers, launches) */
} clmla_cl_counts;

/* The kernel families a context runs (its attention_kernels and product_kernels options): work-group
   kernels that share rows through local memory (for GPUs) and row-walking kernels, one work-item
   per head, query block or row block (for CPUs); AUTO chooses by device type. */
enum { CLMLA_LATENT_AUTO = 0, CLMLA_LATENT_GROUP = 1, CLMLA_LATENT_ROWS = 2 };

struct clmla_context {
    cl_platform_id platform;
    cl_device_id device;
    cl_context cl_ctx;
    cl_command_queue queue;
    int profiling;              /* the queue was created with CL_QUEUE_PROFILING_ENABLE */
    clmla_device_info info;
    clmla_env env;              /* environment read once, at creation */
    char device_key[512];       /* device name + driver version, for program cache keys */
    size_t max_items0;          /* CL_DEVICE_MAX_WORK_ITEM_SIZES[0] (0: unknown) */

    clmla_program_entry *programs; /* in-memory program cache, a list */
    clmla_program_stats program_stats;

    void *products;                      /* gemm.c's kernels, built on first use */
    void (*products_release)(void *);    /* set by gemm.c with them; called at destroy */
    int latent_variant;           /* CLMLA_LATENT_* (below): the option or a test hook; 0 = by device type */
    int product_variant;          /* the same vocabulary for the products (gemm.h: clmla_products_rows) */
    int program_binaries;         /* the disk cache of programs: 1 on, 0 off (-1, auto, until the device
                                     is known: context.c) */
    clmla_latent_tuning latent_forced; /* clmla_context_set_latent_tuning's parameters, when */
    int latent_forced_set;             /* set (else the lookup's apply: kernel_tuning.c) */
    clmla_product_tuning product_forced; /* clmla_context_set_product_tuning's parameters, when */
    int product_forced_set;              /* set (else the lookup's apply: kernel_tuning.c) */

    clmla_cl_counts counts;      /* clcall.h: what the library has created and called, for tests */
    struct clmla_test_hooks *hooks; /* hooks.h: what only tests set; NULL until one does */

    clmla_xgemm_tuning tuning;   /* tuning.h: the CLBlast Xgemm entry applied at creation */
    int tuning_applied;
    char tuning_source[CLMLA_PATH_SIZE + 64]; /* "file PATH", "built-in table" or "none" */

    cl_mem scratch[24];          /* scratch.h: per-slot device buffers, grown on demand */
    size_t scratch_bytes[24];

    struct clmla_trace *trace;   /* trace.h: CLMLA_TRACE's record of the queue's commands, NULL when off */

    clmla_log_fn log;            /* clmla_context_options: diagnostics for the caller */
    void *log_user;
    clmla_log_level log_level;

    char errmsg[CLMLA_ERRMSG_SIZE];
};

/* Records a message for ctx (or for this thread when ctx is NULL) and returns status, so that
   `return clmla_fail(ctx, CLMLA_ERROR_..., "...")` reads as one step. */
clmla_status clmla_fail(clmla_context *ctx, clmla_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* The start of an entry point fn: *event (when not NULL) cleared, then CLMLA_SUCCESS, or the refusal
   "fn: NULL missing" for ctx where `missing` names an argument that is NULL. */
clmla_status clmla_entry(clmla_context *ctx, const char *fn, const char *missing, cl_event *event);
/* Opens entry point fn on `obj` (a handle with a ctx member) and the argument struct `args`: returns
   clmla_entry's refusal "fn: NULL obj_name" or "fn: NULL args_name" from the caller when one is NULL. */
#define CLMLA_ENTRY(obj, args, fn, obj_name, args_name, event)                                                     \
    do {                                                                                                             \
        const clmla_status bad_ =                                                                                    \
            clmla_entry((obj) ? (obj)->ctx : NULL, fn, !(obj) ? (obj_name) : !(args) ? (args_name) : NULL, event); \
        if (bad_ != CLMLA_SUCCESS)                                                                                   \
            return bad_;                                                                                             \
    } while (0)
/* Releases a kernel or a buffer; NULL is skipped. */
static inline void clmla_release_kernel(cl_kernel k)
{
    if (k)
        clReleaseKernel(k);
}
static inline void clmla_release_mem(cl_mem m)
{
    if (m)
        clReleaseMemObject(m);
}
/* As clmla_fail, for an OpenCL or CLBlast code returned by `what`. */
clmla_status clmla_fail_cl(clmla_context *ctx, cl_int err, const char *what);
/* Hands a message to the context's log callback when its level is enabled. */
void clmla_log(clmla_context *ctx, clmla_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Clears the message (successful calls leave the last failure's message in place otherwise). */
void clmla_clear_error(clmla_context *ctx);

#include "device_spec.h"

/* A context on the device the options' spec picks, or over the caller's queue, with nothing of MLA
   applied yet (host/mla/context_tuned.c's public creators add the CLBlast entry); *out NULL on
   failure. */
clmla_status clmla_runtime_context_create(const clmla_context_options *options, clmla_context **out);
clmla_status clmla_runtime_context_from_queue(cl_command_queue queue, const clmla_context_options *options,
                                             clmla_context **out);

/* PoCL's CPU device. */
int clmla_device_pocl_cpu(const clmla_device_info *info);

/* Whether the row-walking product kernels (the CPU forms) may be the default on this CPU device:
   not on Mesa's rusticl, whose llvmpipe device computed them wrong (Mesa 22.3.6: a wrong cache in
   `clmla demo`, and a crash building gemm_packed_rows; docs/RELIABILITY.md), while the work-group
   forms passed there. A context's product_kernels "rows" still runs them. */
int clmla_device_row_products_trusted(const clmla_device_info *info);

/* PoCL on a CPU: where the kernels' software prefetch (clang's __builtin_prefetch) was measured
   and is compiled in (-D CLMLA_PREFETCH); other runtimes may not lower it (oclgrind rejects it). */
int clmla_device_prefetches(const clmla_device_info *info);

/* Fills info for a device that is already known by id. */
void clmla_device_query(cl_platform_id platform, cl_device_id device, clmla_device_info *info);

#endif
