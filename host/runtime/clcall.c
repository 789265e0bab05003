#include "clcall.h"
#include "hooks.h"
#include "trace.h"

#include <stdio.h>
#include <stdlib.h>

static _Thread_local long thread_fault_at, thread_fault_calls;

clmla_test_hooks *clmla_test_hooks_of(clmla_context *ctx)
{
    if (!ctx->hooks)
        ctx->hooks = calloc(1, sizeof(*ctx->hooks));
    return ctx->hooks;
}

int clmla_hook_fp8_decoder(const clmla_context *ctx)
{
    return ctx->hooks ? ctx->hooks->fp8_decoder : 0;
}

int clmla_hook_absorbed_piece_rows(const clmla_context *ctx)
{
    return ctx->hooks ? ctx->hooks->absorbed_piece_rows : 0;
}

void clmla_fault_arm(clmla_context *ctx, long n)
{
    if (!ctx) {
        thread_fault_at = n;
        thread_fault_calls = 0;
        return;
    }
    clmla_test_hooks *h = clmla_test_hooks_of(ctx);
    if (h) {
        h->fault_at = n;
        h->fault_from = ctx->counts.calls;
    }
}

long clmla_fault_count(const clmla_context *ctx)
{
    if (!ctx)
        return thread_fault_calls;
    return ctx->counts.calls - (ctx->hooks ? ctx->hooks->fault_from : 0);
}

int clmla_fault_hit(clmla_context *ctx)
{
    if (!ctx)
        return ++thread_fault_calls == thread_fault_at;
    ctx->counts.calls++;
    const clmla_test_hooks *h = ctx->hooks;
    return h && h->fault_at > 0 && ctx->counts.calls - h->fault_from == h->fault_at;
}

clmla_cl_counts clmla_cl_counts_get(const clmla_context *ctx)
{
    return ctx->counts;
}

void clmla_count_clblast(clmla_context *ctx)
{
    ctx->counts.clblast_calls++;
}

void *clmla_host_realloc(clmla_context *ctx, void *ptr, size_t bytes)
{
    ctx->counts.host_allocs++;
    return realloc(ptr, bytes ? bytes : 1);
}

cl_mem clmla_cl_buffer(clmla_context *ctx, cl_mem_flags flags, size_t bytes, void *host, cl_int *err)
{
    if (clmla_fault_hit(ctx)) {
        *err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
        return NULL;
    }
    ctx->counts.buffers++;
    return clCreateBuffer(ctx->cl_ctx, flags, bytes, host, err);
}

cl_mem clmla_cl_sub_buffer(clmla_context *ctx, cl_mem buffer, size_t origin, size_t bytes, cl_int *err)
{
    if (clmla_fault_hit(ctx)) {
        *err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
        return NULL;
    }
    ctx->counts.buffers++;
    const cl_buffer_region region = {origin, bytes};
    return clCreateSubBuffer(buffer, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, err);
}

cl_program clmla_cl_program_source(clmla_context *ctx, const char *src, size_t size, cl_int *err)
{
    ctx->counts.programs++;
    return clCreateProgramWithSource(ctx->cl_ctx, 1, &src, &size, err);
}

cl_program clmla_cl_program_binary(clmla_context *ctx, const unsigned char *bin, size_t size, cl_int *bin_status,
                                   cl_int *err)
{
    ctx->counts.programs++;
    return clCreateProgramWithBinary(ctx->cl_ctx, 1, &ctx->device, &size, &bin, bin_status, err);
}

cl_int clmla_cl_build(clmla_context *ctx, cl_program program, const char *options)
{
    ctx->counts.builds++;
    return clBuildProgram(program, 1, &ctx->device, options, NULL, NULL);
}

cl_kernel clmla_cl_kernel(clmla_context *ctx, cl_program program, const char *name, cl_int *err)
{
    ctx->counts.kernels++;
    return clCreateKernel(program, name, err);
}

cl_int clmla_cl_enqueue(clmla_context *ctx, cl_kernel kernel, cl_uint dims, const size_t *global, const size_t *local,
                        cl_event *event)
{
    if (clmla_fault_hit(ctx))
        return CL_OUT_OF_RESOURCES;
    cl_event own = NULL, *ev = clmla_trace_event(ctx, event, &own);
    const cl_int err = clEnqueueNDRangeKernel(ctx->queue, kernel, dims, NULL, global, local, 0, NULL, ev);
    if (ctx->trace) {
        char name[88];
        clmla_trace_kernel_name(kernel, name, sizeof(name));
        clmla_trace_record(ctx, err, "kernel", name, dims, global, local, ev, ev == &own);
    }
    return err;
}

