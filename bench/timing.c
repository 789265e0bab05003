/* The timing loop: a first call (compiles included), a warm-up call, then samples until the
   median is stable.
   By default every call starts cold, as a layer's cache does in a model of many layers: before
   it, untimed, the device writes a buffer of 4x its last-level cache (at least 64 MiB), so no
   input is still in a cache from the call before (triton's do_bench, which FlashMLA's benchmark
   uses, does the same with 256 MB), and a sample is one call. With --flush read a kernel reads
   that buffer on every compute unit instead: the caches are left holding clean lines, where the
   write leaves as many dirty ones for the timed call to write back, which a decode step, whose
   work before a product mostly reads, does not pay. With --warm-cache a sample
   enqueues the call k times back to back and waits once (clFinish), k chosen so that a sample
   lasts about sample_ms; inputs that fit in a cache then stay there. Per call time of a sample:
     profiling: (END of the last call's last command - START of a marker enqueued just before
                the first call) / k, from OpenCL profiling events;
     wall:      the wall-clock time from the first enqueue to the return of clFinish, / k.
   The profiling time is used when the queue has profiling and every sample gave a plausible
   span (bench_span_plausible), else the wall time, and the first implausible span is reported
   on stderr once. */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void bench_timing_defaults(bench_timing_options *o, int quick)
{
    o->min_samples = 5;
    o->max_samples = 400;
    o->min_seconds = quick ? 0.1 : 0.4;
    o->max_seconds = quick ? 0.6 : 3.0;
    o->sample_ms = 2.0;
    o->stable_fraction = 0.02;
}

static int compare_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(const double *v, int n, double *scratch)
{
    memcpy(scratch, v, (size_t)n * sizeof(double));
    qsort(scratch, (size_t)n, sizeof(double), compare_double);
    return n % 2 ? scratch[n / 2] : 0.5 * (scratch[n / 2 - 1] + scratch[n / 2]);
}

static int one_call(const bench_op *op, cl_event *last)
{
    *last = NULL;
    return op->enqueue(op->user, last);
}

int bench_span_plausible(double span_ms, double wall_ms)
{
    return span_ms > 0 && span_ms <= wall_ms * 1.01 + 0.005 && span_ms >= wall_ms * 0.01;
}

/* k calls back to back; *device_ms < 0 when the profiling span is not available, and then
   *rejected_ms is the span the events gave if they gave one (else < 0). */
static int one_sample(bench_device *dev, const bench_op *op, int k, double *wall_ms, double *device_ms,
                      double *rejected_ms)
{
    *device_ms = -1;
    *rejected_ms = -1;
    if (op->reset && op->reset(op->user))
        return 1;
    if (dev->flush_buffer) {
        static cl_uint generation;
        generation++;
        const size_t *local = dev->flush_local ? &dev->flush_local : NULL;
        cl_int e = dev->flush_kernel ? clEnqueueNDRangeKernel(dev->queue, dev->flush_kernel, 1, NULL, &dev->flush_global,
                                                              local, 0, NULL, NULL)
                                     : clEnqueueFillBuffer(dev->queue, dev->flush_buffer, &generation, sizeof(generation),
                                                           0, dev->flush_bytes, 0, NULL, NULL);
        if (e != CL_SUCCESS) {
            fprintf(stderr, "clmla-bench: cache flush failed (%s)\n", clmla_status_string(e));
            return 1;
        }
    }
    cl_int err = clFinish(dev->queue);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clmla-bench: clFinish failed (%d)\n", err);
        return 1;
    }
    cl_event marker = NULL, last = NULL;
    const double t0 = bench_now();
    if (dev->profiling && clEnqueueMarkerWithWaitList(dev->queue, 0, NULL, &marker) != CL_SUCCESS)
        marker = NULL;
    for (int i = 0; i < k; i++) {
        if (last)
            clReleaseEvent(last);
        if (one_call(op, &last)) {
            if (marker)
                clReleaseEvent(marker);
            return 1;
        }
    }
    err = clFinish(dev->queue);
    const double t1 = bench_now();
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clmla-bench: clFinish failed (%d)\n", err);
        return 1;
    }
    *wall_ms = (t1 - t0) * 1e3 / k;
    if (marker && last) {
        cl_ulong start = 0, end = 0;
        if (clGetEventProfilingInfo(marker, CL_PROFILING_COMMAND_START, sizeof(start), &start, NULL) == CL_SUCCESS &&
            clGetEventProfilingInfo(last, CL_PROFILING_COMMAND_END, sizeof(end), &end, NULL) == CL_SUCCESS) {
            const double span = end > start ? (double)(end - start) * 1e-6 / k : 0.0;
            if (bench_span_plausible(span, *wall_ms))
                *device_ms = span;
            else
                *rejected_ms = span;
        }
    }
    if (marker)
        clReleaseEvent(marker);
    if (last)
        clReleaseEvent(last);
    return 0;
}

