/* Program builds with an in-memory cache per context and a binary cache on disk.
 *
 * Disk file <cache_dir>/<key>.clbin, key = hash(source, options, device name, driver version):
 *   "CLMLABIN" | u32 format version | u32 0 | u64 payload bytes | u64 payload checksum | payload
 * A file that is missing, short, from another format or failing its checksum, or that the driver
 * refuses, is counted in disk_rejected and the program is built from source instead. Files are
 * written to a unique temporary name and renamed, so a reader never sees half a file. The disk
 * cache is skipped on PoCL's CPU device unless program_binaries is on (binaries_kept). */
#include "program.h"
#include "hooks.h"
#include "clcall.h"
#include "fileio.h"
#include "hash.h"
#include "kernels_embedded.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CACHE_MAGIC "CLMLABIN"
#define CACHE_FORMAT 1u
#define CACHE_HEADER_BYTES 32

struct clmla_program_entry {
    char key[33];
    cl_program program;
    clmla_program_entry *next;
};

static int valid_name(const char *name)
{
    if (!name || !*name || strlen(name) > 64)
        return 0;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_'))
            return 0;
    return 1;
}

/* Milliseconds on a monotonic clock, for the log. */
static double clmla_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Kernel sources and program binaries are far smaller than this. */
#define MAX_PROGRAM_FILE_BYTES ((size_t)1 << 30)

/* A whole file (NUL after its *size bytes), or NULL with the reason in err (errno ENOENT when it
   does not exist). */
static char *read_file(const char *path, size_t *size, char *err, size_t errsize)
{
    char *data = NULL;
    if (clmla_read_file(path, MAX_PROGRAM_FILE_BYTES, "a kernel or program file", &data, size, err, errsize) !=
        CLMLA_SUCCESS)
        return NULL;
    return data;
}

/* The embedded copy of kernel file `name`, or NULL. */
static const clmla_embedded_kernel *embedded(const char *name)
{
    for (const clmla_embedded_kernel *k = clmla_embedded_kernels; k->name; k++)
        if (strcmp(k->name, name) == 0)
            return k;
    return NULL;
}

/* The source text of kernel file `name`: malloc'd copy from CLMLA_KERNEL_DIR, or the embedded
   bytes (not to be freed, *owned = 0). */
static clmla_status find_source(clmla_context *ctx, const char *name, const char **src, size_t *size, int *owned)
{
    *owned = 0;
    if (ctx->env.kernel_dir[0]) {
        char path[CLMLA_PATH_SIZE + 80];
        snprintf(path, sizeof(path), "%s/%s.cl", ctx->env.kernel_dir, name);
        char err[CLMLA_PATH_SIZE + 160];
        char *text = read_file(path, size, err, sizeof(err));
        if (!text)
            return clmla_fail(ctx, CLMLA_ERROR_KERNEL_NOT_FOUND, "kernel source cannot be read (CLMLA_KERNEL_DIR is set): %s",
                              err);
        *src = text;
        *owned = 1;
        return CLMLA_SUCCESS;
    }
    const clmla_embedded_kernel *k = embedded(name);
    if (k) {
        *src = k->source;
        *size = k->size;
        return CLMLA_SUCCESS;
    }
    return clmla_fail(ctx, CLMLA_ERROR_KERNEL_NOT_FOUND,
                      "no kernel file '%s.cl' is embedded in this library (and CLMLA_KERNEL_DIR is not set)", name);
}

/* What is compiled for kernel file `name`: cl/prelude.cl (the definitions every kernel file
   shares: the cache element type and its loads and stores), then the file itself, line numbers
   restarted so that build logs point into it. The prelude comes from CLMLA_KERNEL_DIR when that
   folder has one, else from the library. Always malloc'd. */
