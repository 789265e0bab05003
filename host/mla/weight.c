/* Weights on the device in their dtype (weight.h): conversion, stacking, packing and upload. */
#include "weight.h"
#include "clcall.h"
#include "dtype.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

clmla_dtype clmla_weights_dtype_held(clmla_weights_dtype want, clmla_dtype given)
{
    switch (want) {
    case CLMLA_WEIGHTS_F32:
        return CLMLA_DTYPE_F32;
    case CLMLA_WEIGHTS_F16:
        return CLMLA_DTYPE_F16;
    case CLMLA_WEIGHTS_BF16:
        return CLMLA_DTYPE_BF16;
    case CLMLA_WEIGHTS_FP8:
        return CLMLA_DTYPE_FP8_E4M3;
    case CLMLA_WEIGHTS_AS_GIVEN:
        break;
    }
    return given;
}

/* A part must be a 2-D tensor of a known dtype with data (and scales when FP8). */
static clmla_status check_part(clmla_context *ctx, const char *name, const clmla_tensor *t)
{
    if (!t->data || t->ndim != 2 || t->shape[0] <= 0 || t->shape[1] <= 0)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: a 2-D weight with data expected", name);
    if (!clmla_dtype_valid(t->dtype))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s.weight has dtype %d; clmla_dtype has F32, F16, BF16 and "
                          "FP8_E4M3", name, (int)t->dtype);
    if (t->dtype == CLMLA_DTYPE_FP8_E4M3 && !t->scale)
        return clmla_fail(ctx, CLMLA_ERROR_MISSING_TENSOR, "%s.weight is FP8_E4M3 but has no block scales (scale is NULL)",
                          name);
    if (t->dtype == CLMLA_DTYPE_FP8_E4M3) {
        const uint8_t *codes = t->data;
        const size_t cols = (size_t)t->shape[1], count = (size_t)t->shape[0] * cols;
        for (size_t i = 0; i < count; i++)
            if ((codes[i] & 0x7F) == 0x7F) /* the device's decoder reads codes, not NaN (cl/prelude.cl) */
                return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s.weight has a NaN fp8 code at [%zu, %zu]", name,
                                  i / cols, i % cols);
    }
    return CLMLA_SUCCESS;
}

/* Rows [r0, r0 + rows) of part t, converted to `to` into codes (row-major, k per row) and, for
   FP8, scales (block rows from r0 / 128 on; r0 a multiple of 128 for FP8). */
static clmla_status convert_rows(clmla_context *ctx, const char *name, const clmla_tensor *t, size_t r0, size_t rows,
                                 clmla_dtype to, char *codes, float *scales, float *tmp)
{
    const size_t k = (size_t)t->shape[1], eb = clmla_dtype_bytes(to);
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < k; j++)
            tmp[r * k + j] = clmla_tensor_element(t, r0 + r, j);
    switch (to) {
    case CLMLA_DTYPE_F32:
        memcpy(codes, tmp, rows * k * eb);
        break;
    case CLMLA_DTYPE_F16:
    case CLMLA_DTYPE_BF16:
        for (size_t i = 0; i < rows * k; i++) {
            const uint16_t h = to == CLMLA_DTYPE_F16 ? clmla_float_to_f16(tmp[i]) : clmla_float_to_bf16(tmp[i]);
            memcpy(codes + 2 * i, &h, 2);
        }
        break;
    case CLMLA_DTYPE_FP8_E4M3:
        if (clmla_fp8_quantize(tmp, rows, k, (uint8_t *)codes, scales) != 0)
            return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                              "%s.weight: a value in rows %zu..%zu is not finite; fp8 block scales need finite values",
                              name, r0, r0 + rows - 1);
        break;
    }
    return CLMLA_SUCCESS;
}

/* One part into the stacked host arrays at row `at`: copied when kept in its own dtype, else
   converted a block of 128 rows at a time (so a conversion never holds a float32 copy of it). */
