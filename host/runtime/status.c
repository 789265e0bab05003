/* Status names and the last-error messages (per context, or per thread without one). */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char thread_errmsg[CLMLA_ERRMSG_SIZE];

const char *clmla_version_string(void)
{
#define CLMLA_STR2(x) #x
#define CLMLA_STR(x) CLMLA_STR2(x)
    return CLMLA_STR(CLMLA_VERSION_MAJOR) "." CLMLA_STR(CLMLA_VERSION_MINOR) "." CLMLA_STR(CLMLA_VERSION_PATCH);
}

typedef struct {
    int code;
    const char *name;
} status_name;

#define NAME(c) {c, #c}
static const status_name names[] = {
    NAME(CLMLA_SUCCESS),
    NAME(CLMLA_ERROR_INVALID_ARGUMENT), NAME(CLMLA_ERROR_OUT_OF_HOST_MEMORY),
    NAME(CLMLA_ERROR_NO_PLATFORM), NAME(CLMLA_ERROR_NO_DEVICE), NAME(CLMLA_ERROR_DEVICE_NOT_FOUND),
    NAME(CLMLA_ERROR_KERNEL_NOT_FOUND), NAME(CLMLA_ERROR_BUILD_FAILED),
    NAME(CLMLA_ERROR_INVALID_CONFIG), NAME(CLMLA_ERROR_SHAPE_MISMATCH),
    NAME(CLMLA_ERROR_MISSING_TENSOR), NAME(CLMLA_ERROR_CACHE_FULL),
    NAME(CLMLA_ERROR_UNKNOWN_SEQUENCE), NAME(CLMLA_ERROR_UNSUPPORTED), NAME(CLMLA_ERROR_IO),
    NAME(CLMLA_ERROR_INVALID_FILE), NAME(CLMLA_ERROR_INTERNAL),
    /* OpenCL 1.2 */
    {-1, "CL_DEVICE_NOT_FOUND"}, {-2, "CL_DEVICE_NOT_AVAILABLE"}, {-3, "CL_COMPILER_NOT_AVAILABLE"},
    {-4, "CL_MEM_OBJECT_ALLOCATION_FAILURE"}, {-5, "CL_OUT_OF_RESOURCES"},
    {-6, "CL_OUT_OF_HOST_MEMORY"}, {-7, "CL_PROFILING_INFO_NOT_AVAILABLE"},
    {-8, "CL_MEM_COPY_OVERLAP"}, {-9, "CL_IMAGE_FORMAT_MISMATCH"},
    {-10, "CL_IMAGE_FORMAT_NOT_SUPPORTED"}, {-11, "CL_BUILD_PROGRAM_FAILURE"},
    {-12, "CL_MAP_FAILURE"}, {-13, "CL_MISALIGNED_SUB_BUFFER_OFFSET"},
    {-14, "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST"}, {-15, "CL_COMPILE_PROGRAM_FAILURE"},
    {-16, "CL_LINKER_NOT_AVAILABLE"}, {-17, "CL_LINK_PROGRAM_FAILURE"},
    {-18, "CL_DEVICE_PARTITION_FAILED"}, {-19, "CL_KERNEL_ARG_INFO_NOT_AVAILABLE"},
    {-30, "CL_INVALID_VALUE"}, {-31, "CL_INVALID_DEVICE_TYPE"}, {-32, "CL_INVALID_PLATFORM"},
    {-33, "CL_INVALID_DEVICE"}, {-34, "CL_INVALID_CONTEXT"}, {-35, "CL_INVALID_QUEUE_PROPERTIES"},
    {-36, "CL_INVALID_COMMAND_QUEUE"}, {-37, "CL_INVALID_HOST_PTR"}, {-38, "CL_INVALID_MEM_OBJECT"},
    {-39, "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR"}, {-40, "CL_INVALID_IMAGE_SIZE"},
    {-41, "CL_INVALID_SAMPLER"}, {-42, "CL_INVALID_BINARY"}, {-43, "CL_INVALID_BUILD_OPTIONS"},
    {-44, "CL_INVALID_PROGRAM"}, {-45, "CL_INVALID_PROGRAM_EXECUTABLE"},
    {-46, "CL_INVALID_KERNEL_NAME"}, {-47, "CL_INVALID_KERNEL_DEFINITION"},
    {-48, "CL_INVALID_KERNEL"}, {-49, "CL_INVALID_ARG_INDEX"}, {-50, "CL_INVALID_ARG_VALUE"},
    {-51, "CL_INVALID_ARG_SIZE"}, {-52, "CL_INVALID_KERNEL_ARGS"},
    {-53, "CL_INVALID_WORK_DIMENSION"}, {-54, "CL_INVALID_WORK_GROUP_SIZE"},
    {-55, "CL_INVALID_WORK_ITEM_SIZE"}, {-56, "CL_INVALID_GLOBAL_OFFSET"},
    {-57, "CL_INVALID_EVENT_WAIT_LIST"}, {-58, "CL_INVALID_EVENT"}, {-59, "CL_INVALID_OPERATION"},
    {-60, "CL_INVALID_GL_OBJECT"}, {-61, "CL_INVALID_BUFFER_SIZE"}, {-62, "CL_INVALID_MIP_LEVEL"},
    {-63, "CL_INVALID_GLOBAL_WORK_SIZE"}, {-64, "CL_INVALID_PROPERTY"},
    {-65, "CL_INVALID_IMAGE_DESCRIPTOR"}, {-66, "CL_INVALID_COMPILER_OPTIONS"},
    {-67, "CL_INVALID_LINKER_OPTIONS"}, {-68, "CL_INVALID_DEVICE_PARTITION_COUNT"},
    {-69, "CL_INVALID_PIPE_SIZE"}, {-70, "CL_INVALID_DEVICE_QUEUE"},
    {-1001, "CL_PLATFORM_NOT_FOUND_KHR"},
    /* CLBlast's own (clblast_c.h) */
    {-1024, "CLBlastNotImplemented"}, {-1022, "CLBlastInvalidMatrixA"},
    {-1021, "CLBlastInvalidMatrixB"}, {-1020, "CLBlastInvalidMatrixC"},
    {-1019, "CLBlastInvalidVectorX"}, {-1018, "CLBlastInvalidVectorY"},
    {-1017, "CLBlastInvalidDimension"}, {-1016, "CLBlastInvalidLeadDimA"},
    {-1015, "CLBlastInvalidLeadDimB"}, {-1014, "CLBlastInvalidLeadDimC"},
    {-1013, "CLBlastInvalidIncrementX"}, {-1012, "CLBlastInvalidIncrementY"},
    {-1011, "CLBlastInsufficientMemoryA"}, {-1010, "CLBlastInsufficientMemoryB"},
    {-1009, "CLBlastInsufficientMemoryC"}, {-1008, "CLBlastInsufficientMemoryX"},
    {-1007, "CLBlastInsufficientMemoryY"}, {-2050, "CLBlastInsufficientMemoryTemp"},
    {-2049, "CLBlastInvalidBatchCount"}, {-2048, "CLBlastInvalidOverrideKernel"},
    {-2047, "CLBlastMissingOverrideParameter"}, {-2046, "CLBlastInvalidLocalMemUsage"},
    {-2045, "CLBlastNoHalfPrecision"}, {-2044, "CLBlastNoDoublePrecision"},
    {-2043, "CLBlastInvalidVectorScalar"}, {-2042, "CLBlastInsufficientMemoryScalar"},
    {-2041, "CLBlastDatabaseError"}, {-2040, "CLBlastUnknownError"},
    {-2039, "CLBlastUnexpectedError"},
};
#undef NAME

