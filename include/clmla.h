/*
 * clmla: DeepSeek Multi-head Latent Attention on any OpenCL device.
 *
 * The whole public API. Conventions:
 *  - every call returns a clmla_status; 0 (CLMLA_SUCCESS) is success. OpenCL's own negative codes
 *    and CLBlast's codes pass through unchanged; clmla's own codes are CLMLA_ERROR_* below, in
 *    the range [-5099, -5000]. clmla_status_string() names any of them;
 *  - the human-readable reason for the last failure is clmla_last_error(ctx), or, for calls that
 *    have no context (or that failed to make one), clmla_last_error(NULL), which is per thread;
 *  - handles are created and destroyed in pairs; destroy accepts NULL;
 *  - descriptor structs are valid when zero-initialised: 0 means "default";
 *  - the library never exits, aborts or prints on its own.
 */
#ifndef CLMLA_H
#define CLMLA_H

#include <stddef.h>
#include <stdint.h>

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CLMLA_VERSION_MAJOR 0
#define CLMLA_VERSION_MINOR 1
#define CLMLA_VERSION_PATCH 0

/* "MAJOR.MINOR.PATCH" of the library actually linked. */
const char *clmla_version_string(void);

/* ---- status codes ------------------------------------------------------------------------- */

typedef int clmla_status;

enum {
    CLMLA_SUCCESS = 0,
    /* Values in [-5099, -5000] are clmla's own; any other negative value is an OpenCL or CLBlast
       code passed through unchanged. */
    CLMLA_ERROR_INVALID_ARGUMENT = -5000, /* a NULL handle, a bad size, a malformed value */
    CLMLA_ERROR_OUT_OF_HOST_MEMORY = -5001,
    CLMLA_ERROR_NO_PLATFORM = -5002,      /* no OpenCL platform / ICD is installed */
    CLMLA_ERROR_NO_DEVICE = -5003,        /* platforms exist, but they expose no device */
    CLMLA_ERROR_DEVICE_NOT_FOUND = -5004, /* a device spec matched nothing or was malformed */
    CLMLA_ERROR_KERNEL_NOT_FOUND = -5005, /* no such kernel source (embedded or in CLMLA_KERNEL_DIR) */
    CLMLA_ERROR_BUILD_FAILED = -5006,     /* kernel compile error; the log is in clmla_last_error */
    CLMLA_ERROR_INVALID_CONFIG = -5007,   /* a layer configuration is inconsistent */
    CLMLA_ERROR_SHAPE_MISMATCH = -5008,   /* a tensor's shape differs from the expected one */
    CLMLA_ERROR_MISSING_TENSOR = -5009,   /* a required weight was not given */
    CLMLA_ERROR_CACHE_FULL = -5010,       /* the KV cache has too few free blocks; nothing changed */
    CLMLA_ERROR_UNKNOWN_SEQUENCE = -5011, /* a sequence id that the cache does not hold */
    CLMLA_ERROR_UNSUPPORTED = -5012,      /* the device lacks something the call needs */
    CLMLA_ERROR_IO = -5013,               /* a file could not be read or written */
    CLMLA_ERROR_INVALID_FILE = -5014,     /* a file's contents are malformed */
    CLMLA_ERROR_INTERNAL = -5099          /* a bug in clmla: please report it */
};

/* A static, never-NULL name for any status: "CLMLA_ERROR_CACHE_FULL", "CL_OUT_OF_RESOURCES",
   "CLBlastInvalidDimension", or "unknown status -123". */
const char *clmla_status_string(clmla_status status);

/* ---- devices ------------------------------------------------------------------------------ */

typedef enum clmla_device_kind {
    CLMLA_DEVICE_KIND_OTHER = 0,
    CLMLA_DEVICE_KIND_CPU = 1,
    CLMLA_DEVICE_KIND_GPU = 2,
    CLMLA_DEVICE_KIND_ACCELERATOR = 3
} clmla_device_kind;