/* The largest power of two <= 64 that the device and the kernel allow as a work-group's size, and no
   larger than `need` calls for (its half below need). */
static size_t rows_local(clmla_context *ctx, cl_kernel kernel, size_t need)
{
    size_t limit = 0;
    if (clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(limit), &limit, NULL) != CL_SUCCESS)
        limit = 1;
    if (ctx->max_items0 > 0 && ctx->max_items0 < limit)
        limit = ctx->max_items0;
    if (ctx->info.max_work_group_size > 0 && ctx->info.max_work_group_size < limit)
        limit = ctx->info.max_work_group_size;
    size_t l = 64;
    while (l > 1 && (l > limit || l / 2 >= need))
        l /= 2;
    return l;
}

cl_int clmla_cl_enqueue_rows(clmla_context *ctx, cl_kernel kernel, cl_uint dims, const size_t *global, cl_event *event)
{
    const size_t l = rows_local(ctx, kernel, global[0]);
    size_t g[3] = {0, 1, 1}, local[3] = {l, 1, 1};
    for (cl_uint i = 0; i < dims && i < 3; i++)
        g[i] = global[i];
    g[0] = (global[0] + l - 1) / l * l;
    return clmla_cl_enqueue(ctx, kernel, dims, g, local, event);
}

cl_int clmla_cl_enqueue_items(clmla_context *ctx, cl_kernel kernel, size_t n, cl_event *event)
{
    const size_t l = rows_local(ctx, kernel, 64);
    const size_t global = (n + l - 1) / l * l;
    return clmla_cl_enqueue(ctx, kernel, 1, &global, &l, event);
}

/* A transfer between buffer and host: into host (read) or from it, blocking or, with event, not;
   traced, and the caller's event counted. */
static cl_int transfer(clmla_context *ctx, int read, cl_mem buffer, cl_bool blocking, size_t offset, size_t bytes,
                       void *host, cl_event *event)
{
    if (clmla_fault_hit(ctx))
        return CL_OUT_OF_RESOURCES;
    cl_event own = NULL, *ev = clmla_trace_event(ctx, event, &own);
    const cl_int err = read ? clEnqueueReadBuffer(ctx->queue, buffer, blocking, offset, bytes, host, 0, NULL, ev)
                            : clEnqueueWriteBuffer(ctx->queue, buffer, blocking, offset, bytes, host, 0, NULL, ev);
    if (err == CL_SUCCESS && event)
        ctx->counts.events++;
    const char *what = read ? "read" : "write";
    clmla_trace_record(ctx, err, what, what, 0, &bytes, NULL, ev, ev == &own);
    return err;
}

cl_int clmla_cl_write(clmla_context *ctx, cl_mem buffer, size_t offset, size_t bytes, const void *host)
{
    return transfer(ctx, 0, buffer, CL_TRUE, offset, bytes, (void *)host, NULL);
}

cl_int clmla_cl_write_async(clmla_context *ctx, cl_mem buffer, size_t offset, size_t bytes, const void *host,
                            cl_event *event)
{
    return transfer(ctx, 0, buffer, CL_FALSE, offset, bytes, (void *)host, event);
}

void clmla_cl_event_done(clmla_context *ctx, cl_event *event)
{
    if (!*event)
        return;
    clWaitForEvents(1, event);
    clReleaseEvent(*event);
    ctx->counts.events_released++;
    *event = NULL;
}

cl_int clmla_cl_read(clmla_context *ctx, cl_mem buffer, size_t offset, size_t bytes, void *host)
{
    return transfer(ctx, 1, buffer, CL_TRUE, offset, bytes, host, NULL);
}

cl_int clmla_cl_copy(clmla_context *ctx, cl_mem src, size_t src_offset, cl_mem dst, size_t dst_offset, size_t bytes)
{
    if (clmla_fault_hit(ctx))
        return CL_OUT_OF_RESOURCES;
    cl_event own = NULL, *ev = clmla_trace_event(ctx, NULL, &own);
    const cl_int err = clEnqueueCopyBuffer(ctx->queue, src, dst, src_offset, dst_offset, bytes, 0, NULL, ev);
    clmla_trace_record(ctx, err, "copy", "copy", 0, &bytes, NULL, ev, 1);
    return err;
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

clmla_status clmla_set_kernel_args(clmla_context *ctx, cl_kernel k, cl_uint first, const clmla_kernel_arg *args,
                                   size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const cl_int err = clSetKernelArg(k, first + (cl_uint)i, args[i].size, args[i].value);
        if (err != CL_SUCCESS)
            return clmla_fail_kernel_arg(ctx, err, k, first + (cl_uint)i);
    }
    return CLMLA_SUCCESS;
}
