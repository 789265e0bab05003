/* The public product: y = x W^T with W [n, k] kept on the device as the layer keeps its projections
   (weight.h: in W's dtype, packed in panels where clmla_weight_panel says so, CPU devices, else
   row-major); every product through clmla_gemm. */
#include "clcall.h"
#include "gemm.h"
#include "layer_config.h"
#include "scratch.h"
#include "weight.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

struct clmla_linear {
    clmla_context *ctx;
    size_t n, k;
    clmla_weight w; /* [n, k] in W's dtype: packed (w.panel > 0) or row-major */
    size_t bytes;   /* of w, its fp8 scales included */
};

/* a * b, or 0 with *ok cleared when it does not fit a size_t. */
static size_t mul(size_t a, size_t b, int *ok)
{
    if (a != 0 && b > SIZE_MAX / a) {
        *ok = 0;
        return 0;
    }
    return a * b;
}

/* W must be a 2-D tensor with data and positive dimensions whose bytes fit a size_t (its dtype and
   scales are checked by clmla_weight_upload). */
static clmla_status check_weight(clmla_context *ctx, const clmla_tensor *w)
{
    char got[64];
    clmla_tensor_shape_text(w, got, sizeof(got));
    if (!w->data)
        return clmla_fail(ctx, CLMLA_ERROR_MISSING_TENSOR, "clmla_linear_create: W (shape %s) has no data", got);
    if (w->ndim != 2)
        return clmla_fail(ctx, CLMLA_ERROR_SHAPE_MISMATCH, "clmla_linear_create: W has shape %s, expected 2-D [n, k]",
                          got);
    if (w->shape[0] <= 0 || w->shape[1] <= 0)
        return clmla_fail(ctx, CLMLA_ERROR_SHAPE_MISMATCH,
                          "clmla_linear_create: W has shape %s, expected [n, k] with n > 0 and k > 0", got);
    if ((uint64_t)w->shape[0] > (uint64_t)(SIZE_MAX / sizeof(float)) / (uint64_t)w->shape[1])
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_linear_create: W of shape %s is too large to address",
                          got);
    return CLMLA_SUCCESS;
}

clmla_status clmla_linear_create(clmla_context *ctx, const clmla_tensor *w, clmla_linear **out)
{
    if (out)
        *out = NULL;
    if (!ctx || !w || !out)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_linear_create: NULL %s",
                          !ctx ? "context" : !w ? "weight" : "output handle");
    clmla_status st = check_weight(ctx, w);
    if (st != CLMLA_SUCCESS)
        return st;
    clmla_linear *lin = calloc(1, sizeof(*lin));
    if (!lin)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "clmla_linear_create: out of host memory");
    lin->ctx = ctx;
    lin->n = (size_t)w->shape[0];
    lin->k = (size_t)w->shape[1];
    st = clmla_weight_upload(ctx, "clmla_linear_create: W", w, 1, CLMLA_WEIGHTS_AS_GIVEN, 1, &lin->w, NULL);
    lin->bytes = lin->w.data_bytes + lin->w.scale_bytes;
    if (st != CLMLA_SUCCESS) {
        clmla_linear_destroy(lin);
        return st;
    }
    *out = lin;
    return CLMLA_SUCCESS;
}

void clmla_linear_destroy(clmla_linear *lin)
{
    if (!lin)
        return;
    if (lin->w.data) {
        clFinish(lin->ctx->queue);
        clmla_weight_release(&lin->w);
    }
    free(lin);
}

/* Buffer `name` must belong to the context and hold [rows, cols] floats from `offset` (in floats);
   [*begin, *end) are the bytes of that range. */
static clmla_status check_buffer(clmla_context *ctx, const char *name, cl_mem buffer, size_t offset, size_t rows,
                                 size_t cols, size_t *begin, size_t *end)
{
    int ok = 1;
    const size_t floats = mul(rows, cols, &ok);
    const size_t last = offset + floats;
    if (last < offset)
        ok = 0;
    const size_t bytes = mul(last, sizeof(float), &ok);
    if (!ok)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_linear_forward: %s [%zu, %zu] from offset %zu floats is too large to address", name, rows,
                          cols, offset);
    cl_context owner = NULL;
    size_t size = 0;
    cl_int err = clGetMemObjectInfo(buffer, CL_MEM_CONTEXT, sizeof(owner), &owner, NULL);
    if (err == CL_SUCCESS)
        err = clGetMemObjectInfo(buffer, CL_MEM_SIZE, sizeof(size), &size, NULL);
    if (err != CL_SUCCESS)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_linear_forward: %s is not a valid buffer: %s", name,
                          clmla_status_string(err));
    if (owner != ctx->cl_ctx)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_linear_forward: %s belongs to another cl_context than the linear's", name);
    if (size < bytes)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_linear_forward: %s [%zu, %zu] from offset %zu floats needs %zu bytes, the buffer has %zu",
                          name, rows, cols, offset, bytes, size);
    *begin = offset * sizeof(float);
    *end = bytes;
    return CLMLA_SUCCESS;
}

