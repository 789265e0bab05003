#include "scratch.h"
#include "clcall.h"

_Static_assert(SCRATCH_COUNT <= 16, "grow clmla_context.scratch");

clmla_status clmla_scratch(clmla_context *ctx, clmla_scratch_slot slot, size_t bytes, cl_mem *buffer)
{
    if (bytes == 0)
        bytes = 4;
    if (ctx->scratch[slot] && ctx->scratch_bytes[slot] >= bytes) {
        *buffer = ctx->scratch[slot];
        return CLMLA_SUCCESS;
    }
    size_t grown = bytes + bytes / 2;
    if (grown > ctx->info.max_alloc_bytes && ctx->info.max_alloc_bytes >= bytes)
        grown = ctx->info.max_alloc_bytes;
    cl_int err = CL_SUCCESS;
    cl_mem fresh = clmla_cl_buffer(ctx, CL_MEM_READ_WRITE, grown, NULL, &err);
    if (!fresh)
        return clmla_fail(ctx, err, "allocating %zu bytes of device scratch failed: %s", grown, clmla_status_string(err));
    if (ctx->scratch[slot])
        clReleaseMemObject(ctx->scratch[slot]); /* freed by OpenCL once queued commands are done */
    ctx->scratch[slot] = fresh;
    ctx->scratch_bytes[slot] = grown;
    *buffer = fresh;
    return CLMLA_SUCCESS;
}

void clmla_scratch_release(clmla_context *ctx)
{
    for (int i = 0; i < SCRATCH_COUNT; i++)
        if (ctx->scratch[i])
            clReleaseMemObject(ctx->scratch[i]);
}

clmla_status clmla_upload(clmla_context *ctx, const void *data, size_t bytes, cl_mem *buffer)
{
    cl_int err = CL_SUCCESS;
    *buffer = clmla_cl_buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, (void *)data, &err);
    if (!*buffer)
        return clmla_fail(ctx, err, "uploading %zu bytes failed: %s", bytes, clmla_status_string(err));
    return CLMLA_SUCCESS;
}