static clmla_status place_part(clmla_context *ctx, const char *name, const clmla_tensor *t, size_t at, clmla_dtype to,
                               char *codes, float *scales, size_t scale_ld)
{
    const size_t rows = (size_t)t->shape[0], k = (size_t)t->shape[1], eb = clmla_dtype_bytes(to);
    if (t->dtype == to) {
        memcpy(codes + at * k * eb, t->data, rows * k * eb);
        if (to == CLMLA_DTYPE_FP8_E4M3)
            memcpy(scales + at / CLMLA_FP8_BLOCK * scale_ld, t->scale, clmla_fp8_blocks(rows) * scale_ld * sizeof(float));
        return CLMLA_SUCCESS;
    }
    float *tmp = malloc(CLMLA_FP8_BLOCK * k * sizeof(float));
    if (!tmp)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "%s: out of host memory converting it", name);
    clmla_status st = CLMLA_SUCCESS;
    for (size_t r0 = 0; st == CLMLA_SUCCESS && r0 < rows; r0 += CLMLA_FP8_BLOCK) {
        const size_t n = rows - r0 < CLMLA_FP8_BLOCK ? rows - r0 : CLMLA_FP8_BLOCK;
        st = convert_rows(ctx, name, t, r0, n, to, codes + (at + r0) * k * eb,
                          scales ? scales + (at + r0) / CLMLA_FP8_BLOCK * scale_ld : NULL, tmp);
    }
    free(tmp);
    return st;
}

clmla_status clmla_weight_copy(clmla_context *ctx, const char *name, const void *host, size_t bytes, cl_mem *out)
{
    if (bytes > ctx->info.max_alloc_bytes)
        return clmla_fail(ctx, CL_INVALID_BUFFER_SIZE,
                          "%s needs %zu bytes, more than the device's largest allocation (%llu)", name, bytes,
                          (unsigned long long)ctx->info.max_alloc_bytes);
    cl_int err = CL_SUCCESS;
    *out = clmla_cl_buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, (void *)host, &err);
    if (!*out)
        return clmla_fail(ctx, err, "uploading %s (%zu bytes) failed: %s", name, bytes, clmla_status_string(err));
    return CLMLA_SUCCESS;
}

clmla_status clmla_weight_upload(clmla_context *ctx, const char *name, const clmla_tensor *parts, int count,
                                 clmla_weights_dtype want, int packable, clmla_weight *w, size_t *row_offsets)
{
    memset(w, 0, sizeof(*w));
    if (count < 1 || count > 4)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %d parts (1 to 4)", name, count);
    clmla_status st = CLMLA_SUCCESS;
    for (int i = 0; i < count && st == CLMLA_SUCCESS; i++) {
        st = check_part(ctx, name, &parts[i]);
        if (st == CLMLA_SUCCESS && parts[i].shape[1] != parts[0].shape[1])
            st = clmla_fail(ctx, CLMLA_ERROR_SHAPE_MISMATCH, "%s: stacked parts of %lld and %lld columns", name,
                            (long long)parts[0].shape[1], (long long)parts[i].shape[1]);
    }
    if (st != CLMLA_SUCCESS)
        return st;
    clmla_dtype to = clmla_weights_dtype_held(want, parts[0].dtype);
    for (int i = 1; i < count; i++)
        if (want == CLMLA_WEIGHTS_AS_GIVEN && parts[i].dtype != parts[0].dtype && to != CLMLA_DTYPE_F32) {
            clmla_log(ctx, CLMLA_LOG_WARNING, "%s: its parts are stored as %s and %s; kept in float32 on the device",
                      name, clmla_dtype_name(parts[0].dtype), clmla_dtype_name(parts[i].dtype));
            to = CLMLA_DTYPE_F32;
        }
    const size_t k = (size_t)parts[0].shape[1], eb = clmla_dtype_bytes(to);
    size_t offsets[4], n = 0;
    for (int i = 0; i < count; i++) {
        if (to == CLMLA_DTYPE_FP8_E4M3) /* each part on a block boundary: zero rows before it */
            n = clmla_fp8_blocks(n) * CLMLA_FP8_BLOCK;
        offsets[i] = n;
        n += (size_t)parts[i].shape[0];
    }
    if (k > SIZE_MAX / eb / n)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: [%zu, %zu] is too large to address", name, n, k);
    if (n * k * eb > ctx->info.max_alloc_bytes) /* before any host copy of that size */
        return clmla_fail(ctx, CL_INVALID_BUFFER_SIZE,
                          "%s [%zu, %zu] in %s needs %zu bytes, more than the device's largest allocation (%llu)", name, n,
                          k, clmla_dtype_name(to), n * k * eb, (unsigned long long)ctx->info.max_alloc_bytes);
    const size_t scale_ld = to == CLMLA_DTYPE_FP8_E4M3 ? clmla_fp8_blocks(k) : 0;
    const size_t scale_count = to == CLMLA_DTYPE_FP8_E4M3 ? clmla_fp8_blocks(n) * scale_ld : 0;
    char *codes = calloc(n * k, eb);
    float *scales = scale_count ? malloc(scale_count * sizeof(float)) : NULL;
    if (!codes || (scale_count && !scales)) {
        free(codes);
        free(scales);
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "%s: out of host memory (%zu bytes)", name, n * k * eb);
    }
    for (size_t i = 0; i < scale_count; i++)
        scales[i] = 1.0f; /* padding blocks: zero codes, any scale */
    for (int i = 0; i < count && st == CLMLA_SUCCESS; i++)
        st = place_part(ctx, name, &parts[i], offsets[i], to, codes, scales, scale_ld);
    size_t big = scale_count;
    for (size_t i = 0; st == CLMLA_SUCCESS && i < scale_count && big == scale_count; i++)
        if (fabsf(scales[i]) >= CLMLA_FP8_SCALE_LIMIT && isfinite(scales[i]))
            big = i;
    if (big < scale_count) { /* the kernels fold 2^120 into the scale (cl/prelude.cl, W_SCALE) */
        clmla_log(ctx, CLMLA_LOG_WARNING,
                  "%s: fp8 block scale %g (block %zu, %zu) is not below %g, which the fp8 products take; "
                  "held in float32 on the device",
                  name, (double)scales[big], big / scale_ld, big % scale_ld, (double)CLMLA_FP8_SCALE_LIMIT);
        free(codes);
        free(scales);
        return clmla_weight_upload(ctx, name, parts, count, CLMLA_WEIGHTS_F32, packable, w, row_offsets);
    }
    w->dtype = to;
    w->n = n;
    w->k = k;
    /* the packed kernel indexes W by int: a larger W stays row-major, which every path reads */
    w->panel = packable && n * k <= (size_t)INT_MAX ? clmla_weight_panel(ctx, n, k) : 0;
    if (st == CLMLA_SUCCESS && w->panel) {
        char *packed = malloc(n * k * eb);
        if (!packed)
            st = clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "packing %s (%zu bytes): out of host memory", name,
                            n * k * eb);
        else {
            clmla_pack_weight(codes, n, k, eb, w->panel, packed);
            free(codes);
            codes = packed;
        }
    }
    w->data_bytes = n * k * eb;
    w->scale_bytes = scale_count * sizeof(float);
    if (st == CLMLA_SUCCESS)
        st = clmla_weight_copy(ctx, name, codes, w->data_bytes, &w->data);
    if (st == CLMLA_SUCCESS && scale_count)
        st = clmla_weight_copy(ctx, name, scales, w->scale_bytes, &w->scale);
    free(codes);
    free(scales);
    if (st != CLMLA_SUCCESS) {
        clmla_weight_release(w);
        return st;
    }
    if (row_offsets)
        memcpy(row_offsets, offsets, (size_t)count * sizeof(size_t));
    return CLMLA_SUCCESS;
}

