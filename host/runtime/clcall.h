/* Every OpenCL allocation, buffer transfer, kernel enqueue and GEMM of the library goes through
 * these wrappers, so that a test can make the Nth such call fail (fault injection) and check that
 * the library returns a status, leaks nothing and leaves the cache as it was. Disarmed (the
 * default) they cost one comparison.
 *
 * Counting is per context; calls made before a context exists (clmla_context_create's own
 * clCreateContext / clCreateCommandQueue) count on a per-thread counter. */
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

cl_mem clmla_cl_buffer(clmla_context *ctx, cl_mem_flags flags, size_t bytes, void *host, cl_int *err);
cl_int clmla_cl_enqueue(clmla_context *ctx, cl_kernel kernel, cl_uint dims, const size_t *global, const size_t *local,
                        cl_event *event);
/* An element-wise kernel whose dimension 0 runs over global[0] values (it returns for indices past
   them), launched with the fixed work-group shape {L, 1, 1}: L is the largest power of two <= 64
   that the device and the kernel allow (and no larger than global[0] needs), and dimension 0 is
   rounded up to a multiple of L. A driver left to pick the shape itself may pick a new one for
   each token count, and PoCL compiles each shape anew. */
cl_int clmla_cl_enqueue_rows(clmla_context *ctx, cl_kernel kernel, cl_uint dims, const size_t *global, cl_event *event);
/* Sets argument i of kernel k to the value of the lvalue v; on failure returns, from the function
   that uses it, a status whose message names the kernel and the argument. */
#define CLMLA_SET_ARG(ctx, k, i, v)                                                                     \
    do {                                                                                             \
        cl_int e_ = clSetKernelArg((k), (i), sizeof(v), &(v));                                       \
        if (e_ != CL_SUCCESS)                                                                        \
            return clmla_fail_kernel_arg((ctx), e_, (k), (i));                                       \
    } while (0)
clmla_status clmla_fail_kernel_arg(clmla_context *ctx, cl_int err, cl_kernel kernel, cl_uint index);

cl_int clmla_cl_write(clmla_context *ctx, cl_mem buffer, size_t offset, size_t bytes, const void *host);
cl_int clmla_cl_read(clmla_context *ctx, cl_mem buffer, size_t offset, size_t bytes, void *host);
#endif
