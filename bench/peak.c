/* --peak: the device's own limits, measured with the same timing loop as every other row; each is
 * the best median of 3 trials (1 with --quick), so that a neighbour's burst on a shared machine
 * does not pass for the device's limit.
 *   read-bandwidth  read_bandwidth (bench/kernels/bench_util.cl) streams a buffer far larger
 *                   than any cache once, in two access orders (three on CPUs), the best of them: bytes = buffer size
 *   fp32-fma        fma_throughput: 8 independent register-resident fma chains of floatVEC per
 *                   item, VEC = 1, 4, 8, 16, the best of them: flops = 2 * 8 * VEC * iterations * items
 *   sgemm           CLBlastSgemm, n x n x n, row-major, no transposes: flops = 2 n^3,
 *                   bytes = 3 n^2 * 4 (A, B read once, C written once)
 *   sgemm-clmla     the library's own product dispatch (host/mla/gemm.c) for the same n through the
 *                   public clmla_linear, as the layer calls it (y = x W^T, W n x n kept as the layer
 *                   keeps its projections): clmla's CPU kernel on CPU devices, CLBlast elsewhere
 * The SGEMM peak is the better of the two: "the best GEMM path the library has".
 * Without --peak or --peaks, a run measures only the first two (bench_peak_roof), at --quick's
 * sizes and one trial, so that every row can carry its bound: max(bytes / read peak, FLOPs / FMA
 * peak) (bench/report.c). */
#include "bench.h"

#include <clblast_c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct peak_state {
    bench_device *dev;
    cl_kernel kernel;
    size_t global, local;
    size_t n;          /* sgemm size */
    cl_mem a, b, c;
    clmla_linear *w;   /* sgemm-clmla: B as an n x n clmla_linear */
} peak_state;

static int kernel_enqueue(void *user, cl_event *last)
{
    peak_state *st = user;
    cl_int err = clEnqueueNDRangeKernel(st->dev->queue, st->kernel, 1, NULL, &st->global, &st->local, 0, NULL, last);
    if (err != CL_SUCCESS)
        fprintf(stderr, "clmla-bench: peak kernel failed (%s)\n", clmla_status_string(err));
    return err != CL_SUCCESS;
}

static int clmla_sgemm_enqueue(void *user, cl_event *last)
{
    peak_state *st = user;
    clmla_status s = clmla_linear_forward_cl(st->w, (int)st->n, st->a, 0, st->c, 0, last);
    if (s != CLMLA_SUCCESS)
        fprintf(stderr, "clmla-bench: clmla's product failed: %s\n", clmla_last_error(st->dev->ctx));
    return s != CLMLA_SUCCESS;
}

static int sgemm_enqueue(void *user, cl_event *last)
{
    peak_state *st = user;
    CLBlastStatusCode s = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, st->n, st->n, st->n,
                                       1.0f, st->a, 0, st->n, st->b, 0, st->n, 0.0f, st->c, 0, st->n, &st->dev->queue, last);
    if (s != CLBlastSuccess)
        fprintf(stderr, "clmla-bench: CLBlastSgemm failed: %s\n", clmla_status_string(s));
    return s != CLBlastSuccess;
}

/* The timing with the lowest median of `trials`. */
static int best_time(bench_device *dev, const bench_op *op, const bench_timing_options *timing, int trials, bench_timing *best)
{
    for (int i = 0; i < trials; i++) {
        bench_timing t;
        if (bench_time(dev, op, timing, &t))
            return 1;
        if (i == 0 || t.median_ms < best->median_ms)
            *best = t;
    }
    return 0;
}

static size_t work_group(bench_device *dev, cl_kernel k)
{
    size_t limit = 0;
    clGetKernelWorkGroupInfo(k, dev->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(limit), &limit, NULL);
    if (limit > dev->info.max_work_group_size || limit == 0)
        limit = dev->info.max_work_group_size;
    size_t wg = 1;
    while (wg * 2 <= limit && wg * 2 <= 256)
        wg *= 2;
    return wg;
}