void clmla_weight_release(clmla_weight *w)
{
    clmla_release_mem(w->data);
    clmla_release_mem(w->scale);
    memset(w, 0, sizeof(*w));
}

/* An edge of a block on the weight's fp8 block grid: a multiple of 128, or the weight's own edge. */
static int on_block_grid(size_t edge, size_t extent)
{
    return edge % CLMLA_FP8_BLOCK == 0 || edge == extent;
}

clmla_status clmla_tensor_block_make(clmla_context *ctx, const char *name, const clmla_tensor *t, size_t r0, size_t rows,
                                     size_t c0, size_t cols, clmla_weights_dtype want, clmla_tensor_block *b)
{
    memset(b, 0, sizeof(*b));
    b->want = want;
    b->t = *t;
    if (t->ndim == 2 && r0 == 0 && c0 == 0 && (int64_t)rows == t->shape[0] && (int64_t)cols == t->shape[1])
        return CLMLA_SUCCESS; /* the whole weight: the upload checks it */
    clmla_status st = check_part(ctx, name, t);
    if (st != CLMLA_SUCCESS)
        return st;
    const size_t n = (size_t)t->shape[0], k = (size_t)t->shape[1];
    if (rows == 0 || cols == 0 || r0 > n || rows > n - r0 || c0 > k || cols > k - c0)
        return clmla_fail(ctx, CLMLA_ERROR_INTERNAL, "%s: block [%zu, %zu) x [%zu, %zu) outside [%zu, %zu]", name, r0,
                          r0 + rows, c0, c0 + cols, n, k);
    const int fp8 = t->dtype == CLMLA_DTYPE_FP8_E4M3;
    const int keeps_scales = !fp8 || (r0 % CLMLA_FP8_BLOCK == 0 && c0 % CLMLA_FP8_BLOCK == 0 &&
                                      on_block_grid(r0 + rows, n) && on_block_grid(c0 + cols, k));
    const size_t eb = clmla_dtype_bytes(t->dtype), bk = clmla_fp8_blocks(k);
    b->t.shape[0] = (int64_t)rows;
    b->t.shape[1] = (int64_t)cols;
    if (keeps_scales && cols == k) { /* whole rows: a view */
        b->t.data = (const char *)t->data + r0 * k * eb;
        if (fp8)
            b->t.scale = t->scale + r0 / CLMLA_FP8_BLOCK * bk;
        return CLMLA_SUCCESS;
    }
    if (keeps_scales) { /* columns: a copy of the codes, and of the scales' columns */
        const size_t sr = fp8 ? clmla_fp8_blocks(rows) : 0, sc = fp8 ? clmla_fp8_blocks(cols) : 0;
        b->data = malloc(rows * cols * eb);
        b->scale = fp8 ? malloc(sr * sc * sizeof(float)) : NULL;
        if (!b->data || (fp8 && !b->scale)) {
            clmla_tensor_block_free(b);
            return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY,
                              "%s: out of host memory for a shard's block (%zu bytes)", name, rows * cols * eb);
        }
        for (size_t r = 0; r < rows; r++)
            memcpy((char *)b->data + r * cols * eb, (const char *)t->data + ((r0 + r) * k + c0) * eb, cols * eb);
        for (size_t i = 0; i < sr; i++)
            memcpy(b->scale + i * sc, t->scale + (r0 / CLMLA_FP8_BLOCK + i) * bk + c0 / CLMLA_FP8_BLOCK,
                   sc * sizeof(float));
        b->t.data = b->data;
        b->t.scale = b->scale;
        return CLMLA_SUCCESS;
    }
    /* An fp8 block across the scale grid: its values in float32. */
    float *values = malloc(rows * cols * sizeof(float));
    if (!values)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "%s: out of host memory for a shard's block (%zu bytes)",
                          name, rows * cols * sizeof(float));
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < cols; j++)
            values[r * cols + j] = clmla_tensor_element(t, r0 + r, c0 + j);
    b->data = values;
    b->t = clmla_tensor_2d(values, (int64_t)rows, (int64_t)cols);
    if (clmla_weights_dtype_held(want, CLMLA_DTYPE_FP8_E4M3) == CLMLA_DTYPE_FP8_E4M3) {
        clmla_log(ctx, CLMLA_LOG_WARNING,
                  "%s: the shard's rows %zu..%zu and columns %zu..%zu of the fp8 weight [%zu, %zu] do not lie on its "
                  "128 x 128 scale blocks; held in float32 on the device",
                  name, r0, r0 + rows - 1, c0, c0 + cols - 1, n, k);
        b->want = CLMLA_WEIGHTS_F32;
    }
    return CLMLA_SUCCESS;
}

