/* clmla_linear, the public y = x W^T: odd shapes (W 37x129, 1x5, 257x33, 70x1030 across the packing's
 * chunks, 512 values of f32; m 1, 3, 8, 9, 70, so every rows bucket, the 9-63 row blocks and the 64-row tiles
 * run) against float64 sums, through clmla_linear_forward_cl (offsets inside larger buffers whose
 * other values must stay untouched, with an event) and clmla_linear_forward; each with the weight as
 * the device keeps it by default (packed on CPUs) and again with every product through CLBlast
 * (weights row-major). Then every refused argument (status and message), the device bytes, and an
 * injected fault at every counted OpenCL call of create and both forwards (an error with a message,
 * then a correct result once the fault falls past the last call), and W given as f16, bf16 and fp8
 * codes with block scales, bf16 and fp8 also past their first packed chunk (1024, 2048 values).
 * `test_linear PART...` runs the named parts. */
#include "check.h"
#include "hooks.h"
#include "clcall.h"
#include "clmla.h"
#include "clmla_tuning.h"
#include "dtype.h"
#include "fileio.h"
#include "gemm.h"
#include "internal.h"
#include "test_util.h"
#include "mla_ref.h"
#include "program.h"
#include "tolerance.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static clmla_context *ctx;

#define SENTINEL 12345.0f

static const struct {
    int n, k;
} shapes[] = {{37, 129}, {1, 5}, {257, 33}, {70, 1030}};
static const int row_counts[] = {1, 3, 8, 9, 70};

/* float64 y [m, n] = x [m, k] W^T. */
static double *reference(const float *x, const float *w, int m, int n, int k)
{
    double *y = malloc((size_t)m * n * sizeof(double));
    for (int i = 0; y && i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++)
                s += (double)x[(size_t)i * k + p] * w[(size_t)j * k + p];
            y[(size_t)i * n + j] = s;
        }
    return y;
}

static cl_mem make_buffer(size_t floats, const float *host)
{
    return tu_buffer(ctx, (floats ? floats : 1) * sizeof(float), host);
}

/* Both forms for one W and every row count; `what` names the variant. */
static void check_shape(int n, int k, const char *what)
{
    tu_rng rng = tu_rng_seed(1000u + (unsigned)n * 7u + (unsigned)k);
    float *w = malloc((size_t)n * k * sizeof(float));
    tu_fill_uniform(w, (size_t)n * k, 0.0f, 1.0f, &rng);
    clmla_linear *lin = NULL;
    const clmla_tensor t = clmla_tensor_2d(w, n, k);
    CHECK_STATUS(clmla_linear_create(ctx, &t, &lin), CLMLA_SUCCESS, ctx);
    if (!lin) {
        free(w);
        return;
    }
    for (size_t r = 0; r < sizeof(row_counts) / sizeof(row_counts[0]); r++) {
        const int m = row_counts[r];
        float *x = malloc((size_t)m * k * sizeof(float));
        tu_fill_uniform(x, (size_t)m * k, 0.0f, 1.0f, &rng);
        double *want = reference(x, w, m, n, k);

        /* _cl: x at 3 floats into its buffer, y at 5 into one with 7 spare floats after it. */
        const size_t xo = 3, yo = 5, y_floats = yo + (size_t)m * n + 7;
        float *x_host = malloc((xo + (size_t)m * k) * sizeof(float)), *y_host = malloc(y_floats * sizeof(float));
        for (size_t i = 0; i < xo; i++)
            x_host[i] = SENTINEL;
        memcpy(x_host + xo, x, (size_t)m * k * sizeof(float));
        for (size_t i = 0; i < y_floats; i++)
            y_host[i] = SENTINEL;
        cl_mem xb = make_buffer(xo + (size_t)m * k, x_host), yb = make_buffer(y_floats, y_host);
        cl_event ev = NULL;
        CHECK_STATUS(clmla_linear_forward_cl(lin, m, xb, xo, yb, yo, &ev), CLMLA_SUCCESS, ctx);
        CHECK(ev != NULL, "%s W [%d, %d] m %d: no event", what, n, k, m);
        if (ev) {
            CHECK(clWaitForEvents(1, &ev) == CL_SUCCESS, "clWaitForEvents");
            cl_int done = -1;
            clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(done), &done, NULL);
            CHECK(done == CL_COMPLETE, "%s W [%d, %d] m %d: event status %d after the wait", what, n, k, m, done);
            clReleaseEvent(ev);
        }
        CHECK(clEnqueueReadBuffer(clmla_context_queue(ctx), yb, CL_TRUE, 0, y_floats * sizeof(float), y_host, 0, NULL,
                                  NULL) == CL_SUCCESS,
              "read y");
        CHECK_CLOSE(y_host + yo, want, (size_t)m * n, n, TOL_LINEAR_F32, "%s forward_cl W [%d, %d] m %d", what, n, k, m);
        int spoiled = 0;
        for (size_t i = 0; i < y_floats; i++)
            spoiled += (i < yo || i >= yo + (size_t)m * n) && y_host[i] != SENTINEL;
        CHECK(spoiled == 0, "%s forward_cl W [%d, %d] m %d: %d values outside y changed", what, n, k, m, spoiled);
        clReleaseMemObject(xb);
        clReleaseMemObject(yb);

        /* host arrays */
        float *y = malloc((size_t)m * n * sizeof(float));
        CHECK_STATUS(clmla_linear_forward(lin, m, x, y), CLMLA_SUCCESS, ctx);
        CHECK_CLOSE(y, want, (size_t)m * n, n, TOL_LINEAR_F32, "%s forward W [%d, %d] m %d", what, n, k, m);
        free(y);
        free(x_host);
        free(y_host);
        free(want);
        free(x);
    }
    clmla_linear_destroy(lin);
    free(w);
}

static void test_shapes(void)
{
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        check_shape(shapes[s].n, shapes[s].k, "default");
}

/* The weight row-major and every product through CLBlast (the hook must be set before create: the
   layout is chosen there). */
static void test_shapes_clblast(void)
{
    CHECK_STATUS(clmla_gemm_force_clblast(ctx, 1), CLMLA_SUCCESS, ctx);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        check_shape(shapes[s].n, shapes[s].k, "clblast");
    CHECK_STATUS(clmla_gemm_force_clblast(ctx, 0), CLMLA_SUCCESS, ctx);
}

