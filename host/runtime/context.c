/* A context: one device, its OpenCL context and an in-order queue, plus the program cache. */
#include "internal.h"
#include "clcall.h"
#include "program.h"
#include "scratch.h"
#include "trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The device's identity for cache keys, the limit clmla_cl_enqueue_rows needs per launch, and
   program_binaries' auto decided by the device as it is (tests that play another kind of device
   later do not turn the disk cache on). */
static void set_device_key(clmla_context *ctx)
{
    if (ctx->program_binaries < 0)
        ctx->program_binaries = !clmla_device_pocl_cpu(&ctx->info);
    snprintf(ctx->device_key, sizeof(ctx->device_key), "%s|%s|%s|%s", ctx->info.platform_name,
             ctx->info.name, ctx->info.device_version, ctx->info.driver_version);
    size_t items[3] = {0, 0, 0};
    if (clGetDeviceInfo(ctx->device, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof(items), items, NULL) == CL_SUCCESS)
        ctx->max_items0 = items[0];
}

static cl_command_queue make_queue(cl_context c, cl_device_id dev, int *profiling, cl_int *err)
{
    if (clmla_fault_hit(NULL)) {
        *err = CL_OUT_OF_HOST_MEMORY;
        *profiling = 0;
        return NULL;
    }
    cl_command_queue q = clCreateCommandQueue(c, dev, CL_QUEUE_PROFILING_ENABLE, err);
    *profiling = q != NULL;
    if (!q)
        q = clCreateCommandQueue(c, dev, 0, err);
    return q;
}

/* The kernel kind named by an option or its variable (`which`: "attention" or "product"): *out a
   CLMLA_LATENT_* value, or the failure naming the value and the choices. */
static clmla_status kernels_option(const char *value, const char *which, const char *variable, int *out)
{
    *out = !value || !*value || strcmp(value, "auto") == 0 ? CLMLA_LATENT_AUTO
           : strcmp(value, "rows") == 0                   ? CLMLA_LATENT_ROWS
           : strcmp(value, "group") == 0                  ? CLMLA_LATENT_GROUP
                                                          : -1;
    if (*out >= 0)
        return CLMLA_SUCCESS;
    return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT,
                      "%s kernels '%s' (clmla_context_options.%s_kernels or %s): expected auto, rows or group", which,
                      value, which, variable);
}

/* clmla_context_options.program_binaries / CLMLA_PROGRAM_BINARIES: "" and "auto" give -1 */
static clmla_status binaries_option(const char *value, int *out)
{
    *out = !value[0] || strcmp(value, "auto") == 0 ? -1 : strcmp(value, "on") == 0 ? 1 : strcmp(value, "off") == 0 ? 0 : -2;
    if (*out >= -1)
        return CLMLA_SUCCESS;
    return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT,
                      "program binaries '%s' (clmla_context_options.program_binaries or CLMLA_PROGRAM_BINARIES): "
                      "expected auto, on or off",
                      value);
}

/* CLMLA_LOG's printer: each message on a line of stderr */
static void log_to_stderr(void *user, clmla_log_level level, const char *message)
{
    (void)user;
    fprintf(stderr, "clmla: %s: %s\n", level == CLMLA_LOG_WARNING ? "warning" : "info", message);
}

/* A zeroed context with the options' environment, attention and product kernels and log callback. */
static clmla_status new_context(const clmla_context_options *options, clmla_context **out)
{
    clmla_context *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return clmla_fail(NULL, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    clmla_env_with_options(&ctx->env, options);
    clmla_status st = kernels_option(ctx->env.attention_kernels, "attention", "CLMLA_ATTENTION_KERNELS",
                                     &ctx->latent_variant);
    if (st == CLMLA_SUCCESS)
        st = kernels_option(ctx->env.product_kernels, "product", "CLMLA_PRODUCT_KERNELS", &ctx->product_variant);
    if (st == CLMLA_SUCCESS)
        st = binaries_option(ctx->env.program_binaries, &ctx->program_binaries);
    if (st != CLMLA_SUCCESS) {
        free(ctx);
        return st;
    }
    if (options && options->log && options->log_level > CLMLA_LOG_OFF) {
        ctx->log = options->log;
        ctx->log_user = options->log_user;
        ctx->log_level = options->log_level;
    } else if (ctx->env.log[0] && strcmp(ctx->env.log, "off") != 0) {
        /* no callback of the caller's: CLMLA_LOG prints up to its level */
        const char *v = ctx->env.log;
        if (strcmp(v, "warning") != 0 && strcmp(v, "info") != 0) {
            /* the message first: v is the context's own */
            st = clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "CLMLA_LOG '%s': expected off, warning or info", v);
            free(ctx);
            return st;
        }
        ctx->log = log_to_stderr;
        ctx->log_level = strcmp(v, "info") == 0 ? CLMLA_LOG_INFO : CLMLA_LOG_WARNING;
    }
    *out = ctx;
    return CLMLA_SUCCESS;
}