static clmla_status assemble_source(clmla_context *ctx, const char *name, char **out, size_t *out_size)
{
    const char *src = NULL, *pre = NULL;
    size_t size = 0, pre_size = 0;
    int owned = 0, pre_owned = 0;
    clmla_status st = find_source(ctx, name, &src, &size, &owned);
    if (st != CLMLA_SUCCESS)
        return st;
    st = find_source(ctx, "prelude", &pre, &pre_size, &pre_owned);
    const clmla_embedded_kernel *k = st != CLMLA_SUCCESS && ctx->env.kernel_dir[0] ? embedded("prelude") : NULL;
    if (k) { /* CLMLA_KERNEL_DIR without a prelude of its own */
        clmla_clear_error(ctx);
        pre = k->source;
        pre_size = k->size;
        st = CLMLA_SUCCESS;
    }
    if (st != CLMLA_SUCCESS) {
        if (owned)
            free((void *)src);
        return st;
    }
    static const char restart[] = "\n#line 1\n";
    const size_t total = pre_size + sizeof(restart) - 1 + size;
    char *text = malloc(total + 1);
    if (text) {
        memcpy(text, pre, pre_size);
        memcpy(text + pre_size, restart, sizeof(restart) - 1);
        memcpy(text + pre_size + sizeof(restart) - 1, src, size);
        text[total] = '\0';
    }
    if (owned)
        free((void *)src);
    if (pre_owned)
        free((void *)pre);
    if (!text)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory for kernel source %s", name);
    *out = text;
    *out_size = total;
    return CLMLA_SUCCESS;
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void cache_path(const clmla_context *ctx, const char *key, char *path, size_t size)
{
    snprintf(path, size, "%s/%s.clbin", ctx->env.cache_dir, key);
}

/* Creates every missing directory of path (like mkdir -p); failures show up at open time. */
static void make_dirs(const char *path)
{
    char tmp[CLMLA_PATH_SIZE];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(tmp, 0755);
            *p = '/';
        }
    mkdir(tmp, 0755);
}

/* Whether programs go to and come from the disk cache: a cache folder, and program_binaries on
   (auto: on any device but PoCL's CPU device, decided at the context's creation). PoCL keeps a
   kernel cache of its own, and reading a program's binary makes it compile every kernel of the
   file first, used or not (clmla.h). */
static int binaries_kept(const clmla_context *ctx)
{
    return ctx->env.cache_dir[0] && ctx->program_binaries > 0;
}

/* Tries the disk cache; returns a built program or NULL (counting a rejected file). */
static cl_program load_cached(clmla_context *ctx, const char *key, const char *options)
{
    if (!binaries_kept(ctx))
        return NULL;
    char path[CLMLA_PATH_SIZE + 64];
    cache_path(ctx, key, path, sizeof(path));
    size_t size = 0;
    char err[CLMLA_PATH_SIZE + 160];
    unsigned char *data = (unsigned char *)read_file(path, &size, err, sizeof(err));
    if (!data) {
        if (errno != ENOENT) {
            ctx->program_stats.disk_rejected++;
            clmla_log(ctx, CLMLA_LOG_WARNING, "program cache: %s; building from source", err);
        }
        return NULL;
    }
    cl_program program = NULL;
    if (size >= CACHE_HEADER_BYTES && memcmp(data, CACHE_MAGIC, 8) == 0 && get_u32(data + 8) == CACHE_FORMAT &&
        get_u64(data + 16) == size - CACHE_HEADER_BYTES &&
        get_u64(data + 24) == clmla_checksum(data + CACHE_HEADER_BYTES, size - CACHE_HEADER_BYTES)) {
        const unsigned char *bin = data + CACHE_HEADER_BYTES;
        size_t bin_size = size - CACHE_HEADER_BYTES;
        cl_int bin_status = CL_SUCCESS, err = CL_SUCCESS;
        program = clmla_cl_program_binary(ctx, bin, bin_size, &bin_status, &err);
        if (program && (err != CL_SUCCESS || bin_status != CL_SUCCESS || clmla_cl_build(ctx, program, options) != CL_SUCCESS)) {
            clReleaseProgram(program);
            program = NULL;
        }
    }
    free(data);
    if (program) {
        ctx->program_stats.loaded_from_disk++;
    } else {
        ctx->program_stats.disk_rejected++;
        clmla_log(ctx, CLMLA_LOG_WARNING, "program cache: %s is corrupt or not for this device; building from source",
                  path);
    }
    return program;
}