static void peak_row(bench_row *row, const char *path)
{
    memset(row, 0, sizeof(*row));
    snprintf(row->phase, sizeof(row->phase), "peak");
    snprintf(row->path, sizeof(row->path), "%s", path);
    row->check_error = -1;
}

/* The two peaks a row's bound needs: rows[0] read-bandwidth, rows[1] fp32-fma. quick: 128 MiB and
   128 iterations instead of 512 MiB and 512. */
static int measure_roof(bench_device *dev, const bench_timing_options *timing, int quick, int trials, bench_row rows[2],
                        bench_peaks *peaks)
{
    peak_state st;
    memset(&st, 0, sizeof(st));
    st.dev = dev;
    int rc = 0;

    /* Read bandwidth: 512 MiB (128 MiB with --quick), or a quarter of the largest allocation.
       Two access orders, three on CPU devices, the best is the peak: work-items interleaved inside
       a work-group's chunk (coalesced: GPUs), a contiguous run per work-item, and on CPUs one item
       per work-group reading 8 streams over a 256 KiB chunk (as clmla's CPU products read their
       weights; the other two read about a quarter slower on PoCL). */
    peak_row(&rows[0], "read-bandwidth");
    size_t bytes = quick ? (size_t)128 << 20 : (size_t)512 << 20;
    while (bytes > dev->info.max_alloc_bytes / 4 && bytes > ((size_t)16 << 20))
        bytes /= 2;
    st.a = bench_buffer(dev, bytes, "bandwidth source");
    int brc = !st.a || bench_fill(dev, st.a, bytes / 4, 0, 21, 1.0f);
    static const struct {
        const char *options, *name;
        int per_item; /* float4 per item */
        int cpu_only;
    } orders[3] = {{"", "interleaved in a work-group", 64, 0},
                   {"-D CONTIGUOUS", "contiguous per work-item", 64, 0},
                   {"-D STREAMS=8", "8 streams per work-item", 16384, 1}};
    for (int v = 0; !brc && v < 3; v++) {
        if (orders[v].cpu_only && dev->info.kind != CLMLA_DEVICE_KIND_CPU)
            continue;
        const int per_item = orders[v].per_item;
        st.kernel = bench_kernel(dev, "bench_util", orders[v].options, "read_bandwidth");
        if (!st.kernel)
            continue;
        st.local = orders[v].cpu_only ? 1 : work_group(dev, st.kernel);
        const size_t groups = bytes / 16 / (st.local * per_item);
        st.global = groups * st.local;
        st.b = bench_buffer(dev, st.global * sizeof(float), "bandwidth sink");
        bench_timing t;
        bench_op op = {kernel_enqueue, NULL, &st, 0};
        const int vrc = !st.b || clSetKernelArg(st.kernel, 0, sizeof(cl_mem), &st.a) != CL_SUCCESS ||
                        clSetKernelArg(st.kernel, 1, sizeof(int), &per_item) != CL_SUCCESS ||
                        clSetKernelArg(st.kernel, 2, sizeof(cl_mem), &st.b) != CL_SUCCESS ||
                        best_time(dev, &op, timing, trials, &t);
        const double read = (double)st.global * per_item * 16;
        if (!vrc && (rows[0].bytes == 0 || read / t.median_ms > rows[0].bytes / rows[0].t.median_ms)) {
            rows[0].t = t;
            rows[0].bytes = read;
            snprintf(rows[0].note, sizeof(rows[0].note), "%.0f MiB read once, %s, best of %d", read / 1048576.0,
                     orders[v].name, trials);
        }
        clReleaseKernel(st.kernel);
        bench_release(&st.b);
    }
    if (rows[0].bytes > 0)
        peaks->read_gbs = rows[0].bytes / (rows[0].t.median_ms * 1e6);
    else
        rc = 1;
    bench_release(&st.a);

    /* fp32 FMA: enough items to fill any device (64 Ki), 8 chains of float, float4, float8 and
       float16 each (scalars suit GPUs, vectors CPU drivers that do not vectorise across work-items:
       float16 fills an AVX-512 register, which on an Intel Xeon runs 1.85x float8's FLOPs); the
       best width is the peak. */
    peak_row(&rows[1], "fp32-fma");
    const int widths[] = {1, 4, 8, 16};
    const int iterations = quick ? 128 : 512;
    int frc = 1;
    for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++) {
        char vec[32];
        snprintf(vec, sizeof(vec), "-D VEC=%d", widths[w]);
        st.kernel = bench_kernel(dev, "bench_util", vec, "fma_throughput");
        if (!st.kernel)
            continue;
        st.local = work_group(dev, st.kernel);
        st.global = (size_t)1 << 16;
        st.global -= st.global % st.local;
        const float m = 0.999f, c = 0.001f;
        st.a = bench_buffer(dev, st.global * sizeof(float), "fma sink");
        bench_timing t;
        bench_op op = {kernel_enqueue, NULL, &st, 0};
        const int wrc = !st.a || clSetKernelArg(st.kernel, 0, sizeof(cl_mem), &st.a) != CL_SUCCESS ||
                        clSetKernelArg(st.kernel, 1, sizeof(int), &iterations) != CL_SUCCESS ||
                        clSetKernelArg(st.kernel, 2, sizeof(float), &m) != CL_SUCCESS ||
                        clSetKernelArg(st.kernel, 3, sizeof(float), &c) != CL_SUCCESS ||
                        best_time(dev, &op, timing, trials, &t);
        const double flops = 2.0 * 8 * widths[w] * iterations * (double)st.global;
        if (!wrc && (frc || flops / t.median_ms > rows[1].flops / rows[1].t.median_ms)) {
            rows[1].t = t;
            rows[1].flops = flops;
            /* "float", "float4", ...: %.0d prints nothing for 0 */
            snprintf(rows[1].note, sizeof(rows[1].note), "%zu items x 8 chains of float%.0d x %d fma, best of %d",
                     st.global, widths[w] > 1 ? widths[w] : 0, iterations, trials);
            frc = 0;
        }
        clReleaseKernel(st.kernel);
        bench_release(&st.a);
    }
    if (!frc)
        peaks->fma_gflops = rows[1].flops / (rows[1].t.median_ms * 1e6);
    rc |= frc;
    return rc;
}