typedef struct clmla_device_info {
    int index;              /* position in the flat list `clmla devices` prints */
    int platform_index;     /* P of "P:D" */
    int device_index;       /* D of "P:D": the device's index inside its platform */
    clmla_device_kind kind;
    char platform_name[128];
    char vendor[128];
    char name[128];
    char device_version[128]; /* CL_DEVICE_VERSION */
    char driver_version[128]; /* CL_DRIVER_VERSION */
    uint64_t global_mem_bytes;
    uint64_t max_alloc_bytes;
    uint64_t local_mem_bytes;
    unsigned compute_units;
    size_t max_work_group_size;
    int fp16;               /* 1 when cl_khr_fp16 (half arithmetic) is supported */
    int fp64;               /* 1 when cl_khr_fp64 is supported */
    int is_default;         /* 1 for the device the default spec (no argument, CLMLA_DEVICE unset) picks */
    cl_platform_id platform_id;
    cl_device_id device_id;
} clmla_device_info;

/* Every OpenCL device on every platform, in the flat order of `clmla devices`. The array is
   allocated by the library; free it with clmla_free(). With no platform at all the call returns
   CLMLA_ERROR_NO_PLATFORM and *count = 0. */
clmla_status clmla_devices_list(clmla_device_info **devices, size_t *count);

/* Resolves a device spec to an index of clmla_devices_list. spec NULL or "" means: the
   CLMLA_DEVICE environment variable, else the first GPU, else the first device. Forms:
     "P:D"       platform P, device D (both decimal)
     "N"         flat index N
     "gpu" | "cpu" | "accelerator"   the first device of that type
     text        the first device whose platform, vendor or device name contains it (any case)
   A spec that matches nothing, or is malformed, returns CLMLA_ERROR_DEVICE_NOT_FOUND and the
   message in clmla_last_error(NULL) lists every device. */
clmla_status clmla_device_resolve(const char *spec, size_t *index);

/* Frees memory the library allocated for the caller (device lists). NULL is accepted. */
void clmla_free(void *ptr);

/* ---- context ------------------------------------------------------------------------------ */

typedef struct clmla_context clmla_context;

/* Opens the device the spec names (see clmla_device_resolve) with its own OpenCL context and an
   in-order command queue (profiling enabled when the device allows it). On failure *ctx is NULL
   and clmla_last_error(NULL) says why. */
clmla_status clmla_context_create(const char *device_spec, clmla_context **ctx);

/* Wraps a caller's OpenCL objects instead (an engine that already has its queue). The queue must
   be in-order; the library retains the context, device and queue and releases them on destroy. */
clmla_status clmla_context_create_from_queue(cl_command_queue queue, clmla_context **ctx);

void clmla_context_destroy(clmla_context *ctx);

/* The message of the last failed call on this context (or, with NULL, of the last failed call
   without a context on this thread). Never NULL; "" when nothing failed. Valid until the next
   call that fails. */
const char *clmla_last_error(const clmla_context *ctx);

/* The device behind the context, filled as by clmla_devices_list (index -1 when it came from
   clmla_context_create_from_queue and is not in the list). */
clmla_status clmla_context_device(const clmla_context *ctx, clmla_device_info *info);

cl_context clmla_context_cl_context(const clmla_context *ctx);
cl_command_queue clmla_context_queue(const clmla_context *ctx);

/* Counters of the kernel program cache, for tests and for the curious. */
typedef struct clmla_program_stats {
    uint64_t built_from_source;   /* clBuildProgram from source */
    uint64_t loaded_from_disk;    /* programs built from a binary in the disk cache */
    uint64_t memory_hits;         /* requests answered from the in-memory cache */
    uint64_t disk_rejected;       /* disk cache files that were unreadable, truncated or corrupt */
    uint64_t disk_written;        /* binaries stored in the disk cache */
} clmla_program_stats;

clmla_status clmla_context_program_stats(const clmla_context *ctx, clmla_program_stats *stats);

/* Builds (or fetches from the caches) the program of kernel file cl/<name>.cl with extra build
   options, so engines can warm up at start time. A compile error returns
   CLMLA_ERROR_BUILD_FAILED and the build log is in clmla_last_error(ctx). */
clmla_status clmla_context_prepare_kernel(clmla_context *ctx, const char *name, const char *options);

#ifdef __cplusplus
}
#endif
#endif /* CLMLA_H */