/* W given in each dtype as random codes (finite, of moderate size; fp8 with random block scales):
   the product must equal, within float32's tolerance, the float64 product with W decoded by
   ref/'s decoders, written from the formats' definitions. Shapes with partial scale blocks along
   both dimensions; every row count; as the device keeps the weight and through CLBlast. */
/* A weight [n, k] of `dtype` with random codes (fp8: and 128 x 128 block scales, [ceil(n / 128),
   ceil(k / 128)]; other dtypes: *scale NULL) into *codes, and the values they decode to into *w. */
static void make_coded(clmla_dtype dtype, int n, int k, tu_rng *rng, unsigned char **codes_out, float **scale_out,
                       float **w_out)
{
    const size_t count = (size_t)n * k, bk = ((size_t)k + 127) / 128, scales = ((size_t)n + 127) / 128 * bk;
    if (dtype == CLMLA_DTYPE_F32) {
        float *w = malloc(count * sizeof(float));
        unsigned char *codes = malloc(count * sizeof(float));
        tu_fill_uniform(w, count, -1.0f, 1.0f, rng);
        memcpy(codes, w, count * sizeof(float));
        *codes_out = codes;
        *scale_out = NULL;
        *w_out = w;
        return;
    }
    unsigned char *codes = malloc(count * 2);
    float *scale = malloc(scales * sizeof(float)), *w = malloc(count * sizeof(float));
    for (size_t b = 0; b < scales; b++)
        scale[b] = 0.001f + 0.01f * (float)(tu_rng_next(rng) % 1000) / 1000.0f;
    for (size_t i = 0; i < count; i++) {
        const uint64_t r = tu_rng_next(rng);
        const size_t row = i / (size_t)k, col = i % (size_t)k;
        if (dtype == CLMLA_DTYPE_FP8_E4M3) {
            unsigned c = (unsigned)(r & 0xFF);
            if ((c & 0x7F) == 0x7F)
                c ^= 1; /* not NaN */
            codes[i] = (unsigned char)c;
            w[i] = (float)(mla_ref_decode_e4m3(c) * scale[row / 128 * bk + col / 128]);
        } else {
            /* sign, exponent within 2^-6 .. 2^4 (f16) or 2^-7 .. 2^3 (bf16), any mantissa */
            const unsigned sign = (unsigned)(r >> 63) << 15;
            const unsigned bits = dtype == CLMLA_DTYPE_F16
                                      ? sign | (unsigned)(9 + (r >> 8) % 11) << 10 | (unsigned)(r & 0x3FF)
                                      : sign | (unsigned)(120 + (r >> 8) % 11) << 7 | (unsigned)(r & 0x7F);
            codes[2 * i] = (unsigned char)(bits & 0xFF);
            codes[2 * i + 1] = (unsigned char)(bits >> 8);
            w[i] = (float)(dtype == CLMLA_DTYPE_F16 ? mla_ref_decode_f16(bits) : mla_ref_decode_bf16(bits));
        }
    }
    if (dtype != CLMLA_DTYPE_FP8_E4M3) { /* drawn all the same, so that every dtype sees the same stream */
        free(scale);
        scale = NULL;
    }
    *codes_out = codes;
    *scale_out = scale;
    *w_out = w;
}

/* The weight as the device keeps it, and through CLBlast too if `clblast_too`, at the `nrows` row
   counts `rows`. */
static void check_dtype_rows(clmla_dtype dtype, int n, int k, const char *what, const int *rows, int nrows,
                             int clblast_too)
{
    tu_rng rng = tu_rng_seed(2000u + (unsigned)dtype * 31u + (unsigned)n);
    const size_t count = (size_t)n * k, scales = ((size_t)n + 127) / 128 * (((size_t)k + 127) / 128);
    unsigned char *codes = NULL;
    float *scale = NULL, *w = NULL;
    make_coded(dtype, n, k, &rng, &codes, &scale, &w);
    clmla_tensor t = clmla_tensor_2d(NULL, n, k);
    t.data = codes;
    t.dtype = dtype;
    t.scale = scale; /* NULL but for fp8 */
    for (int clblast = 0; clblast < 1 + clblast_too; clblast++) {
        CHECK_STATUS(clmla_gemm_force_clblast(ctx, clblast), CLMLA_SUCCESS, ctx);
        clmla_linear *lin = NULL;
        CHECK_STATUS(clmla_linear_create(ctx, &t, &lin), CLMLA_SUCCESS, ctx);
        size_t bytes = 0;
        clmla_linear_device_bytes(lin, &bytes);
        const size_t want_bytes = count * (dtype == CLMLA_DTYPE_F32 ? 4 : dtype == CLMLA_DTYPE_FP8_E4M3 ? 1 : 2) +
                                  (dtype == CLMLA_DTYPE_FP8_E4M3 ? scales * sizeof(float) : 0);
        CHECK(bytes == want_bytes, "%s W [%d, %d]: %zu device bytes, the codes and scales are %zu", what, n, k, bytes,
              want_bytes);
        for (int r = 0; lin && r < nrows; r++) {
            const int m = rows[r];
            float *x = malloc((size_t)m * k * sizeof(float)), *y = malloc((size_t)m * n * sizeof(float));
            tu_fill_uniform(x, (size_t)m * k, 0.0f, 1.0f, &rng);
            double *want = reference(x, w, m, n, k);
            CHECK_STATUS(clmla_linear_forward(lin, m, x, y), CLMLA_SUCCESS, ctx);
            CHECK_CLOSE(y, want, (size_t)m * n, n, TOL_LINEAR_F32, "%s%s W [%d, %d] m %d", what,
                        clblast ? " (CLBlast)" : "", n, k, m);
            free(x);
            free(y);
            free(want);
        }
        clmla_linear_destroy(lin);
    }
    CHECK_STATUS(clmla_gemm_force_clblast(ctx, 0), CLMLA_SUCCESS, ctx);
    free(codes);
    free(scale);
    free(w);
}

static void check_dtype(clmla_dtype dtype, int n, int k, const char *what)
{
    check_dtype_rows(dtype, n, k, what, row_counts, (int)(sizeof(row_counts) / sizeof(row_counts[0])), 1);
}