static void store_cached(clmla_context *ctx, const char *key, cl_program program)
{
    if (!binaries_kept(ctx))
        return;
    size_t bin_size = 0;
    if (clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof(bin_size), &bin_size, NULL) != CL_SUCCESS || bin_size == 0)
        return;
    unsigned char *file = malloc(CACHE_HEADER_BYTES + bin_size);
    if (!file)
        return;
    unsigned char *bin = file + CACHE_HEADER_BYTES;
    if (clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof(bin), &bin, NULL) != CL_SUCCESS) {
        free(file);
        return;
    }
    memcpy(file, CACHE_MAGIC, 8);
    put_u32(file + 8, CACHE_FORMAT);
    put_u32(file + 12, 0);
    put_u64(file + 16, bin_size);
    put_u64(file + 24, clmla_checksum(bin, bin_size));

    make_dirs(ctx->env.cache_dir);
    char path[CLMLA_PATH_SIZE + 64], err[CLMLA_PATH_SIZE + 256];
    cache_path(ctx, key, path, sizeof(path));
    if (clmla_write_file_replacing(path, file, CACHE_HEADER_BYTES + bin_size, err, sizeof(err)) == CLMLA_SUCCESS)
        ctx->program_stats.disk_written++;
    else
        clmla_log(ctx, CLMLA_LOG_WARNING, "program cache: could not store %s (%s)", path, err);
    free(file);
}

static clmla_status build_from_source(clmla_context *ctx, const char *name, const char *src, size_t size,
                                      const char *options, cl_program *out)
{
    cl_int err = CL_SUCCESS;
    cl_program program = clmla_cl_program_source(ctx, src, size, &err);
    if (!program)
        return clmla_fail_cl(ctx, err, "clCreateProgramWithSource");
    err = clmla_cl_build(ctx, program, options);
    ctx->program_stats.built_from_source++;
    if (err != CL_SUCCESS) {
        size_t log_size = 0;
        clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &log_size);
        char *log = malloc(log_size + 1);
        if (log && clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, log_size, log, NULL) == CL_SUCCESS)
            log[log_size] = '\0';
        else if (log)
            log[0] = '\0';
        clmla_status st = clmla_fail(ctx, CLMLA_ERROR_BUILD_FAILED, "building kernel %s.cl with options '%s' failed (%s):\n%s",
                                     name, options, clmla_status_string(err), log ? log : "(no log)");
        free(log);
        clReleaseProgram(program);
        return st;
    }
    /* A build that succeeded may still have warned: said at info level, so that a kernel change
       that makes a compiler warn is seen (the library never prints). */
    size_t log_size = 0;
    if (ctx->log && ctx->log_level >= CLMLA_LOG_INFO &&
        clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &log_size) == CL_SUCCESS &&
        log_size > 1) {
        char *log = malloc(log_size + 1);
        if (log && clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, log_size, log, NULL) == CL_SUCCESS) {
            log[log_size] = '\0';
            if (strstr(log, "warning"))
                clmla_log(ctx, CLMLA_LOG_INFO, "kernel %s.cl with options '%s' built with warnings:\n%s", name,
                          options, log);
        }
        free(log);
    }
    *out = program;
    return CLMLA_SUCCESS;
}

clmla_status clmla_program_get(clmla_context *ctx, const char *name, const char *options, cl_program *out)
{
    if (!ctx || !out)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_program_get: NULL argument");
    if (!valid_name(name))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "kernel name '%s' is not a plain file name", name ? name : "(null)");
    if (!options)
        options = "";
    char *src = NULL;
    size_t size = 0;
    clmla_status status = assemble_source(ctx, name, &src, &size);
    if (status != CLMLA_SUCCESS)
        return status;

    clmla_hash h;
    clmla_hash_init(&h);
    clmla_hash_str(&h, name);
    clmla_hash_bytes(&h, src, size);
    clmla_hash_str(&h, options);
    clmla_hash_str(&h, ctx->device_key);
    char key[33];
    clmla_hash_hex(&h, key);

    for (clmla_program_entry *e = ctx->programs; e; e = e->next)
        if (strcmp(e->key, key) == 0) {
            ctx->program_stats.memory_hits++;
            *out = e->program;
            free(src);
            return CLMLA_SUCCESS;
        }

    clmla_program_entry *entry = calloc(1, sizeof(*entry));
    if (!entry) {
        free(src);
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    const double t0 = clmla_now_ms();
    cl_program program = load_cached(ctx, key, options);
    if (program) {
        clmla_log(ctx, CLMLA_LOG_INFO, "kernel %s.cl [%s]: loaded from the program cache in %.1f ms", name, options,
                  clmla_now_ms() - t0);
    } else {
        status = build_from_source(ctx, name, src, size, options, &program);
        if (status == CLMLA_SUCCESS) {
            clmla_log(ctx, CLMLA_LOG_INFO, "kernel %s.cl [%s]: built from source in %.1f ms", name, options,
                      clmla_now_ms() - t0);
            store_cached(ctx, key, program);
        }
    }
    free(src);
    if (status != CLMLA_SUCCESS) {
        free(entry);
        return status;
    }
    memcpy(entry->key, key, sizeof(key));
    entry->program = program;
    entry->next = ctx->programs;
    ctx->programs = entry;
    *out = program;
    return CLMLA_SUCCESS;
}