void clmla_tensor_block_free(clmla_tensor_block *b)
{
    free(b->data);
    free(b->scale);
    memset(b, 0, sizeof(*b));
}

clmla_matrix clmla_weight_matrix(const clmla_weight *w)
{
    clmla_matrix m = {w->data, 0, w->k, 1, w->panel, w->dtype, w->scale, clmla_fp8_blocks(w->k)};
    return m;
}

clmla_matrix clmla_weight_slice(const clmla_weight *w, size_t row0, int transposed)
{
    clmla_matrix m = {w->data, row0 * w->k, w->k, transposed, 0, w->dtype, w->scale, clmla_fp8_blocks(w->k)};
    return m;
}

clmla_status clmla_tensor_values(clmla_context *ctx, const char *name, const clmla_tensor *t, const float **values,
                                 float **owned)
{
    *owned = NULL;
    *values = NULL;
    if (t->dtype == CLMLA_DTYPE_F32) {
        *values = t->data;
        return CLMLA_SUCCESS;
    }
    if (t->dtype != CLMLA_DTYPE_F16 && t->dtype != CLMLA_DTYPE_BF16 && !(t->dtype == CLMLA_DTYPE_FP8_E4M3 && t->ndim == 2))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s has dtype %d; F32, F16 or BF16 expected", name,
                          (int)t->dtype);
    if (t->dtype == CLMLA_DTYPE_FP8_E4M3 && !t->scale)
        return clmla_fail(ctx, CLMLA_ERROR_MISSING_TENSOR, "%s is FP8_E4M3 but has no block scales", name);
    const size_t rows = (size_t)t->shape[0], cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
    float *v = malloc((rows * cols > 0 ? rows * cols : 1) * sizeof(float));
    if (!v)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "%s: out of host memory", name);
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++)
            v[i * cols + j] = clmla_tensor_element(t, i, j);
    *values = *owned = v;
    return CLMLA_SUCCESS;
}