/* fp8 with one block scale of `big` beside ordinary ones: the kernels take scales below 256
   (cl/prelude.cl folds 2^120 into them), so from 256 on the weight is held in float32 (4 bytes an
   element, no scales); either way the product is the float64 one. */
static void check_fp8_scale(float big, int held_f32)
{
    const int n = 200, k = 260, m = 3;
    const size_t count = (size_t)n * k, bk = 3, scales = 2 * bk;
    tu_rng rng = tu_rng_seed(77u);
    unsigned char *codes = malloc(count);
    float scale[6] = {0.002f, 0.03f, big, 0.5f, 1e-6f, 7.0f};
    float *w = malloc(count * sizeof(float)), *x = malloc((size_t)m * k * sizeof(float));
    float *y = malloc((size_t)m * n * sizeof(float));
    for (size_t i = 0; i < count; i++) {
        unsigned c = (unsigned)(tu_rng_next(&rng) & 0xFF);
        if ((c & 0x7F) == 0x7F)
            c ^= 1;
        codes[i] = (unsigned char)c;
        w[i] = (float)(mla_ref_decode_e4m3(c) * scale[i / (size_t)k / 128 * bk + i % (size_t)k / 128]);
    }
    tu_fill_uniform(x, (size_t)m * k, -1.0f, 1.0f, &rng);
    clmla_tensor t = clmla_tensor_2d(NULL, n, k);
    t.data = codes;
    t.dtype = CLMLA_DTYPE_FP8_E4M3;
    t.scale = scale;
    clmla_linear *lin = NULL;
    CHECK_STATUS(clmla_linear_create(ctx, &t, &lin), CLMLA_SUCCESS, ctx);
    size_t bytes = 0;
    clmla_linear_device_bytes(lin, &bytes);
    const size_t want_bytes = held_f32 ? count * sizeof(float) : count + scales * sizeof(float);
    CHECK(bytes == want_bytes, "fp8 with a block scale %g: %zu device bytes, want %zu (%s)", (double)big, bytes,
          want_bytes, held_f32 ? "float32" : "fp8 and scales");
    double *want = reference(x, w, m, n, k);
    CHECK_STATUS(clmla_linear_forward(lin, m, x, y), CLMLA_SUCCESS, ctx);
    CHECK_CLOSE(y, want, (size_t)m * n, n, TOL_LINEAR_F32, "fp8 with a block scale %g", (double)big);
    clmla_linear_destroy(lin);
    free(want);
    free(codes);
    free(w);
    free(x);
    free(y);
    (void)scales;
}

/* A context on the same device whose kernels use fp8 decoder `dec` (host/runtime/program.h), or
   NULL where `like` uses it already or the device cannot (the shift needs float denormals). */
static clmla_context *decoder_context(clmla_context *like, int dec)
{
    clmla_context *dc = NULL;
    if (dec == clmla_fp8_decoder(like) || (dec == CLMLA_FP8_DECODER_SHIFT && !clmla_device_denormals(like)))
        return NULL;
    CHECK_STATUS(clmla_context_create(NULL, &dc), CLMLA_SUCCESS, NULL);
    if (dc)
        clmla_test_hooks_of(dc)->fp8_decoder = dec;
    return dc;
}