/* Enqueues the product on buffers already checked. */
static clmla_status enqueue(clmla_linear *lin, size_t m, cl_mem x, size_t x_offset, cl_mem y, size_t y_offset,
                            cl_event *event)
{
    clmla_context *ctx = lin->ctx;
    /* The packed kernels index x and y by int (clmla_gemm refuses otherwise; say why here). */
    if (lin->w.panel && (x_offset + m * lin->k > (size_t)INT_MAX || y_offset + m * lin->n > (size_t)INT_MAX))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_linear_forward: x [%zu, %zu] from offset %zu and y [%zu, %zu] from offset %zu must end "
                          "within 2^31 - 1 floats, the kernels' int indices; split the rows",
                          m, lin->k, x_offset, m, lin->n, y_offset);
    const clmla_matrix a = {x, x_offset, lin->k, 0, 0, CLMLA_DTYPE_F32, NULL, 0};
    const clmla_matrix b = clmla_weight_matrix(&lin->w);
    const clmla_matrix c = {y, y_offset, lin->n, 0, 0, CLMLA_DTYPE_F32, NULL, 0};
    return clmla_gemm(ctx, m, lin->n, lin->k, 1.0f, a, b, 0.0f, c, event);
}

/* The checks both forward calls start with: the handle, x and y given, m > 0. */
static clmla_status check_call(const char *call, const clmla_linear *lin, int m, int have_x, int have_y)
{
    if (!lin || !have_x || !have_y)
        return clmla_fail(lin ? lin->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "%s: NULL %s", call,
                          !lin ? "linear" : !have_x ? "x" : "y");
    if (m <= 0)
        return clmla_fail(lin->ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: m = %d rows; expected m > 0 (W is [%zu, %zu])",
                          call, m, lin->n, lin->k);
    return CLMLA_SUCCESS;
}

clmla_status clmla_linear_forward_cl(clmla_linear *lin, int m, cl_mem x, size_t x_offset, cl_mem y, size_t y_offset,
                                     cl_event *event)
{
    if (event)
        *event = NULL;
    clmla_status st = check_call("clmla_linear_forward_cl", lin, m, x != NULL, y != NULL);
    if (st != CLMLA_SUCCESS)
        return st;
    clmla_context *ctx = lin->ctx;
    size_t x_begin = 0, x_end = 0, y_begin = 0, y_end = 0;
    st = check_buffer(ctx, "x", x, x_offset, (size_t)m, lin->k, &x_begin, &x_end);
    if (st == CLMLA_SUCCESS)
        st = check_buffer(ctx, "y", y, y_offset, (size_t)m, lin->n, &y_begin, &y_end);
    if (st != CLMLA_SUCCESS)
        return st;
    if (x == y && x_begin < y_end && y_begin < x_end)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_linear_forward_cl: x (bytes %zu..%zu) and y (bytes %zu..%zu) overlap in one buffer",
                          x_begin, x_end, y_begin, y_end);
    st = enqueue(lin, (size_t)m, x, x_offset, y, y_offset, event);
    if (st != CLMLA_SUCCESS && event)
        *event = NULL;
    return st;
}

clmla_status clmla_linear_forward(clmla_linear *lin, int m, const float *x, float *y)
{
    clmla_status st = check_call("clmla_linear_forward", lin, m, x != NULL, y != NULL);
    if (st != CLMLA_SUCCESS)
        return st;
    clmla_context *ctx = lin->ctx;
    int ok = 1;
    const size_t x_bytes = mul(mul((size_t)m, lin->k, &ok), sizeof(float), &ok);
    const size_t y_bytes = mul(mul((size_t)m, lin->n, &ok), sizeof(float), &ok);
    if (!ok)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_linear_forward: x [%d, %zu] or y [%d, %zu] is too large to address", m, lin->k, m, lin->n);
    cl_mem xb = NULL, yb = NULL;
    st = clmla_scratch_in_out(ctx, x, x_bytes, y_bytes, "clmla_linear_forward: clEnqueueWriteBuffer(x)", &xb, &yb);
    if (st != CLMLA_SUCCESS)
        return st;
    st = enqueue(lin, (size_t)m, xb, 0, yb, 0, NULL);
    if (st != CLMLA_SUCCESS) {
        clFinish(ctx->queue);
        return st;
    }
    const cl_int err = clmla_cl_read(ctx, yb, 0, y_bytes, y);
    if (err != CL_SUCCESS)
        return clmla_fail_cl(ctx, err, "clmla_linear_forward: clEnqueueReadBuffer(y)");
    return CLMLA_SUCCESS;
}

clmla_status clmla_linear_device_bytes(const clmla_linear *lin, size_t *bytes)
{
    if (bytes)
        *bytes = 0;
    if (!lin || !bytes)
        return clmla_fail(lin ? lin->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_linear_device_bytes: NULL %s",
                          !lin ? "linear" : "bytes");
    *bytes = lin->bytes;
    return CLMLA_SUCCESS;
}

clmla_status clmla_linear_get_info(const clmla_linear *lin, clmla_linear_info *info)
{
    if (!lin || !info)
        return clmla_fail(lin ? lin->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_linear_get_info: NULL %s",
                          !lin ? "linear" : "info");
    info->n = (int64_t)lin->n;
    info->k = (int64_t)lin->k;
    info->device_bytes = lin->bytes;
    info->packed = lin->w.panel != 0;
    return CLMLA_SUCCESS;
}