clmla_status clmla_runtime_context_create(const clmla_context_options *options, clmla_context **out)
{
    if (!out)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_context_create: NULL output pointer");
    *out = NULL;

    clmla_context *ctx = NULL;
    clmla_status status = new_context(options, &ctx);
    if (status != CLMLA_SUCCESS)
        return status;
    const char *device_spec = options ? options->device : NULL;

    clmla_device_info *devs = NULL;
    size_t n = 0;
    status = clmla_devices_list(&devs, &n);
    if (status != CLMLA_SUCCESS) {
        free(ctx);
        return status;
    }
    size_t index = 0;
    char why[CLMLA_ERRMSG_SIZE];
    status = clmla_spec_match(device_spec, ctx->env.device, devs, n, &index, why, sizeof(why));
    if (status != CLMLA_SUCCESS) {
        free(devs);
        free(ctx);
        return clmla_fail(NULL, status, "%s", why);
    }
    ctx->info = devs[index];
    free(devs);
    ctx->platform = ctx->info.platform_id;
    ctx->device = ctx->info.device_id;

    cl_int err = CL_SUCCESS;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)ctx->platform, 0};
    ctx->cl_ctx = clmla_fault_hit(NULL) ? (err = CL_OUT_OF_HOST_MEMORY, NULL)
                                        : clCreateContext(props, 1, &ctx->device, NULL, NULL, &err);
    if (!ctx->cl_ctx) {
        status = clmla_fail(NULL, err, "clCreateContext for '%s' failed: %s (%d)", ctx->info.name,
                            clmla_status_string(err), err);
        free(ctx);
        return status;
    }
    ctx->queue = make_queue(ctx->cl_ctx, ctx->device, &ctx->profiling, &err);
    if (!ctx->queue) {
        status = clmla_fail(NULL, err, "clCreateCommandQueue for '%s' failed: %s (%d)", ctx->info.name,
                            clmla_status_string(err), err);
        clReleaseContext(ctx->cl_ctx);
        free(ctx);
        return status;
    }
    set_device_key(ctx);
    clmla_trace_open(ctx, ctx->env.trace);
    *out = ctx;
    return CLMLA_SUCCESS;
}

clmla_status clmla_runtime_context_from_queue(cl_command_queue queue, const clmla_context_options *options,
                                             clmla_context **out)
{
    if (!out || !queue)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_context_create_from_queue: NULL argument");
    *out = NULL;
    cl_context c = NULL;
    cl_device_id dev = NULL;
    cl_command_queue_properties qp = 0;
    cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof(c), &c, NULL);
    if (err == CL_SUCCESS)
        err = clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof(dev), &dev, NULL);
    if (err == CL_SUCCESS)
        err = clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof(qp), &qp, NULL);
    if (err != CL_SUCCESS)
        return clmla_fail_cl(NULL, err, "clGetCommandQueueInfo");
    if (qp & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT,
                          "the queue is out-of-order; clmla chains its commands on an in-order queue");
    cl_platform_id plat = NULL;
    err = clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof(plat), &plat, NULL);
    if (err != CL_SUCCESS)
        return clmla_fail_cl(NULL, err, "clGetDeviceInfo(CL_DEVICE_PLATFORM)");

    clmla_context *ctx = NULL;
    clmla_status st = new_context(options, &ctx);
    if (st != CLMLA_SUCCESS)
        return st;
    clmla_device_query(plat, dev, &ctx->info);
    /* Find the device's place in the flat list, when it is there. */
    clmla_device_info *devs = NULL;
    size_t n = 0;
    if (clmla_devices_list(&devs, &n) == CLMLA_SUCCESS) {
        for (size_t i = 0; i < n; i++)
            if (devs[i].device_id == dev) {
                ctx->info = devs[i];
                break;
            }
        free(devs);
    }
    clmla_clear_error(NULL);
    ctx->platform = plat;
    ctx->device = dev;
    ctx->cl_ctx = c;
    ctx->queue = queue;
    ctx->profiling = (qp & CL_QUEUE_PROFILING_ENABLE) != 0;
    clRetainContext(c);
    clRetainCommandQueue(queue);
    set_device_key(ctx);
    clmla_trace_open(ctx, ctx->env.trace);
    *out = ctx;
    return CLMLA_SUCCESS;
}

void clmla_context_destroy(clmla_context *ctx)
{
    if (!ctx)
        return;
    if (ctx->queue)
        clFinish(ctx->queue);
    clmla_trace_close(ctx);
    if (ctx->products && ctx->products_release)
        ctx->products_release(ctx->products);
    clmla_program_cache_release(ctx);
    clmla_scratch_release(ctx);
    if (ctx->queue)
        clReleaseCommandQueue(ctx->queue);
    if (ctx->cl_ctx)
        clReleaseContext(ctx->cl_ctx);
    free(ctx->hooks);
    free(ctx);
}

clmla_status clmla_context_device(const clmla_context *ctx, clmla_device_info *info)
{
    if (!ctx || !info)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_context_device: NULL argument");
    *info = ctx->info;
    return CLMLA_SUCCESS;
}

cl_context clmla_context_cl_context(const clmla_context *ctx)
{
    return ctx ? ctx->cl_ctx : NULL;
}

cl_command_queue clmla_context_queue(const clmla_context *ctx)
{
    return ctx ? ctx->queue : NULL;
}

clmla_status clmla_context_program_stats(const clmla_context *ctx, clmla_program_stats *stats)
{
    if (!ctx || !stats)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_context_program_stats: NULL argument");
    *stats = ctx->program_stats;
    return CLMLA_SUCCESS;
}