static void test_dtypes(void)
{
    check_fp8_scale(255.0f, 0);
    check_fp8_scale(256.0f, 1);
    check_fp8_scale(-3000.0f, 1);
    check_dtype(CLMLA_DTYPE_F16, 37, 129, "f16");
    check_dtype(CLMLA_DTYPE_BF16, 70, 1030, "bf16");
    check_dtype(CLMLA_DTYPE_FP8_E4M3, 130, 300, "fp8");
    check_dtype(CLMLA_DTYPE_FP8_E4M3, 257, 33, "fp8");
    /* past the first packed chunk of each narrow dtype (1024 bf16, 2048 fp8 values), mid-block */
    check_dtype(CLMLA_DTYPE_FP8_E4M3, 19, 2100, "fp8");
    /* fp8 again through the decoders other devices get (host/runtime/program.h), each on a context of
       its own, since a context builds its kernels once: the CPU kernels undo, on the activations,
       what each decoder leaves in the scale (cl/gemm_rows.cl, DT_E4M3_SUM_X) */
    clmla_context *const main_ctx = ctx;
    for (int dec = CLMLA_FP8_DECODER_SHIFT; dec <= CLMLA_FP8_DECODER_REBIAS; dec++) {
        clmla_context *dc = decoder_context(main_ctx, dec);
        if (!dc)
            continue;
        ctx = dc;
        check_dtype(CLMLA_DTYPE_FP8_E4M3, 130, 300, dec == CLMLA_FP8_DECODER_SHIFT ? "fp8 (shift decoder)" : "fp8 (rebiasing decoder)");
        check_dtype(CLMLA_DTYPE_FP8_E4M3, 19, 2100, dec == CLMLA_FP8_DECODER_SHIFT ? "fp8 (shift decoder)" : "fp8 (rebiasing decoder)");
        ctx = main_ctx;
        clmla_context_destroy(dc);
    }
    /* a NaN code is refused by position, nothing made */
    unsigned char codes[6] = {1, 2, 3, 0xFF, 5, 6};
    float scale[1] = {1.0f};
    clmla_tensor t = clmla_tensor_2d(NULL, 2, 3);
    t.data = codes;
    t.dtype = CLMLA_DTYPE_FP8_E4M3;
    t.scale = scale;
    clmla_linear *lin = NULL;
    CHECK_STATUS(clmla_linear_create(ctx, &t, &lin), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK(lin == NULL && strstr(clmla_last_error(ctx), "NaN fp8 code at [1, 0]") != NULL, "NaN code: %s",
          clmla_last_error(ctx));
    t.scale = NULL;
    CHECK_STATUS(clmla_linear_create(ctx, &t, &lin), CLMLA_ERROR_MISSING_TENSOR, ctx);
    CHECK(lin == NULL, "fp8 without scales made");
}

/* The status, and a message that contains `part` (NULL: any non-empty message). */
#define CHECK_REFUSED(call, want, msg_ctx, part)                                                            \
    do {                                                                                                \
        CHECK_STATUS((call), (want), (msg_ctx));                                                        \
        const char *m_ = clmla_last_error(msg_ctx);                                                     \
        CHECK(m_[0] != '\0' && (!(part) || strstr(m_, (part)) != NULL), "%s: message \"%s\" lacks \"%s\"", \
              #call, m_, (part) ? (part) : "(any)");                                                     \
    } while (0)

static void test_errors(void)
{
    float w[3 * 5] = {0}, x[2 * 5] = {0}, y[2 * 3] = {0};
    clmla_linear *lin = (clmla_linear *)&lin; /* must come back NULL */

    /* create */
    clmla_tensor t = clmla_tensor_2d(w, 3, 5);
    CHECK_REFUSED(clmla_linear_create(NULL, &t, &lin), CLMLA_ERROR_INVALID_ARGUMENT, NULL, "context");
    CHECK(lin == NULL, "handle not cleared on failure");
    CHECK_REFUSED(clmla_linear_create(ctx, NULL, &lin), CLMLA_ERROR_INVALID_ARGUMENT, ctx, "NULL");
    CHECK_REFUSED(clmla_linear_create(ctx, &t, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx, "NULL");
    clmla_tensor bad = clmla_tensor_2d(NULL, 3, 5);
    CHECK_REFUSED(clmla_linear_create(ctx, &bad, &lin), CLMLA_ERROR_MISSING_TENSOR, ctx, "[3, 5]");
    bad = clmla_tensor_1d(w, 15);
    CHECK_REFUSED(clmla_linear_create(ctx, &bad, &lin), CLMLA_ERROR_SHAPE_MISMATCH, ctx, "[15]");
    bad = t;
    bad.ndim = 3;
    CHECK_REFUSED(clmla_linear_create(ctx, &bad, &lin), CLMLA_ERROR_SHAPE_MISMATCH, ctx, "3 dimensions");
    bad = clmla_tensor_2d(w, 0, 5);
    CHECK_REFUSED(clmla_linear_create(ctx, &bad, &lin), CLMLA_ERROR_SHAPE_MISMATCH, ctx, "[0, 5]");
    bad = clmla_tensor_2d(w, 3, 0);
    CHECK_REFUSED(clmla_linear_create(ctx, &bad, &lin), CLMLA_ERROR_SHAPE_MISMATCH, ctx, "[3, 0]");
    bad = clmla_tensor_2d(w, -2, 5);
    CHECK_REFUSED(clmla_linear_create(ctx, &bad, &lin), CLMLA_ERROR_SHAPE_MISMATCH, ctx, "[-2, 5]");
    bad = clmla_tensor_2d(w, (int64_t)1 << 40, (int64_t)1 << 40);
    CHECK_REFUSED(clmla_linear_create(ctx, &bad, &lin), CLMLA_ERROR_INVALID_ARGUMENT, ctx, "too large");
    bad = clmla_tensor_2d(w, (int64_t)1 << 20, (int64_t)1 << 20); /* 4 TiB: past any device's allocation */
    CHECK_REFUSED(clmla_linear_create(ctx, &bad, &lin), CL_INVALID_BUFFER_SIZE, ctx, "largest allocation");
    CHECK(lin == NULL, "handle not NULL after refused creates");

    CHECK_STATUS(clmla_linear_create(ctx, &t, &lin), CLMLA_SUCCESS, ctx);
    if (!lin)
        return;

    /* forward_cl */
    cl_mem xb = make_buffer(2 * 5, x), yb = make_buffer(2 * 3, y), big = make_buffer(64, NULL);
    cl_event ev = (cl_event)&ev; /* must come back NULL */
    CHECK_REFUSED(clmla_linear_forward_cl(NULL, 2, xb, 0, yb, 0, &ev), CLMLA_ERROR_INVALID_ARGUMENT, NULL, "linear");
    CHECK(ev == NULL, "event not cleared on failure");
    CHECK_REFUSED(clmla_linear_forward_cl(lin, 2, NULL, 0, yb, 0, &ev), CLMLA_ERROR_INVALID_ARGUMENT, ctx, "NULL x");
    CHECK_REFUSED(clmla_linear_forward_cl(lin, 2, xb, 0, NULL, 0, &ev), CLMLA_ERROR_INVALID_ARGUMENT, ctx, "NULL y");
    CHECK_REFUSED(clmla_linear_forward_cl(lin, 0, xb, 0, yb, 0, &ev), CLMLA_ERROR_INVALID_ARGUMENT, ctx, "m = 0");
    CHECK_REFUSED(clmla_linear_forward_cl(lin, -1, xb, 0, yb, 0, &ev), CLMLA_ERROR_INVALID_ARGUMENT, ctx, "m = -1");
    CHECK_REFUSED(clmla_linear_forward_cl(lin, 3, xb, 0, big, 0, &ev), CLMLA_ERROR_INVALID_ARGUMENT, ctx,
                  "x [3, 5] from offset 0 floats needs 60 bytes, the buffer has 40");
    CHECK_REFUSED(clmla_linear_forward_cl(lin, 2, xb, 1, yb, 0, &ev), CLMLA_ERROR_INVALID_ARGUMENT, ctx,
                  "x [2, 5] from offset 1");
    CHECK_REFUSED(clmla_linear_forward_cl(lin, 3, big, 0, yb, 0, &ev), CLMLA_ERROR_INVALID_ARGUMENT, ctx,
                  "y [3, 3] from offset 0 floats needs 36 bytes, the buffer has 24");
    CHECK_REFUSED(clmla_linear_forward_cl(lin, 2, xb, 0, yb, (size_t)-2, &ev), CLMLA_ERROR_INVALID_ARGUMENT, ctx,
                  "too large");
    CHECK_REFUSED(clmla_linear_forward_cl(lin, 2, big, 0, big, 8, &ev), CLMLA_ERROR_INVALID_ARGUMENT, ctx, "overlap");
    CHECK(ev == NULL, "event not NULL after refused forwards");
    CHECK_STATUS(clmla_linear_forward_cl(lin, 2, big, 0, big, 10, NULL), CLMLA_SUCCESS, ctx); /* adjacent: fine */

    /* a buffer of another cl_context on the same device */
    cl_device_id device = NULL;
    clGetCommandQueueInfo(clmla_context_queue(ctx), CL_QUEUE_DEVICE, sizeof(device), &device, NULL);
    cl_int err = CL_SUCCESS;
    cl_context other = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (other) {
        cl_mem foreign = clCreateBuffer(other, CL_MEM_READ_WRITE, 64 * sizeof(float), NULL, &err);
        CHECK_REFUSED(clmla_linear_forward_cl(lin, 2, foreign, 0, yb, 0, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx,
                      "another cl_context");
        clReleaseMemObject(foreign);
        clReleaseContext(other);
    }

    /* host form */
    CHECK_REFUSED(clmla_linear_forward(NULL, 2, x, y), CLMLA_ERROR_INVALID_ARGUMENT, NULL, "linear");
    CHECK_REFUSED(clmla_linear_forward(lin, 2, NULL, y), CLMLA_ERROR_INVALID_ARGUMENT, ctx, "NULL x");
    CHECK_REFUSED(clmla_linear_forward(lin, 2, x, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx, "NULL y");
    CHECK_REFUSED(clmla_linear_forward(lin, 0, x, y), CLMLA_ERROR_INVALID_ARGUMENT, ctx, "m = 0");

    /* queries */
    size_t bytes = 1;
    CHECK_REFUSED(clmla_linear_device_bytes(NULL, &bytes), CLMLA_ERROR_INVALID_ARGUMENT, NULL, "linear");
    CHECK(bytes == 0, "bytes not cleared on failure");
    CHECK_REFUSED(clmla_linear_device_bytes(lin, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx, "bytes");
    clmla_linear_info info;
    CHECK_REFUSED(clmla_linear_get_info(NULL, &info), CLMLA_ERROR_INVALID_ARGUMENT, NULL, "linear");
    CHECK_REFUSED(clmla_linear_get_info(lin, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx, "info");

    clReleaseMemObject(xb);
    clReleaseMemObject(yb);
    clReleaseMemObject(big);
    clmla_linear_destroy(lin);
    clmla_linear_destroy(NULL);
}

/* n k 4 bytes, at most 1% more; the info agrees with the shape and with the layer's layout. */
static void test_bytes(void)
{
    for (int force = 0; force < 2; force++) {
        CHECK_STATUS(clmla_gemm_force_clblast(ctx, force), CLMLA_SUCCESS, ctx);
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            const int n = shapes[s].n, k = shapes[s].k;
            float *w = calloc((size_t)n * k, sizeof(float));
            const clmla_tensor t = clmla_tensor_2d(w, n, k);
            clmla_linear *lin = NULL;
            CHECK_STATUS(clmla_linear_create(ctx, &t, &lin), CLMLA_SUCCESS, ctx);
            size_t bytes = 0;
            clmla_linear_info info;
            memset(&info, 0, sizeof(info));
            CHECK_STATUS(clmla_linear_device_bytes(lin, &bytes), CLMLA_SUCCESS, ctx);
            CHECK_STATUS(clmla_linear_get_info(lin, &info), CLMLA_SUCCESS, ctx);
            const double exact = (double)n * k * sizeof(float);
            CHECK(bytes >= exact && bytes <= exact * 1.01, "W [%d, %d]: %zu device bytes, expected %.0f (+1%%)", n, k,
                  bytes, exact);
            CHECK(info.n == n && info.k == k && info.device_bytes == bytes, "info [%lld, %lld] %zu bytes for W [%d, %d]",
                  (long long)info.n, (long long)info.k, info.device_bytes, n, k);
            const int want_packed = !force && clmla_products_rows(ctx);
            CHECK(info.packed == want_packed, "W [%d, %d] %s: packed %d, expected %d", n, k,
                  force ? "clblast" : "default", info.packed, want_packed);
            clmla_linear_destroy(lin);
            free(w);
        }
    }
    CHECK_STATUS(clmla_gemm_force_clblast(ctx, 0), CLMLA_SUCCESS, ctx);
}

/* Injected faults: the n-th counted call of create, forward_cl and forward fails, for n = 1, 2, ...
   until the call succeeds; each failure is a status with a message, and the success is correct. */
static void test_faults(void)
{
    const int n = 37, k = 129, m = 3;
    tu_rng rng = tu_rng_seed(77);
    float *w = malloc((size_t)n * k * sizeof(float)), *x = malloc((size_t)m * k * sizeof(float));
    float *y = malloc((size_t)m * n * sizeof(float));
    tu_fill_uniform(w, (size_t)n * k, 0.0f, 1.0f, &rng);
    tu_fill_uniform(x, (size_t)m * k, 0.0f, 1.0f, &rng);
    double *want = reference(x, w, m, n, k);
    const clmla_tensor t = clmla_tensor_2d(w, n, k);
    clmla_linear *lin = NULL;
    /* warm: kernels built, scratch grown, so that the walks count only the calls of the step itself */
    CHECK_STATUS(clmla_linear_create(ctx, &t, &lin), CLMLA_SUCCESS, ctx);
    CHECK_STATUS(clmla_linear_forward(lin, m, x, y), CLMLA_SUCCESS, ctx);
    clmla_linear_destroy(lin);
    lin = NULL;

    int walked = 0;
    for (long at = 1; at < 100; at++) {
        clmla_fault_arm(ctx, at);
        const clmla_status st = clmla_linear_create(ctx, &t, &lin);
        clmla_fault_arm(ctx, 0);
        if (st == CLMLA_SUCCESS)
            break;
        walked++;
        CHECK(lin == NULL && clmla_last_error(ctx)[0], "create with fault %ld: handle %p, message \"%s\"", at,
              (void *)lin, clmla_last_error(ctx));
    }
    CHECK(lin != NULL && walked >= 1, "create: %d faults walked", walked);
    if (!lin)
        goto done;

    cl_mem xb = make_buffer((size_t)m * k, x), yb = make_buffer((size_t)m * n, NULL);
    for (int form = 0; form < 2; form++) {
        walked = 0;
        for (long at = 1; at < 100; at++) {
            memset(y, 0, (size_t)m * n * sizeof(float));
            cl_event ev = NULL;
            clmla_fault_arm(ctx, at);
            const clmla_status st = form ? clmla_linear_forward(lin, m, x, y)
                                         : clmla_linear_forward_cl(lin, m, xb, 0, yb, 0, &ev);
            clmla_fault_arm(ctx, 0);
            if (st == CLMLA_SUCCESS) {
                if (ev)
                    clReleaseEvent(ev);
                if (!form)
                    clEnqueueReadBuffer(clmla_context_queue(ctx), yb, CL_TRUE, 0, (size_t)m * n * sizeof(float), y, 0,
                                        NULL, NULL);
                CHECK_CLOSE(y, want, (size_t)m * n, n, TOL_LINEAR_F32, "%s after %d faults",
                            form ? "forward" : "forward_cl", walked);
                break;
            }
            walked++;
            CHECK(ev == NULL && clmla_last_error(ctx)[0], "%s with fault %ld: event %p, message \"%s\"",
                  form ? "forward" : "forward_cl", at, (void *)ev, clmla_last_error(ctx));
        }
        CHECK(walked >= 1, "%s: %d faults walked", form ? "forward" : "forward_cl", walked);
        printf("# %s: %d faults, each refused with a message\n", form ? "forward" : "forward_cl", walked);
    }
    clReleaseMemObject(xb);
    clReleaseMemObject(yb);
    clmla_linear_destroy(lin);
done:
    free(want);
    free(w);
    free(x);
    free(y);
}

/* The absorbed path's per-head products on one weight laid out as kv_b_proj is, [H (dn + dv), rkv]
   with dn 40 and dv 24 (so heads begin mid-block of fp8's 128 x 128 scales), through
   clmla_gemm_strided_batched: W^UK, q [m, dn] times head h's first dn rows (x B), and W^UV, o [m,
   rkv] times its last dv rows transposed (x W^T), in f32, bf16 and fp8, for 1 to 4 and 8 rows,
   against float64 sums of the decoded weights. rkv 264 (two whole column blocks and a partial one)
   and 520 (past one run of gemm_skinny_nn_wide's 512 columns). H is twice the device's compute
   units, at least 3, so that on a CPU device the forms for decode run, gemm_skinny_nn_wide for W^UK
   and gemm_packed_rows on the row-major W^UV (rows of one packing chunk): a trace of the context
   must name both (and gemm_skinny_nn_split, which test_per_head runs as on a GPU). */
static void check_per_head(clmla_context *hc, clmla_dtype dtype, int heads, int rkv)
{
    enum { DN = 40, DV = 24, ROWS = DN + DV };
    const int n_rows = heads * ROWS;
    const size_t count = (size_t)n_rows * rkv, scale_ld = ((size_t)rkv + 127) / 128;
    tu_rng rng = tu_rng_seed(3000u + (unsigned)dtype * 17u + (unsigned)rkv);
    unsigned char *codes = NULL;
    float *scale = NULL, *w = NULL;
    make_coded(dtype, n_rows, rkv, &rng, &codes, &scale, &w);
    cl_context clctx = clmla_context_cl_context(hc);
    cl_int err = CL_SUCCESS;
    cl_mem wb = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, count * clmla_dtype_bytes(dtype), codes,
                               &err);
    cl_mem sb = scale ? clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                       ((size_t)n_rows + 127) / 128 * scale_ld * sizeof(float), scale, &err)
                      : NULL;
    static const int ms[] = {1, 2, 3, 4, 8};
    for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
        const int m = ms[mi];
        for (int nt = 0; nt < 2; nt++) {
            /* x B: K = DN, N = rkv; x W^T: K = rkv, N = DV */
            const int K = nt ? rkv : DN, N = nt ? DV : rkv, first_row = nt ? DN : 0;
            const size_t a_stride = (size_t)m * K + 3, c_stride = (size_t)m * N + 5;
            const size_t a_count = (size_t)heads * a_stride, c_count = (size_t)heads * c_stride;
            float *x = malloc(a_count * sizeof(float)), *y = malloc(c_count * sizeof(float));
            double *want = malloc((size_t)heads * m * N * sizeof(double));
            float *got = malloc((size_t)heads * m * N * sizeof(float));
            tu_fill_uniform(x, a_count, -1.0f, 1.0f, &rng);
            for (int h = 0; h < heads; h++)
                for (int i = 0; i < m; i++)
                    for (int j = 0; j < N; j++) {
                        double sum = 0;
                        for (int p = 0; p < K; p++) {
                            const size_t row = (size_t)h * ROWS + first_row + (size_t)(nt ? j : p);
                            sum += (double)x[h * a_stride + (size_t)i * K + p] * w[row * rkv + (size_t)(nt ? p : j)];
                        }
                        want[((size_t)h * m + i) * N + j] = sum;
                    }
            cl_mem xb = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, a_count * sizeof(float), x, &err);
            cl_mem yb = clCreateBuffer(clctx, CL_MEM_READ_WRITE, c_count * sizeof(float), NULL, &err);
            const clmla_matrix a = {xb, 0, (size_t)K, 0, 0, CLMLA_DTYPE_F32, NULL, 0};
            const clmla_matrix b = {wb, (size_t)first_row * rkv, (size_t)rkv, nt, 0, dtype, sb, scale_ld};
            const clmla_matrix c = {yb, 0, (size_t)N, 0, 0, CLMLA_DTYPE_F32, NULL, 0};
            CHECK_STATUS(clmla_gemm_strided_batched(hc, (size_t)m, (size_t)N, (size_t)K, 1.0f, a, a_stride, b,
                                                    (size_t)ROWS * rkv, 0.0f, c, c_stride, (size_t)heads, NULL),
                         CLMLA_SUCCESS, hc);
            clEnqueueReadBuffer(clmla_context_queue(hc), yb, CL_TRUE, 0, c_count * sizeof(float), y, 0, NULL, NULL);
            for (int h = 0; h < heads; h++)
                memcpy(got + (size_t)h * m * N, y + h * c_stride, (size_t)m * N * sizeof(float));
            CHECK_CLOSE(got, want, (size_t)heads * m * N, N, TOL_LINEAR_F32, "%s per-head %s, %d heads, rkv %d, m %d",
                        clmla_dtype_name(dtype), nt ? "x W^T (W^UV)" : "x B (W^UK)", heads, rkv, m);
            clReleaseMemObject(xb);
            clReleaseMemObject(yb);
            free(x);
            free(y);
            free(want);
            free(got);
        }
    }
    clReleaseMemObject(wb);
    if (sb)
        clReleaseMemObject(sb);
    free(codes);
    free(scale);
    free(w);
}

/* Heads for check_per_head: twice the device's compute units, at least 3 (see there). */
static int per_head_count(clmla_context *hc)
{
    clmla_device_info info;
    clmla_context_device(hc, &info);
    return info.compute_units * 2 > 3 ? (int)info.compute_units * 2 : 3;
}

static void test_per_head(void)
{
    char dir[] = "/tmp/clmla-linear-XXXXXX", trace[64];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    snprintf(trace, sizeof(trace), "%s/trace.tsv", dir);
    clmla_context_options o;
    memset(&o, 0, sizeof(o));
    o.trace = trace;
    clmla_context *hc = NULL;
    CHECK_STATUS(clmla_context_create_opts(&o, &hc), CLMLA_SUCCESS, NULL);
    if (!hc)
        return;
    const int rows = clmla_products_rows(hc); /* the forms of the first context (CLMLA_PRODUCT_KERNELS) */
    const int heads = per_head_count(hc);
    static const clmla_dtype dtypes[] = {CLMLA_DTYPE_F32, CLMLA_DTYPE_BF16, CLMLA_DTYPE_FP8_E4M3};
    for (int d = 0; d < 3; d++) {
        check_per_head(hc, dtypes[d], heads, 264);
        check_per_head(hc, dtypes[d], heads, 520);
    }
    /* fp8 through the other decoders (test_dtypes) */
    for (int dec = CLMLA_FP8_DECODER_SHIFT; dec <= CLMLA_FP8_DECODER_REBIAS; dec++) {
        clmla_context *dc = decoder_context(hc, dec);
        if (!dc)
            continue;
        check_per_head(dc, CLMLA_DTYPE_FP8_E4M3, heads, 264);
        check_per_head(dc, CLMLA_DTYPE_FP8_E4M3, heads, 520);
        clmla_context_destroy(dc);
    }
    clmla_context_destroy(hc);
    /* Again with the work-group forms (product_kernels "group", what GPUs run) and K split into 16
       slices of gemm_skinny_nn_split (the product tuning's skinny_nn_slices; 64 items, so 16
       columns a group and a last group cut short at both widths) */
    o.product_kernels = "group";
    hc = NULL;
    CHECK_STATUS(clmla_context_create_opts(&o, &hc), CLMLA_SUCCESS, NULL);
    if (!hc)
        return;
    clmla_product_tuning t;
    clmla_product_tuning_defaults(&t);
    t.skinny_nn_items = 64;
    t.skinny_nn_slices = 16;
    t.skinny_aligned = 0; /* first through vloadN, then (below) the defaults' whole-vector loads */
    CHECK_STATUS(clmla_context_set_product_tuning(hc, &t), CLMLA_SUCCESS, hc);
    for (int d = 0; d < 3; d++) {
        check_per_head(hc, dtypes[d], heads, 264);
        check_per_head(hc, dtypes[d], heads, 520);
    }
    /* and with whole-vector loads (skinny_aligned: the heads' slices of kv_b_proj start at multiples
       of 4 values, so both per-head products take them) */
    t.skinny_aligned = 1;
    CHECK_STATUS(clmla_context_set_product_tuning(hc, &t), CLMLA_SUCCESS, hc);
    for (int d = 0; d < 3; d++)
        check_per_head(hc, dtypes[d], heads, 264);
    clmla_context_destroy(hc);
    char *text = NULL, err[256];
    size_t length = 0;
    CHECK_STATUS(clmla_read_file(trace, (size_t)1 << 26, "trace", &text, &length, err, sizeof(err)), CLMLA_SUCCESS,
                 NULL);
    if (rows) {
        CHECK(text && strstr(text, "\tgemm_skinny_nn_wide\t"), "no gemm_skinny_nn_wide in the trace of %d heads", heads);
        CHECK(text && strstr(text, "\tgemm_packed_rows\t"), "no gemm_packed_rows in the trace of %d heads", heads);
    }
    CHECK(text && strstr(text, "\tgemm_skinny_nn_split\t"), "no gemm_skinny_nn_split in the trace of %d heads", heads);
    free(text);
    remove(trace);
    rmdir(dir);
}

/* gemm_skinny_nt reading whole vectors (the product tuning's skinny_aligned, a GPU's choice), on the
   work-group forms whatever the device: 16 values a load in every weight dtype and 4 in f32 and
   fp8, with K whose rows are aligned at that width (1024) and, in f32 and fp8, at 4 and 8 values
   but not 16 (1032: the kernel without runs) or at none (1030); then 4 values a load through
   vloadN (skinny_aligned 0) in f32 and fp8; 1 and 3 rows (the kernel's one-row form and its general
   one), against float64. Few row counts and no CLBlast: every case is a program of its own to
   build. */
static void test_aligned(void)
{
    clmla_context_options o;
    memset(&o, 0, sizeof(o));
    o.product_kernels = "group";
    clmla_context *const main_ctx = ctx;
    static const clmla_dtype dtypes[] = {CLMLA_DTYPE_F32, CLMLA_DTYPE_F16, CLMLA_DTYPE_BF16, CLMLA_DTYPE_FP8_E4M3};
    static const int forms[3][2] = {{4, 1}, {16, 1}, {4, 0}}; /* skinny_vector, skinny_aligned */
    for (int f = 0; f < 3; f++) {
        const int vw = forms[f][0], al = forms[f][1];
        clmla_context *gc = NULL;
        CHECK_STATUS(clmla_context_create_opts(&o, &gc), CLMLA_SUCCESS, NULL);
        if (!gc)
            return;
        clmla_product_tuning t;
        clmla_product_tuning_defaults(&t);
        t.skinny_aligned = al;
        t.skinny_vector = vw;
        CHECK_STATUS(clmla_context_set_product_tuning(gc, &t), CLMLA_SUCCESS, gc);
        ctx = gc;
        char what[48];
        for (int d = 0; d < 4; d++) {
            if (vw == 4 && (dtypes[d] == CLMLA_DTYPE_F16 || dtypes[d] == CLMLA_DTYPE_BF16))
                continue;
            static const int rows[] = {1, 3};
            snprintf(what, sizeof(what), "%s, %s loads of %d", clmla_dtype_name(dtypes[d]), al ? "whole" : "vloadN",
                     vw);
            check_dtype_rows(dtypes[d], 37, 1024, what, rows, 2, 0);
            if (dtypes[d] == CLMLA_DTYPE_F32 || dtypes[d] == CLMLA_DTYPE_FP8_E4M3)
                check_dtype_rows(dtypes[d], 37, vw == 16 ? 1032 : 1030, what, rows, 2, 0);
        }
        ctx = main_ctx;
        clmla_context_destroy(gc);
    }
}

/* A context of its own on the default device, for a part that changes its product tuning; NULL
   (after saying so, under part's name) where the device runs no CPU product kernels. */
static clmla_context *cpu_products_context(const char *part)
{
    clmla_context *c = NULL;
    CHECK_STATUS(clmla_context_create(NULL, &c), CLMLA_SUCCESS, NULL);
    if (c && !clmla_products_rows(c)) {
        printf("%s: the device runs no CPU product kernels, nothing to test\n", part);
        clmla_context_destroy(c);
        c = NULL;
    }
    return c;
}

/* gemm_packed_rows' line-wide form (the product tuning's cpu_wide, read on CPU devices: bf16, and fp8
   where the context decodes it through half precision, as CPUs do): K a multiple of 128 within one
   packing chunk (1024 bf16, 2048 fp8 values) and over several with a short last one, panels of fewer
   rows than streams and of rows not a multiple of them, the per-head W^UV at rkv 256 (a batch of
   heads at strides), and K 1030 and 2100, where the form does not apply and the general loop runs;
   every row count, through CLBlast too, against float64. */
static void test_wide(void)
{
    clmla_context *wc = cpu_products_context("wide");
    if (!wc)
        return;
    clmla_product_tuning t;
    clmla_product_tuning_defaults(&t);
    t.cpu_wide = 1;
    CHECK_STATUS(clmla_context_set_product_tuning(wc, &t), CLMLA_SUCCESS, wc);
    const int heads = per_head_count(wc);
    clmla_context *const main_ctx = ctx;
    ctx = wc;
    check_dtype(CLMLA_DTYPE_BF16, 37, 1152, "bf16 (line-wide)");
    check_dtype(CLMLA_DTYPE_BF16, 300, 256, "bf16 (line-wide)");
    check_dtype(CLMLA_DTYPE_BF16, 70, 1030, "bf16 (line-wide tuning, K 1030)");
    check_dtype(CLMLA_DTYPE_FP8_E4M3, 70, 2432, "fp8 (line-wide)");
    check_dtype(CLMLA_DTYPE_FP8_E4M3, 300, 256, "fp8 (line-wide)");
    check_dtype(CLMLA_DTYPE_FP8_E4M3, 19, 2100, "fp8 (line-wide tuning, K 2100)");
    check_per_head(wc, CLMLA_DTYPE_BF16, heads, 256);
    check_per_head(wc, CLMLA_DTYPE_FP8_E4M3, heads, 256);
    ctx = main_ctx;
    clmla_context_destroy(wc);
}

/* The product tuning's cpu_min_panel (CPU devices): a weight whose rows, spread over
   cpu_items_per_cu items per compute unit, would give each item fewer rows than the floor is packed
   in wider panels, fewer items per compute unit (at least one). The panel of each shape against
   the rule written out here, and the products over those panels (rows fewer than, a few over and
   many times the floor; with the line-wide form, as the Intel Xeon's entry runs it, and without)
   against float64. */
static void test_min_panel(void)
{
    clmla_context *pc = cpu_products_context("min-panel");
    if (!pc)
        return;
    clmla_context *const main_ctx = ctx;
    ctx = pc;
    const int cus = pc->info.compute_units ? (int)pc->info.compute_units : 1;
    for (int wide = 0; wide < 2; wide++) {
        clmla_product_tuning t;
        clmla_product_tuning_defaults(&t);
        t.cpu_wide = wide;
        t.cpu_min_panel = 16;
        CHECK_STATUS(clmla_context_set_product_tuning(pc, &t), CLMLA_SUCCESS, pc);
        static const int shapes[][2] = {{7, 256}, {37, 1152}, {70, 2432}, {300, 256}};
        for (int i = 0; i < 4; i++) {
            const int n = shapes[i][0], k = shapes[i][1];
            int per_cu = t.cpu_items_per_cu;
            while (per_cu > 1 && n < per_cu * cus * t.cpu_min_panel)
                per_cu--;
            const size_t want = (size_t)((n + per_cu * cus - 1) / (per_cu * cus));
            const size_t got = clmla_weight_panel(pc, (size_t)n, (size_t)k);
            CHECK(got == want, "min-panel: %d rows on %d compute units, panel %zu, expected %zu", n, cus, got, want);
            static const clmla_dtype dtypes[] = {CLMLA_DTYPE_F32, CLMLA_DTYPE_BF16, CLMLA_DTYPE_FP8_E4M3};
            for (int d = 0; d < 3; d++) {
                char what[96];
                snprintf(what, sizeof(what), "%s, cpu_min_panel 16, panel %zu%s", clmla_dtype_name(dtypes[d]), got,
                         wide ? ", line-wide" : "");
                check_dtype(dtypes[d], n, k, what);
            }
        }
    }
    ctx = main_ctx;
    clmla_context_destroy(pc);
}

static const tu_part parts[] = {
    {"shapes", test_shapes}, {"shapes-clblast", test_shapes_clblast}, {"errors", test_errors},
    {"bytes", test_bytes},   {"faults", test_faults}, {"dtypes", test_dtypes},
    {"per-head", test_per_head}, {"aligned", test_aligned}, {"wide", test_wide},
    {"min-panel", test_min_panel},
};

int main(int argc, char **argv)
{
    return tu_parts_exit(
        tu_run_parts(argc, argv, parts, (int)(sizeof(parts) / sizeof(parts[0])), NULL, &ctx, &check_failed));
}