int bench_time(bench_device *dev, const bench_op *op, const bench_timing_options *o, bench_timing *t)
{
    memset(t, 0, sizeof(*t));
    const int max_k = op->max_calls_per_sample > 0 ? op->max_calls_per_sample : 64;
    double wall = 0, device = 0, rejected = 0;

    /* The first call, with whatever compiles it triggers. */
    if (one_sample(dev, op, 1, &wall, &device, &rejected))
        return 1;
    t->first_ms = wall;
    /* A warm call to size the samples. */
    if (one_sample(dev, op, 1, &wall, &device, &rejected))
        return 1;
    int k = (int)ceil(o->sample_ms / (wall > 1e-3 ? wall : 1e-3));
    if (k < 1)
        k = 1;
    if (k > max_k)
        k = max_k;
    if (dev->flush_buffer)
        k = 1;
    const int min_samples = wall > 500 ? (o->min_samples < 3 ? o->min_samples : 3) : o->min_samples;

    double *walls = malloc((size_t)o->max_samples * sizeof(double));
    double *devices = malloc((size_t)o->max_samples * sizeof(double));
    double *scratch = malloc((size_t)o->max_samples * sizeof(double));
    if (!walls || !devices || !scratch) {
        free(walls);
        free(devices);
        free(scratch);
        fprintf(stderr, "clmla-bench: out of host memory\n");
        return 1;
    }
    int n = 0, profiled = dev->profiling, stable = 0;
    const double start = bench_now();
    while (n < o->max_samples) {
        if (one_sample(dev, op, k, &walls[n], &devices[n], &rejected)) {
            free(walls);
            free(devices);
            free(scratch);
            return 1;
        }
        if (devices[n] < 0)
            profiled = 0;
        if (rejected >= 0 && !dev->profiling_warned) {
            fprintf(stderr,
                    "clmla-bench: the device's profiling events gave %.4g ms for calls the wall clock timed at %.4g ms; "
                    "such rows are timed by the wall clock (their JSON field timer says which)\n",
                    rejected, walls[n]);
            dev->profiling_warned = 1;
        }
        n++;
        const double elapsed = bench_now() - start;
        if (n >= min_samples && elapsed >= o->min_seconds) {
            const double *v = profiled ? devices : walls;
            const double all = median_of(v, n, scratch);
            const double half = median_of(v, (n + 1) / 2, scratch);
            if (fabs(all - half) <= o->stable_fraction * all) {
                stable = 1;
                break;
            }
        }
        if (n >= min_samples && elapsed >= o->max_seconds)
            break;
    }
    const double *v = profiled ? devices : walls;
    t->median_ms = median_of(v, n, scratch);
    t->min_ms = scratch[0];
    t->max_ms = scratch[n - 1];
    t->wall_median_ms = median_of(walls, n, scratch);
    t->samples = n;
    t->calls_per_sample = k;
    t->stable = stable;
    t->timer = profiled ? "profiling" : "wall";
    free(walls);
    free(devices);
    free(scratch);
    return 0;
}