const char *clmla_status_string(clmla_status status)
{
    static _Thread_local char unknown[48];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (names[i].code == status)
            return names[i].name;
    snprintf(unknown, sizeof(unknown), "unknown status %d", status);
    return unknown;
}

static char *errbuf(clmla_context *ctx)
{
    return ctx ? ctx->errmsg : thread_errmsg;
}

clmla_status clmla_fail(clmla_context *ctx, clmla_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf(ctx), CLMLA_ERRMSG_SIZE, fmt, ap);
    va_end(ap);
    return status;
}

clmla_status clmla_entry(clmla_context *ctx, const char *fn, const char *missing, cl_event *event)
{
    if (event)
        *event = NULL;
    return missing ? clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: NULL %s", fn, missing) : CLMLA_SUCCESS;
}

clmla_status clmla_fail_cl(clmla_context *ctx, cl_int err, const char *what)
{
    return clmla_fail(ctx, err, "%s failed: %s (%d)", what, clmla_status_string(err), err);
}

void clmla_clear_error(clmla_context *ctx)
{
    errbuf(ctx)[0] = '\0';
}

const char *clmla_last_error(const clmla_context *ctx)
{
    return ctx ? ctx->errmsg : thread_errmsg;
}

void clmla_log(clmla_context *ctx, clmla_log_level level, const char *fmt, ...)
{
    if (!ctx || !ctx->log || level == CLMLA_LOG_OFF || level > ctx->log_level)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ctx->log(ctx->log_user, level, msg);
}
