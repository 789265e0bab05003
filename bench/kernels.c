/* The bench's own OpenCL programs (bench/kernels/NAME.cl, embedded at build time), device buffers
   and random fills. Programs are kept per (file, options) for the life of the process. */
#include "bench.h"
#include "kernels_embedded.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The embedded source of bench/kernels/<name>.cl, or NULL. */
static const char *bench_kernel_source(const char *name)
{
    for (const bench_embedded_kernel *k = bench_embedded_kernels; k->name; k++)
        if (strcmp(k->name, name) == 0)
            return k->source;
    return NULL;
}

#define MAX_PROGRAMS 16

static struct {
    cl_context cl_ctx;
    char file[32];
    char options[256];
    cl_program program;
} programs[MAX_PROGRAMS];
static int num_programs;

static cl_program build(bench_device *dev, const char *file, const char *options)
{
    for (int i = 0; i < num_programs; i++)
        if (programs[i].cl_ctx == dev->cl_ctx && strcmp(programs[i].file, file) == 0 &&
            strcmp(programs[i].options, options) == 0)
            return programs[i].program;
    if (num_programs == MAX_PROGRAMS || strlen(file) >= sizeof(programs[0].file) ||
        strlen(options) >= sizeof(programs[0].options)) {
        fprintf(stderr, "clmla-bench: too many kernel variants\n");
        return NULL;
    }
    const char *source = bench_kernel_source(file);
    if (!source) {
        fprintf(stderr, "clmla-bench: no kernel source %s.cl\n", file);
        return NULL;
    }
    cl_int err = CL_SUCCESS;
    cl_program p = clCreateProgramWithSource(dev->cl_ctx, 1, &source, NULL, &err);
    if (!p) {
        fprintf(stderr, "clmla-bench: clCreateProgramWithSource(%s) failed (%d)\n", file, err);
        return NULL;
    }
    err = clBuildProgram(p, 1, &dev->device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        size_t size = 0;
        clGetProgramBuildInfo(p, dev->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size);
        char *log = malloc(size + 1);
        if (log) {
            clGetProgramBuildInfo(p, dev->device, CL_PROGRAM_BUILD_LOG, size, log, NULL);
            log[size] = 0;
        }
        fprintf(stderr, "clmla-bench: building %s.cl with '%s' failed (%s):\n%s\n", file, options,
                clmla_status_string(err), log ? log : "(no log)");
        free(log);
        clReleaseProgram(p);
        return NULL;
    }
    programs[num_programs].cl_ctx = dev->cl_ctx;
    snprintf(programs[num_programs].file, sizeof(programs[0].file), "%s", file);
    snprintf(programs[num_programs].options, sizeof(programs[0].options), "%s", options);
    programs[num_programs].program = p;
    num_programs++;
    return p;
}

cl_kernel bench_kernel(bench_device *dev, const char *file, const char *options, const char *kernel)
{
    cl_program p = build(dev, file, options);
    if (!p)
        return NULL;
    cl_int err = CL_SUCCESS;
    cl_kernel k = clCreateKernel(p, kernel, &err);
    if (!k)
        fprintf(stderr, "clmla-bench: clCreateKernel(%s) failed (%s)\n", kernel, clmla_status_string(err));
    return k;
}

void bench_kernels_release(void)
{
    for (int i = 0; i < num_programs; i++)
        clReleaseProgram(programs[i].program);
    num_programs = 0;
}

cl_mem bench_buffer(bench_device *dev, size_t bytes, const char *what)
{
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(dev->cl_ctx, CL_MEM_READ_WRITE, bytes ? bytes : 4, NULL, &err);
    if (!m)
        fprintf(stderr, "clmla-bench: allocating %s (%.1f MiB) failed: %s\n", what, bytes / 1048576.0,
                clmla_status_string(err));
    return m;
}

void bench_release(cl_mem *buffer)
{
    if (*buffer)
        clReleaseMemObject(*buffer);
    *buffer = NULL;
}

int bench_fill(bench_device *dev, cl_mem dst, size_t n, int half, unsigned seed, float scale)
{
    if (n > 0xFFFFFFFFu) {
        fprintf(stderr, "clmla-bench: fill of %zu values is past 2^32\n", n);
        return 1;
    }
    cl_kernel k = bench_kernel(dev, "bench_util", "", half ? "fill_uniform_half" : "fill_uniform");
    if (!k)
        return 1;
    const cl_uint count = (cl_uint)n, s = seed;
    cl_int err = clSetKernelArg(k, 0, sizeof(cl_mem), &dst);
    err |= clSetKernelArg(k, 1, sizeof(count), &count);
    err |= clSetKernelArg(k, 2, sizeof(s), &s);
    err |= clSetKernelArg(k, 3, sizeof(scale), &scale);
    size_t global = n < ((size_t)1 << 20) ? n : ((size_t)1 << 20);
    if (global == 0)
        global = 1;
    if (err == CL_SUCCESS)
        err = clEnqueueNDRangeKernel(dev->queue, k, 1, NULL, &global, NULL, 0, NULL, NULL);
    clReleaseKernel(k);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clmla-bench: random fill failed (%s)\n", clmla_status_string(err));
        return 1;
    }
    return 0;
}

int bench_flush_setup(bench_device *dev, int read)
{
    /* The buffer is written once either way: a read of pages never written may come from one
       shared zero page, which would flush nothing. */
    if (bench_fill(dev, dev->flush_buffer, dev->flush_bytes / sizeof(float), 0, 7, 1.0f))
        return 1;
    if (!read)
        return 0;
    /* Each work-item reads a contiguous KiB on CPUs (one stream per thread), the items of a
       work-group interleave on other devices (coalesced), as the read peak's two orders. */
    const int per_item = 64; /* float4s */
    const int cpu = dev->info.kind == CLMLA_DEVICE_KIND_CPU;
    dev->flush_kernel = bench_kernel(dev, "bench_util", cpu ? "-D CONTIGUOUS" : "", "read_bandwidth");
    if (!dev->flush_kernel)
        return 1;
    size_t limit = 0;
    clGetKernelWorkGroupInfo(dev->flush_kernel, dev->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(limit), &limit, NULL);
    size_t local = 1;
    while (local * 2 <= 64 && local * 2 <= limit && local * 2 <= dev->info.max_work_group_size)
        local *= 2;
    dev->flush_local = local;
    dev->flush_global = dev->flush_bytes / (16 * (size_t)per_item) / local * local;
    dev->flush_sink = bench_buffer(dev, dev->flush_global * sizeof(float), "cache flush sink");
    if (!dev->flush_sink || dev->flush_global == 0 ||
        clSetKernelArg(dev->flush_kernel, 0, sizeof(cl_mem), &dev->flush_buffer) != CL_SUCCESS ||
        clSetKernelArg(dev->flush_kernel, 1, sizeof(int), &per_item) != CL_SUCCESS ||
        clSetKernelArg(dev->flush_kernel, 2, sizeof(cl_mem), &dev->flush_sink) != CL_SUCCESS) {
        fprintf(stderr, "clmla-bench: cannot set up the cache flush kernel\n");
        bench_flush_release(dev);
        return 1;
    }
    return 0;
}

void bench_flush_release(bench_device *dev)
{
    if (dev->flush_kernel)
        clReleaseKernel(dev->flush_kernel);
    dev->flush_kernel = NULL;
    dev->flush_global = dev->flush_local = 0;
    bench_release(&dev->flush_sink);
    bench_release(&dev->flush_buffer);
}