int bench_peak_roof(bench_device *dev, const bench_timing_options *timing, bench_peaks *peaks)
{
    bench_row rows[2];
    memset(peaks, 0, sizeof(*peaks));
    return measure_roof(dev, timing, 1, 1, rows, peaks);
}

int bench_peak(bench_device *dev, const bench_timing_options *timing, int quick, bench_row rows[BENCH_PEAK_ROWS],
               bench_peaks *peaks)
{
    memset(peaks, 0, sizeof(*peaks));
    const int trials = quick ? 1 : 3;
    int rc = measure_roof(dev, timing, quick, trials, rows, peaks);
    peak_state st;
    memset(&st, 0, sizeof(st));
    st.dev = dev;

    /* CLBlast SGEMM at 2048^3 (1024^3 with --quick). */
    peak_row(&rows[2], "sgemm");
    st.n = quick ? 1024 : 2048;
    const size_t nn = st.n * st.n;
    st.a = bench_buffer(dev, nn * sizeof(float), "sgemm A");
    st.b = bench_buffer(dev, nn * sizeof(float), "sgemm B");
    st.c = bench_buffer(dev, nn * sizeof(float), "sgemm C");
    int grc = !st.a || !st.b || !st.c || bench_fill(dev, st.a, nn, 0, 31, 1.0f) || bench_fill(dev, st.b, nn, 0, 32, 1.0f);
    bench_op op = {sgemm_enqueue, NULL, &st, 0};
    grc = grc || best_time(dev, &op, timing, trials, &rows[2].t);
    rows[2].flops = 2.0 * (double)st.n * st.n * st.n;
    rows[2].bytes = 3.0 * nn * sizeof(float);
    snprintf(rows[2].note, sizeof(rows[2].note), "n = %zu, best of %d", st.n, trials);
    if (!grc) {
        peaks->sgemm_gflops = rows[2].flops / (rows[2].t.median_ms * 1e6);
        snprintf(peaks->sgemm_path, sizeof(peaks->sgemm_path), "CLBlast");
    }

    /* B (row-major, as CLBlast read it) read back and made a clmla_linear: C = A B^T. */
    peak_row(&rows[3], "sgemm-clmla");
    float *b_host = malloc(nn * sizeof(float));
    int crc = !st.a || !st.b || !st.c || !b_host ||
              clEnqueueReadBuffer(dev->queue, st.b, CL_TRUE, 0, nn * sizeof(float), b_host, 0, NULL, NULL) != CL_SUCCESS;
    if (!crc) {
        const clmla_tensor bt = clmla_tensor_2d(b_host, (int64_t)st.n, (int64_t)st.n);
        const clmla_status s = clmla_linear_create(dev->ctx, &bt, &st.w);
        if (s != CLMLA_SUCCESS)
            fprintf(stderr, "clmla-bench: clmla_linear_create (%zu x %zu) failed: %s\n", st.n, st.n,
                    clmla_last_error(dev->ctx));
        crc = s != CLMLA_SUCCESS;
    }
    free(b_host);
    bench_op cop = {clmla_sgemm_enqueue, NULL, &st, 0};
    crc = crc || best_time(dev, &cop, timing, trials, &rows[3].t);
    rows[3].flops = rows[2].flops;
    rows[3].bytes = rows[2].bytes;
    snprintf(rows[3].note, sizeof(rows[3].note), "n = %zu, C = A B^T, best of %d", st.n, trials);
    if (!crc) {
        const double gflops = rows[3].flops / (rows[3].t.median_ms * 1e6);
        if (gflops > peaks->sgemm_gflops) {
            peaks->sgemm_gflops = gflops;
            snprintf(peaks->sgemm_path, sizeof(peaks->sgemm_path), "clmla");
        } else {
            snprintf(peaks->sgemm_path, sizeof(peaks->sgemm_path), "CLBlast");
        }
    }
    rc |= grc | crc;
    clmla_linear_destroy(st.w);
    bench_release(&st.a);
    bench_release(&st.b);
    bench_release(&st.c);

    /* The floor of a timed call: fma_throughput as one work-item of one iteration, a kernel that does
       next to nothing, so its median is what any call costs on this device and timer (the launch,
       the driver spreading the work, the events), under which no row can go however few its bytes. */
    peak_row(&rows[4], "call-floor");
    st.kernel = bench_kernel(dev, "bench_util", "-D VEC=1", "fma_throughput");
    st.global = 1;
    st.local = 1;
    st.a = bench_buffer(dev, sizeof(float), "call-floor sink");
    const int one = 1;
    const float m = 0.999f, c = 0.001f;
    bench_op fop = {kernel_enqueue, NULL, &st, 0};
    const int frc = !st.kernel || !st.a || clSetKernelArg(st.kernel, 0, sizeof(cl_mem), &st.a) != CL_SUCCESS ||
                    clSetKernelArg(st.kernel, 1, sizeof(int), &one) != CL_SUCCESS ||
                    clSetKernelArg(st.kernel, 2, sizeof(float), &m) != CL_SUCCESS ||
                    clSetKernelArg(st.kernel, 3, sizeof(float), &c) != CL_SUCCESS ||
                    best_time(dev, &fop, timing, trials, &rows[4].t);
    snprintf(rows[4].note, sizeof(rows[4].note), "one work-item, one iteration of 8 fma: the least a timed call costs, "
             "best of %d", trials);
    if (st.kernel)
        clReleaseKernel(st.kernel);
    bench_release(&st.a);
    rc |= frc;
    return rc;
}
