/* Every OpenCL allocation, buffer transfer, kernel enqueue and GEMM of the library goes through
 * these wrappers, so that a test can make the Nth such call fail (fault injection) and check that
 * the library returns a status, leaks nothing and leaves the cache as it was. Disarmed (the
 * default) they cost one comparison.
 *
 * Counting is per context; calls made before a context exists (clmla_context_create's own
 * clCreateContext / clCreateCommandQueue) count on a per-thread counter.
 *
 * The wrappers also count what the library creates (clmla_cl_counts): buffers, programs, builds,
 * kernels, its own events, and the host allocations of the step path, so that a test can hold the
 * steady-state step to zero creations (tests/test_steady.c). Programs, builds and kernels are
 * counted only, not fault-injected. */
#ifndef CLMLA_CLCALL_H
#define CLMLA_CLCALL_H
#include "internal.h"

/* Test hook: the n-th counted call from now fails (n >= 1); 0 disarms. ctx NULL arms the calling
   thread's counter for context creation. */
void clmla_fault_arm(clmla_context *ctx, long n);
/* Counted calls since the last arm (or since creation). */
long clmla_fault_count(const clmla_context *ctx);
/* Counts one call; 1 when it is the one that must fail. */
int clmla_fault_hit(clmla_context *ctx);

/* What the library has made on a context since its creation; only ever grows. A step in the steady
   state (every size it needs seen before) adds nothing but events, each released by the next step
   (docs/DESIGN.md, "Step buffers"). The fields: internal.h. */
clmla_cl_counts clmla_cl_counts_get(const clmla_context *ctx);
/* Counts one CLBlast routine call. */
void clmla_count_clblast(clmla_context *ctx);

/* realloc(ptr, bytes), counted: the step path's kept host arrays grow through it (building a kernel
   on first use allocates as well, and counts as a kernel). NULL when out of memory (ptr is then
   untouched). */
void *clmla_host_realloc(clmla_context *ctx, void *ptr, size_t bytes);

cl_mem clmla_cl_buffer(clmla_context *ctx, cl_mem_flags flags, size_t bytes, void *host, cl_int *err);
/* Bytes [origin, origin + bytes) of buffer, with its flags (origin aligned as the device requires). */
cl_mem clmla_cl_sub_buffer(clmla_context *ctx, cl_mem buffer, size_t origin, size_t bytes, cl_int *err);
cl_program clmla_cl_program_source(clmla_context *ctx, const char *src, size_t size, cl_int *err);
cl_program clmla_cl_program_binary(clmla_context *ctx, const unsigned char *bin, size_t size, cl_int *bin_status,
                                   cl_int *err);
cl_int clmla_cl_build(clmla_context *ctx, cl_program program, const char *options);
cl_kernel clmla_cl_kernel(clmla_context *ctx, cl_program program, const char *name, cl_int *err);
cl_int clmla_cl_enqueue(clmla_context *ctx, cl_kernel kernel, cl_uint dims, const size_t *global, const size_t *local,
                        cl_event *event);
/* An element-wise kernel whose dimension 0 runs over global[0] values (it returns for indices past
   them), launched with the work-group shape {L, 1, 1}: L is the largest power of two <= 64 that
   the device and the kernel allow (and no larger than global[0] needs), and dimension 0 is
   rounded up to a multiple of L. Dimension 0 must be fixed by the configuration (a row's values),
   never a count that changes between calls: L follows it, and a driver that compiles a kernel
   per work-group shape (PoCL) compiles each new L anew. The other dimensions take any count. */
cl_int clmla_cl_enqueue_rows(clmla_context *ctx, cl_kernel kernel, cl_uint dims, const size_t *global, cl_event *event);
/* A kernel of one dimension over n items, n a count that changes between calls (a call's tokens; the
   kernel returns for items past it): the work-group size is L as above for 64 values whatever n,
   so the kernel runs in one shape, and n is rounded up to a multiple of it. */
cl_int clmla_cl_enqueue_items(clmla_context *ctx, cl_kernel kernel, size_t n, cl_event *event);
/* Sets argument i of kernel k to the value of the lvalue v; on failure returns, from the function
   that uses it, a status whose message names the kernel and the argument. */
#define CLMLA_SET_ARG(ctx, k, i, v)                                                                     \
    do {                                                                                             \
        cl_int e_ = clSetKernelArg((k), (i), sizeof(v), &(v));                                       \
        if (e_ != CL_SUCCESS)                                                                        \
            return clmla_fail_kernel_arg((ctx), e_, (k), (i));                                       \
    } while (0)
clmla_status clmla_fail_kernel_arg(clmla_context *ctx, cl_int err, cl_kernel kernel, cl_uint index);

/* One kernel argument: the bytes of an lvalue, CLMLA_ARG(v). */
typedef struct clmla_kernel_arg {
    size_t size;
    const void *value;
} clmla_kernel_arg;
#define CLMLA_ARG(v) ((clmla_kernel_arg){sizeof(v), &(v)})
/* Sets arguments first, first + 1, .. of kernel k to args[0 .. n); stops at the first that fails,
   with a status whose message names the kernel and the argument. */
clmla_status clmla_set_kernel_args(clmla_context *ctx, cl_kernel k, cl_uint first, const clmla_kernel_arg *args,
                                   size_t n);
/* CLMLA_SET_ARGS(ctx, k, first, CLMLA_ARG(a), CLMLA_ARG(b), ..): CLMLA_SET_ARG of each in turn, from
   argument `first` on. */
#define CLMLA_SET_ARGS(ctx, k, first, ...)                                                              \
    do {                                                                                             \
        const clmla_kernel_arg args_[] = {__VA_ARGS__};                                              \
        clmla_status st_ = clmla_set_kernel_args((ctx), (k), (first), args_, sizeof(args_) / sizeof(args_[0])); \
        if (st_ != CLMLA_SUCCESS)                                                                    \
            return st_;                                                                              \
    } while (0)

/* Blocking: returns once the data is on the device (and every earlier command on the queue done). */
cl_int clmla_cl_write(clmla_context *ctx, cl_mem buffer, size_t offset, size_t bytes, const void *host);
/* Non-blocking: host must stay unchanged until the write completes. With event non-NULL, *event is
   that completion (a counted event: wait for and release it with clmla_cl_event_done). The queue
   is in order, so one event on the last of several writes covers them all. */
cl_int clmla_cl_write_async(clmla_context *ctx, cl_mem buffer, size_t offset, size_t bytes, const void *host,
                            cl_event *event);
/* Waits for *event and releases it (nothing when NULL); *event is NULL after. */
void clmla_cl_event_done(clmla_context *ctx, cl_event *event);
cl_int clmla_cl_read(clmla_context *ctx, cl_mem buffer, size_t offset, size_t bytes, void *host);
/* Non-blocking copy of `bytes` between device buffers, on the queue. */
cl_int clmla_cl_copy(clmla_context *ctx, cl_mem src, size_t src_offset, cl_mem dst, size_t dst_offset, size_t bytes);
#endif
