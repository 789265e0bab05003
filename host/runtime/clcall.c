#include "clcall.h"

#include <stdio.h>

static _Thread_local long thread_fault_at, thread_fault_calls;

void clmla_fault_arm(clmla_context *ctx, long n)
{
    if (ctx) {
        ctx->fault_at = n;
        ctx->fault_calls = 0;
    } else {
        thread_fault_at = n;
        thread_fault_calls = 0;
    }
}

long clmla_fault_count(const clmla_context *ctx)
{
    return ctx ? ctx->fault_calls : thread_fault_calls;
}

int clmla_fault_hit(clmla_context *ctx)
{
    long *calls = ctx ? &ctx->fault_calls : &thread_fault_calls;
    const long at = ctx ? ctx->fault_at : thread_fault_at;
    return ++*calls == at;
}

cl_mem clmla_cl_buffer(clmla_context *ctx, cl_mem_flags flags, size_t bytes, void *host, cl_int *err)
{
    if (clmla_fault_hit(ctx)) {
        *err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
        return NULL;
    }
    return clCreateBuffer(ctx->cl_ctx, flags, bytes, host, err);
}

cl_int clmla_cl_enqueue(clmla_context *ctx, cl_kernel kernel, cl_uint dims, const size_t *global, const size_t *local,
                        cl_event *event)
{
    if (clmla_fault_hit(ctx))
        return CL_OUT_OF_RESOURCES;
    return clEnqueueNDRangeKernel(ctx->queue, kernel, dims, NULL, global, local, 0, NULL, event);
}

cl_int clmla_cl_enqueue_rows(clmla_context *ctx, cl_kernel kernel, cl_uint dims, const size_t *global, cl_event *event)
{
    size_t limit = 0;
    if (clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(limit), &limit, NULL) != CL_SUCCESS)
        limit = 1;
    if (ctx->max_items0 > 0 && ctx->max_items0 < limit)
        limit = ctx->max_items0;
    if (ctx->info.max_work_group_size > 0 && ctx->info.max_work_group_size < limit)
        limit = ctx->info.max_work_group_size;
    size_t l = 64;
    while (l > 1 && (l > limit || l / 2 >= global[0]))
        l /= 2;
    size_t g[3] = {0, 1, 1}, local[3] = {l, 1, 1};
    for (cl_uint i = 0; i < dims && i < 3; i++)
        g[i] = global[i];
    g[0] = (global[0] + l - 1) / l * l;
    return clmla_cl_enqueue(ctx, kernel, dims, g, local, event);
}

cl_int clmla_cl_write(clmla_context *ctx, cl_mem buffer, size_t offset, size_t bytes, const void *host)
{
    if (clmla_fault_hit(ctx))
        return CL_OUT_OF_RESOURCES;
    return clEnqueueWriteBuffer(ctx->queue, buffer, CL_TRUE, offset, bytes, host, 0, NULL, NULL);
}

cl_int clmla_cl_read(clmla_context *ctx, cl_mem buffer, size_t offset, size_t bytes, void *host)
{
    if (clmla_fault_hit(ctx))
        return CL_OUT_OF_RESOURCES;
    return clEnqueueReadBuffer(ctx->queue, buffer, CL_TRUE, offset, bytes, host, 0, NULL, NULL);
}

clmla_status clmla_fail_kernel_arg(clmla_context *ctx, cl_int err, cl_kernel kernel, cl_uint index)
{
    char name[96] = "?";
    if (clGetKernelInfo(kernel, CL_KERNEL_FUNCTION_NAME, sizeof(name), name, NULL) != CL_SUCCESS)
        snprintf(name, sizeof(name), "?");
    name[sizeof(name) - 1] = '\0';
    return clmla_fail(ctx, err, "clSetKernelArg(%s, argument %u) failed: %s (%d)", name, index, clmla_status_string(err),
                      err);
}
