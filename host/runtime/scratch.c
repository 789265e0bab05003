#include "scratch.h"
#include "clcall.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(SCRATCH_COUNT <= 24, "grow clmla_context.scratch");

clmla_status clmla_scratch(clmla_context *ctx, clmla_scratch_slot slot, size_t bytes, cl_mem *buffer)
{
    return clmla_scratch_capped(ctx, slot, bytes, (size_t)-1, buffer);
}

clmla_status clmla_scratch_capped(clmla_context *ctx, clmla_scratch_slot slot, size_t bytes, size_t cap,
                                  cl_mem *buffer)
{
    if (bytes == 0)
        bytes = 4;
    if (ctx->scratch[slot] && ctx->scratch_bytes[slot] >= bytes) {
        *buffer = ctx->scratch[slot];
        return CLMLA_SUCCESS;
    }
    size_t grown = bytes + bytes / 2;
    if (grown > cap)
        grown = cap > bytes ? cap : bytes;
    if (grown > ctx->info.max_alloc_bytes && ctx->info.max_alloc_bytes >= bytes)
        grown = ctx->info.max_alloc_bytes;
    cl_int err = CL_SUCCESS;
    cl_mem fresh = clmla_cl_buffer(ctx, CL_MEM_READ_WRITE, grown, NULL, &err);
    if (!fresh)
        return clmla_fail(ctx, err, "allocating %zu bytes of device scratch failed: %s", grown, clmla_status_string(err));
    clmla_release_mem(ctx->scratch[slot]); /* freed by OpenCL once queued commands are done */
    ctx->scratch[slot] = fresh;
    ctx->scratch_bytes[slot] = grown;
    *buffer = fresh;
    return CLMLA_SUCCESS;
}

clmla_status clmla_scratch_in_out(clmla_context *ctx, const void *x, size_t x_bytes, size_t out_bytes, const char *what,
                                  cl_mem *x_buf, cl_mem *out_buf)
{
    clmla_status st = clmla_scratch(ctx, SCRATCH_X, x_bytes, x_buf);
    if (st == CLMLA_SUCCESS)
        st = clmla_scratch(ctx, SCRATCH_OUT, out_bytes, out_buf);
    if (st != CLMLA_SUCCESS)
        return st;
    const cl_int err = clmla_cl_write(ctx, *x_buf, 0, x_bytes, x);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, what);
}

void clmla_scratch_release(clmla_context *ctx)
{
    for (int i = 0; i < SCRATCH_COUNT; i++)
        clmla_release_mem(ctx->scratch[i]);
}

clmla_status clmla_upload(clmla_context *ctx, const void *data, size_t bytes, cl_mem *buffer)
{
    cl_int err = CL_SUCCESS;
    *buffer = clmla_cl_buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, (void *)data, &err);
    if (!*buffer)
        return clmla_fail(ctx, err, "uploading %zu bytes failed: %s", bytes, clmla_status_string(err));
    return CLMLA_SUCCESS;
}

/* Tables closer than this in the host block go in one write, the gap between them included. */
#define STAGED_GAP_BYTES ((size_t)16 << 10)

static size_t round_up(size_t v, size_t to)
{
    return (v + to - 1) / to * to;
}

/* Releases the device buffer and its first `subs` sub-buffers (OpenCL frees them once the commands
   queued on them are done). */
static void release_device(int subs, cl_mem device, cl_mem *part)
{
    for (int i = 0; i < subs; i++)
        clmla_release_mem(part[i]);
    clmla_release_mem(device);
}

clmla_status clmla_staged_reserve(clmla_context *ctx, clmla_staged *s, int parts, const size_t *need)
{
    int fits = s->device != NULL && s->parts == parts;
    for (int i = 0; fits && i < parts; i++)
        fits = need[i] <= s->capacity[i];
    if (fits)
        return CLMLA_SUCCESS;
    cl_uint align_bits = 0;
    if (clGetDeviceInfo(ctx->device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof(align_bits), &align_bits, NULL) != CL_SUCCESS)
        align_bits = 0;
    const size_t align = align_bits / 8 > 64 ? align_bits / 8 : 64;
    clmla_staged next = *s;
    next.parts = parts;
    size_t end = 0;
    for (int i = 0; i < parts; i++) {
        const size_t had = s->parts == parts ? s->capacity[i] : 0;
        next.capacity[i] = need[i] <= had ? had : need[i] + need[i] / 2;
        next.offset[i] = end;
        end = round_up(end + next.capacity[i], parts > 1 ? align : 1);
    }
    next.bytes = end ? end : 4;
    if (next.bytes > s->host_bytes) {
        void *host = clmla_host_realloc(ctx, s->host, next.bytes);
        if (!host)
            return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory for %zu bytes of step tables",
                              next.bytes);
        s->host = next.host = host;
        s->host_bytes = next.host_bytes = next.bytes;
    }
    cl_int err = CL_SUCCESS;
    next.device = clmla_cl_buffer(ctx, CL_MEM_READ_ONLY, next.bytes, NULL, &err);
    if (!next.device)
        return clmla_fail(ctx, err, "allocating %zu bytes of step tables failed: %s", next.bytes, clmla_status_string(err));
    for (int i = 0; i < parts; i++) {
        next.part[i] = NULL;
        if (parts == 1)
            next.part[i] = next.device;
        else if (next.capacity[i])
            next.part[i] = clmla_cl_sub_buffer(ctx, next.device, next.offset[i], next.capacity[i], &err);
        if (next.capacity[i] && !next.part[i]) {
            release_device(i, next.device, next.part); /* parts > 1 here */
            return clmla_fail(ctx, err, "a sub-buffer of the step tables failed: %s", clmla_status_string(err));
        }
    }
    release_device(s->parts > 1 ? s->parts : 0, s->device, s->part);
    *s = next;
    return CLMLA_SUCCESS;
}

void *clmla_staged_host(const clmla_staged *s, int i)
{
    return (char *)s->host + s->offset[i];
}

clmla_status clmla_staged_write(clmla_context *ctx, clmla_staged *s, const size_t *used, cl_event *event)
{
    size_t begin = 0, end = 0;
    int pending = 0;
    for (int i = 0; i <= s->parts; i++) {
        if (i < s->parts && used[i] == 0)
            continue;
        /* the pending range goes now when it is the last, or when table i is too far after it */
        if (pending && (i == s->parts || s->offset[i] - end > STAGED_GAP_BYTES)) {
            cl_int err = clmla_cl_write_async(ctx, s->device, begin, end - begin, (char *)s->host + begin,
                                              i == s->parts ? event : NULL);
            if (err != CL_SUCCESS) {
                clFinish(ctx->queue);
                return clmla_fail_cl(ctx, err, "clEnqueueWriteBuffer(step tables)");
            }
            pending = 0;
        }
        if (i == s->parts)
            break;
        if (!pending)
            begin = s->offset[i];
        end = s->offset[i] + used[i];
        pending = 1;
    }
    return CLMLA_SUCCESS;
}

void clmla_staged_release(clmla_staged *s)
{
    release_device(s->parts > 1 ? s->parts : 0, s->device, s->part);
    free(s->host);
    memset(s, 0, sizeof(*s));
}