clmla_status clmla_kernel_create(clmla_context *ctx, const char *name, const char *options,
                                 const char *kernel_name, cl_kernel *kernel)
{
    cl_program program = NULL;
    clmla_status status = clmla_program_get(ctx, name, options, &program);
    if (status != CLMLA_SUCCESS)
        return status;
    cl_int err = CL_SUCCESS;
    *kernel = clmla_cl_kernel(ctx, program, kernel_name, &err);
    if (!*kernel)
        return clmla_fail(ctx, err, "clCreateKernel(%s) from %s.cl failed: %s", kernel_name, name, clmla_status_string(err));
    return CLMLA_SUCCESS;
}

clmla_status clmla_kernel_create_fitted(clmla_context *ctx, const clmla_kernel_fit *fit, cl_kernel *kernel, int *items)
{
    *kernel = NULL;
    *items = 0;
    for (int n = fit->max_items; n >= fit->min_items && n >= 1; n /= 2) {
        const size_t wg_limit = ctx->info.max_work_group_size, local_limit = ctx->info.local_mem_bytes; /* 0: unknown */
        if ((wg_limit && (size_t)n > wg_limit) || (local_limit && fit->local_bytes && fit->local_bytes(n, fit->arg) > local_limit))
            continue;
        char options[512];
        snprintf(options, sizeof(options), "%s -D %s=%d", fit->options, fit->define, n);
        cl_kernel k = NULL;
        clmla_status st = clmla_kernel_create(ctx, fit->file, options, fit->kernel_name, &k);
        if (st != CLMLA_SUCCESS)
            return st;
        size_t limit = 0;
        if (clGetKernelWorkGroupInfo(k, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(limit), &limit, NULL) !=
                CL_SUCCESS ||
            limit >= (size_t)n) {
            *kernel = k;
            *items = n;
            return CLMLA_SUCCESS;
        }
        clReleaseKernel(k);
    }
    return CLMLA_SUCCESS;
}

void clmla_program_cache_release(clmla_context *ctx)
{
    clmla_program_entry *e = ctx->programs;
    while (e) {
        clmla_program_entry *next = e->next;
        clReleaseProgram(e->program);
        free(e);
        e = next;
    }
    ctx->programs = NULL;
}

int clmla_device_denormals(const clmla_context *ctx)
{
    cl_device_fp_config fp = 0;
    if (clGetDeviceInfo(ctx->device, CL_DEVICE_SINGLE_FP_CONFIG, sizeof(fp), &fp, NULL) != CL_SUCCESS)
        fp = 0;
    return (fp & CL_FP_DENORM) != 0;
}

int clmla_fp8_decoder(const clmla_context *ctx)
{
    const int forced = clmla_hook_fp8_decoder(ctx);
    if (forced != CLMLA_FP8_DECODER_AUTO)
        return forced;
    if (ctx->info.kind == CLMLA_DEVICE_KIND_CPU)
        return CLMLA_FP8_DECODER_HALF;
    return clmla_device_denormals(ctx) ? CLMLA_FP8_DECODER_SHIFT : CLMLA_FP8_DECODER_REBIAS;
}

const char *clmla_fp8_option(const clmla_context *ctx)
{
    switch (clmla_fp8_decoder(ctx)) {
    case CLMLA_FP8_DECODER_HALF:
        return " -D CLMLA_FP8_HALF";
    case CLMLA_FP8_DECODER_REBIAS:
        return " -D CLMLA_NO_DENORMS";
    default:
        return "";
    }
}
