/* An OpenCL driver (an ICD that ocl-icd loads) with one device that reports what a device profile
 * says (tools/vendor/profiles/ *.json), and that compiles nothing: it records each program the
 * library builds (its source and options), each kernel it creates and each work-group shape it
 * launches, so that `clmla kernels --profile FILE` runs the library's own selection logic (kernel
 * choice, tuning tables, build options, work-group fitting) for a device that is not here.
 *
 * Buffers hold no memory: writes, copies and fills do nothing, reads and maps give zeros. Kernels
 * run nothing. Every launch is checked against the device's work-group limits as a driver would.
 *
 * Environment:
 *   CLMLA_PROFILE         the profile's path (required; a profile that is refused makes the
 *                         driver report no platform, and prints why on stderr)
 *   CLMLA_PROFILE_RECORD  a folder to write the record to (src/HASH.cl and record.tsv); none: no
 *                         record
 * Exported: clIcdGetPlatformIDsKHR, clGetExtensionFunctionAddress and clGetPlatformInfo for the loader, and
 * clmla_profile_check (used by `clmla kernels` to refuse a bad profile by name before it starts).
 */
#define _POSIX_C_SOURCE 200809L
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_0_APIS
#define CL_USE_DEPRECATED_OPENCL_1_1_APIS
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#define CL_USE_DEPRECATED_OPENCL_2_0_APIS
#include <CL/cl.h>
#include <CL/cl_ext.h>
#include <CL/cl_icd.h>
#include <cjson/cJSON.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- the profile -------------------------------------------------------------------------- */

typedef struct profile {
    char platform_name[256], platform_vendor[256], platform_version[256];
    char vendor[256], name[256], board_name[256], version[256], driver_version[256], c_version[256];
    char *extensions;
    cl_device_type type;
    cl_uint vendor_id, compute_units, clock_mhz, address_bits;
    size_t max_wg, items[3], wg_multiple, kernel_wg;
    size_t subgroups[8];
    int nsubgroups;
    cl_ulong local_mem, global_mem, max_alloc;
    cl_uint base_align_bits;
    cl_bool unified;
    cl_device_fp_config fp32, fp64, fp16;
    int nv; /* NVIDIA's attribute query: compute capability */
    cl_uint cc_major, cc_minor, nv_registers;
} profile;

/* Smallest local memory clmla's kernels are written for: OpenCL 1.2's full profile guarantee. */
#define MIN_LOCAL_MEM 32768

static int get_str(const cJSON *obj, const char *key, const char *where, char *out, size_t size, int required,
                   char *why, size_t why_size)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) {
        if (!required) {
            out[0] = '\0';
            return 0;
        }
        snprintf(why, why_size, "field %s.%s is missing", where, key);
        return -1;
    }
    if (!cJSON_IsString(v) || (required && !v->valuestring[0]) || strlen(v->valuestring) >= size) {
        snprintf(why, why_size, "field %s.%s must be a non-empty string of fewer than %zu characters", where, key, size);
        return -1;
    }
    snprintf(out, size, "%s", v->valuestring);
    return 0;
}

/* A whole number within [lo, hi]; *out untouched and 0 returned when absent and not required. */
static int get_num(const cJSON *obj, const char *key, const char *where, double lo, double hi, int required,
                   double *out, char *why, size_t why_size)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) {
        if (!required)
            return 0;
        snprintf(why, why_size, "field %s.%s is missing", where, key);
        return -1;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long long)v->valuedouble || v->valuedouble < lo ||
        v->valuedouble > hi) {
        snprintf(why, why_size, "field %s.%s must be a whole number from %.0f to %.0f", where, key, lo, hi);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

static cl_device_fp_config fp_config(const cJSON *list, int *bad)
{
    static const struct {
        const char *name;
        cl_device_fp_config bit;
    } bits[] = {{"denorm", CL_FP_DENORM},
                {"inf_nan", CL_FP_INF_NAN},
                {"round_to_nearest", CL_FP_ROUND_TO_NEAREST},
                {"round_to_zero", CL_FP_ROUND_TO_ZERO},
                {"round_to_inf", CL_FP_ROUND_TO_INF},
                {"fma", CL_FP_FMA},
                {"soft_float", CL_FP_SOFT_FLOAT},
                {"correctly_rounded_divide_sqrt", CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT}};
    cl_device_fp_config c = 0;
    *bad = !cJSON_IsArray(list);
    const cJSON *e = NULL;
    cJSON_ArrayForEach(e, list)
    {
        size_t i = 0;
        while (i < sizeof(bits) / sizeof(bits[0]) && !(cJSON_IsString(e) && strcmp(e->valuestring, bits[i].name) == 0))
            i++;
        if (i == sizeof(bits) / sizeof(bits[0]))
            *bad = 1;
        else
            c |= bits[i].bit;
    }
    return c;
}

/* Reads and checks a profile; 0, or -1 with why naming the field. */
static int profile_load(const char *path, profile *p, char *why, size_t why_size)
{
    memset(p, 0, sizeof(*p));
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, why_size, "cannot open: %s", strerror(errno));
        return -1;
    }
    char *text = NULL;
    size_t size = 0, cap = 0;
    for (;;) {
        if (size + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *grown = realloc(text, cap);
            if (!grown) {
                free(text);
                fclose(f);
                snprintf(why, why_size, "out of memory");
                return -1;
            }
            text = grown;
        }
        size_t n = fread(text + size, 1, 4096, f);
        size += n;
        if (n < 4096)
            break;
    }
    fclose(f);
    text[size] = '\0';
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        snprintf(why, why_size, "not a JSON object");
        return -1;
    }
    int rc = -1;
    const cJSON *plat = cJSON_GetObjectItemCaseSensitive(root, "platform");
    const cJSON *dev = cJSON_GetObjectItemCaseSensitive(root, "device");
    double d = 0;
    if (!cJSON_IsObject(plat)) {
        snprintf(why, why_size, "field platform is missing (an object)");
        goto done;
    }
    if (!cJSON_IsObject(dev)) {
        snprintf(why, why_size, "field device is missing (an object)");
        goto done;
    }
    if (get_str(plat, "name", "platform", p->platform_name, sizeof(p->platform_name), 1, why, why_size) ||
        get_str(plat, "vendor", "platform", p->platform_vendor, sizeof(p->platform_vendor), 1, why, why_size) ||
        get_str(plat, "version", "platform", p->platform_version, sizeof(p->platform_version), 1, why, why_size) ||
        get_str(dev, "vendor", "device", p->vendor, sizeof(p->vendor), 1, why, why_size) ||
        get_str(dev, "name", "device", p->name, sizeof(p->name), 1, why, why_size) ||
        get_str(dev, "board_name", "device", p->board_name, sizeof(p->board_name), 0, why, why_size) ||
        get_str(dev, "version", "device", p->version, sizeof(p->version), 1, why, why_size) ||
        get_str(dev, "driver_version", "device", p->driver_version, sizeof(p->driver_version), 1, why, why_size) ||
        get_str(dev, "opencl_c_version", "device", p->c_version, sizeof(p->c_version), 1, why, why_size))
        goto done;
    if (strncmp(p->version, "OpenCL ", 7) != 0 || strncmp(p->c_version, "OpenCL C ", 9) != 0) {
        snprintf(why, why_size, "field device.%s must start as the device reports it (\"OpenCL \" / \"OpenCL C \")",
                 strncmp(p->version, "OpenCL ", 7) != 0 ? "version" : "opencl_c_version");
        goto done;
    }
    char type[32];
    if (get_str(dev, "type", "device", type, sizeof(type), 1, why, why_size))
        goto done;
    p->type = strcmp(type, "gpu") == 0 ? CL_DEVICE_TYPE_GPU
              : strcmp(type, "cpu") == 0 ? CL_DEVICE_TYPE_CPU
              : strcmp(type, "accelerator") == 0 ? CL_DEVICE_TYPE_ACCELERATOR
                                                 : 0;
    if (!p->type) {
        snprintf(why, why_size, "field device.type must be gpu, cpu or accelerator");
        goto done;
    }
    /* the figures: zero is no device's answer for any of them */
    if (get_num(dev, "vendor_id", "device", 0, 4294967295.0, 1, &d, why, why_size))
        goto done;
    p->vendor_id = (cl_uint)d;
    if (get_num(dev, "compute_units", "device", 1, 1e6, 1, &d, why, why_size))
        goto done;
    p->compute_units = (cl_uint)d;
    d = 1000;
    if (get_num(dev, "max_clock_mhz", "device", 1, 1e5, 0, &d, why, why_size))
        goto done;
    p->clock_mhz = (cl_uint)d;
    d = 64;
    if (get_num(dev, "address_bits", "device", 32, 64, 0, &d, why, why_size))
        goto done;
    p->address_bits = (cl_uint)d;
    if (get_num(dev, "max_work_group_size", "device", 1, 65536, 1, &d, why, why_size))
        goto done;
    p->max_wg = (size_t)d;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(dev, "max_work_item_sizes");
    if (!cJSON_IsArray(items) || cJSON_GetArraySize(items) != 3) {
        snprintf(why, why_size, "field device.max_work_item_sizes must be three whole numbers");
        goto done;
    }
    for (int i = 0; i < 3; i++) {
        const cJSON *e = cJSON_GetArrayItem(items, i);
        if (!cJSON_IsNumber(e) || e->valuedouble < 1 || e->valuedouble > 65536) {
            snprintf(why, why_size, "field device.max_work_item_sizes[%d] must be a whole number from 1 to 65536", i);
            goto done;
        }
        p->items[i] = (size_t)e->valuedouble;
    }
    if (get_num(dev, "preferred_work_group_size_multiple", "device", 1, 1024, 1, &d, why, why_size))
        goto done;
    p->wg_multiple = (size_t)d;
    d = (double)p->max_wg;
    if (get_num(dev, "kernel_work_group_size", "device", 1, (double)p->max_wg, 0, &d, why, why_size))
        goto done;
    p->kernel_wg = (size_t)d;
    const cJSON *sg = cJSON_GetObjectItemCaseSensitive(dev, "subgroup_sizes");
    if (!cJSON_IsArray(sg) || cJSON_GetArraySize(sg) < 1 || cJSON_GetArraySize(sg) > 8) {
        snprintf(why, why_size, "field device.subgroup_sizes must be a list of 1 to 8 sizes");
        goto done;
    }
    for (int i = 0; i < cJSON_GetArraySize(sg); i++) {
        const cJSON *e = cJSON_GetArrayItem(sg, i);
        if (!cJSON_IsNumber(e) || e->valuedouble < 1 || e->valuedouble > 128) {
            snprintf(why, why_size, "field device.subgroup_sizes[%d] must be a whole number from 1 to 128", i);
            goto done;
        }
        p->subgroups[p->nsubgroups++] = (size_t)e->valuedouble;
    }
    if (get_num(dev, "local_mem_bytes", "device", 0, 16777216, 1, &d, why, why_size))
        goto done;
    if (d < MIN_LOCAL_MEM) {
        snprintf(why, why_size,
                 "field device.local_mem_bytes is %.0f: under the %d bytes that OpenCL 1.2's full profile guarantees "
                 "and clmla's work-group kernels are written for",
                 d, MIN_LOCAL_MEM);
        goto done;
    }
    p->local_mem = (cl_ulong)d;
    if (get_num(dev, "global_mem_bytes", "device", 1 << 20, 1e15, 1, &d, why, why_size))
        goto done;
    p->global_mem = (cl_ulong)d;
    if (get_num(dev, "max_mem_alloc_bytes", "device", 1 << 20, (double)p->global_mem, 1, &d, why, why_size))
        goto done;
    p->max_alloc = (cl_ulong)d;
    if (get_num(dev, "mem_base_addr_align_bits", "device", 8, 1 << 20, 1, &d, why, why_size))
        goto done;
    if ((long long)d % 8) {
        snprintf(why, why_size, "field device.mem_base_addr_align_bits must be a multiple of 8");
        goto done;
    }
    p->base_align_bits = (cl_uint)d;
    const cJSON *uni = cJSON_GetObjectItemCaseSensitive(dev, "host_unified_memory");
    if (!cJSON_IsBool(uni)) {
        snprintf(why, why_size, "field device.host_unified_memory is missing (true or false)");
        goto done;
    }
    p->unified = cJSON_IsTrue(uni) ? CL_TRUE : CL_FALSE;
    int bad = 0;
    p->fp32 = fp_config(cJSON_GetObjectItemCaseSensitive(dev, "single_fp_config"), &bad);
    if (bad || !(p->fp32 & CL_FP_ROUND_TO_NEAREST) || !(p->fp32 & CL_FP_INF_NAN)) {
        snprintf(why, why_size,
                 "field device.single_fp_config must list the device's float capabilities (denorm, inf_nan, "
                 "round_to_nearest, round_to_zero, round_to_inf, fma, soft_float, correctly_rounded_divide_sqrt), "
                 "with inf_nan and round_to_nearest, which OpenCL requires");
        goto done;
    }
    const cJSON *ext = cJSON_GetObjectItemCaseSensitive(dev, "extensions");
    if (!cJSON_IsString(ext)) {
        snprintf(why, why_size, "field device.extensions is missing (the CL_DEVICE_EXTENSIONS string)");
        goto done;
    }
    p->extensions = strdup(ext->valuestring);
    if (strstr(p->extensions, "cl_khr_fp64"))
        p->fp64 = CL_FP_DENORM | CL_FP_INF_NAN | CL_FP_ROUND_TO_NEAREST | CL_FP_ROUND_TO_ZERO | CL_FP_ROUND_TO_INF |
                  CL_FP_FMA;
    if (strstr(p->extensions, "cl_khr_fp16"))
        p->fp16 = CL_FP_INF_NAN | CL_FP_ROUND_TO_NEAREST | CL_FP_FMA;
    const cJSON *cc = cJSON_GetObjectItemCaseSensitive(dev, "nv_compute_capability");
    if (cc) {
        if (!cJSON_IsArray(cc) || cJSON_GetArraySize(cc) != 2 || !cJSON_IsNumber(cJSON_GetArrayItem(cc, 0)) ||
            !cJSON_IsNumber(cJSON_GetArrayItem(cc, 1)) || cJSON_GetArrayItem(cc, 0)->valuedouble < 1) {
            snprintf(why, why_size, "field device.nv_compute_capability must be [major, minor]");
            goto done;
        }
        p->nv = 1;
        p->cc_major = (cl_uint)cJSON_GetArrayItem(cc, 0)->valuedouble;
        p->cc_minor = (cl_uint)cJSON_GetArrayItem(cc, 1)->valuedouble;
        d = 65536;
        if (get_num(dev, "nv_registers_per_block", "device", 1, 1 << 20, 0, &d, why, why_size))
            goto done;
        p->nv_registers = (cl_uint)d;
    }
    rc = 0;
done:
    cJSON_Delete(root);
    if (rc)
        free(p->extensions), p->extensions = NULL;
    return rc;
}

EXPORT int clmla_profile_check(const char *path, char *why, size_t why_size)
{
    profile p;
    if (profile_load(path, &p, why, why_size))
        return -1;
    free(p.extensions);
    return 0;
}

/* ---- objects ------------------------------------------------------------------------------ */

static cl_icd_dispatch dispatch;
static profile prof;

struct _cl_platform_id {
    cl_icd_dispatch *dispatch;
};
struct _cl_device_id {
    cl_icd_dispatch *dispatch;
};
struct _cl_context {
    cl_icd_dispatch *dispatch;
    cl_uint refs;
};
struct _cl_command_queue {
    cl_icd_dispatch *dispatch;
    cl_uint refs;
    cl_context context;
    cl_command_queue_properties props;
};
struct _cl_mem {
    cl_icd_dispatch *dispatch;
    cl_uint refs;
    cl_context context;
    cl_mem_flags flags;
    size_t size, origin;
    void *host;
    cl_mem parent;
};
struct _cl_program {
    cl_icd_dispatch *dispatch;
    cl_uint refs;
    cl_context context;
    char *source;
    char hash[17];
    char *options;
    int built;
};
struct _cl_kernel {
    cl_icd_dispatch *dispatch;
    cl_uint refs;
    cl_program program;
    char *name;
};
struct _cl_event {
    cl_icd_dispatch *dispatch;
    cl_uint refs;
    cl_command_queue queue;
};

static struct _cl_platform_id the_platform = {&dispatch};
static struct _cl_device_id the_device = {&dispatch};

/* ---- the record --------------------------------------------------------------------------- */

static pthread_mutex_t record_lock = PTHREAD_MUTEX_INITIALIZER;
static char record_dir[4096];
static char **launches; /* the launch lines written, each once */
static size_t nlaunches;

static void hash_source(const char *s, char out[17])
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = (h ^ *p) * 1099511628211ULL;
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

/* Appends a line to record.tsv (nothing without a record folder). */
static void record_line(const char *line)
{
    if (!record_dir[0])
        return;
    char path[4200];
    snprintf(path, sizeof(path), "%s/record.tsv", record_dir);
    FILE *f = fopen(path, "a");
    if (f) {
        fputs(line, f);
        fputc('\n', f);
        fclose(f);
    }
}

static void record_source(const cl_program p)
{
    if (!record_dir[0])
        return;
    char path[4200];
    snprintf(path, sizeof(path), "%s/src", record_dir);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/src/%s.cl", record_dir, p->hash);
    struct stat st;
    if (stat(path, &st) == 0)
        return;
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(p->source, f);
        fclose(f);
    }
}

/* ---- platform and device ------------------------------------------------------------------ */

static cl_int copy_out(const void *src, size_t n, size_t size, void *value, size_t *ret)
{
    if (ret)
        *ret = n;
    if (value) {
        if (size < n)
            return CL_INVALID_VALUE;
        memcpy(value, src, n);
    }
    return CL_SUCCESS;
}
#define OUT(v) copy_out(&(v), sizeof(v), size, value, ret)
#define OUT_STR(s) copy_out((s), strlen(s) + 1, size, value, ret)

static cl_int CL_API_CALL get_platform_info(cl_platform_id platform, cl_platform_info what, size_t size, void *value,
                                            size_t *ret)
{
    if (platform != &the_platform)
        return CL_INVALID_PLATFORM;
    switch (what) {
    case CL_PLATFORM_PROFILE: return OUT_STR("FULL_PROFILE");
    case CL_PLATFORM_VERSION: return OUT_STR(prof.platform_version);
    case CL_PLATFORM_NAME: return OUT_STR(prof.platform_name);
    case CL_PLATFORM_VENDOR: return OUT_STR(prof.platform_vendor);
    case CL_PLATFORM_EXTENSIONS: return OUT_STR("cl_khr_icd");
    case CL_PLATFORM_ICD_SUFFIX_KHR: return OUT_STR("PROFILE");
    case CL_PLATFORM_HOST_TIMER_RESOLUTION: {
        cl_ulong r = 0;
        return OUT(r);
    }
    default: return CL_INVALID_VALUE;
    }
}

static cl_int CL_API_CALL get_device_ids(cl_platform_id platform, cl_device_type type, cl_uint n, cl_device_id *devices,
                                         cl_uint *count)
{
    if (platform != &the_platform)
        return CL_INVALID_PLATFORM;
    const int match = type == CL_DEVICE_TYPE_ALL || type == CL_DEVICE_TYPE_DEFAULT || (type & prof.type);
    if (count)
        *count = match ? 1 : 0;
    if (!match)
        return CL_DEVICE_NOT_FOUND;
    if (devices && n > 0)
        devices[0] = &the_device;
    return CL_SUCCESS;
}

static cl_int CL_API_CALL get_device_info(cl_device_id device, cl_device_info what, size_t size, void *value,
                                          size_t *ret)
{
    if (device != &the_device)
        return CL_INVALID_DEVICE;
    cl_uint u = 0;
    cl_ulong ul = 0;
    size_t z = 0;
    cl_bool b = CL_FALSE;
    switch (what) {
    case CL_DEVICE_TYPE: return OUT(prof.type);
    case CL_DEVICE_VENDOR_ID: return OUT(prof.vendor_id);
    case CL_DEVICE_MAX_COMPUTE_UNITS: return OUT(prof.compute_units);
    case CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS: u = 3; return OUT(u);
    case CL_DEVICE_MAX_WORK_GROUP_SIZE: return OUT(prof.max_wg);
    case CL_DEVICE_MAX_WORK_ITEM_SIZES: return copy_out(prof.items, sizeof(prof.items), size, value, ret);
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_CHAR: u = 4; return OUT(u);
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_SHORT: u = 2; return OUT(u);
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_INT:
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_LONG:
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_CHAR:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_SHORT:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_INT:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_LONG:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT: u = 1; return OUT(u);
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_DOUBLE:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_DOUBLE: u = prof.fp64 ? 1 : 0; return OUT(u);
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_HALF:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_HALF: u = prof.fp16 ? 1 : 0; return OUT(u);
    case CL_DEVICE_MAX_CLOCK_FREQUENCY: return OUT(prof.clock_mhz);
    case CL_DEVICE_ADDRESS_BITS: return OUT(prof.address_bits);
    case CL_DEVICE_MAX_MEM_ALLOC_SIZE: return OUT(prof.max_alloc);
    case CL_DEVICE_IMAGE_SUPPORT: return OUT(b);
    case CL_DEVICE_MAX_PARAMETER_SIZE: z = 1024; return OUT(z);
    case CL_DEVICE_MEM_BASE_ADDR_ALIGN: return OUT(prof.base_align_bits);
    case CL_DEVICE_MIN_DATA_TYPE_ALIGN_SIZE: u = 128; return OUT(u);
    case CL_DEVICE_SINGLE_FP_CONFIG: return OUT(prof.fp32);
    case CL_DEVICE_DOUBLE_FP_CONFIG: return OUT(prof.fp64);
    case CL_DEVICE_HALF_FP_CONFIG: return OUT(prof.fp16);
    case CL_DEVICE_GLOBAL_MEM_CACHE_TYPE: {
        cl_device_mem_cache_type t = CL_READ_WRITE_CACHE;
        return OUT(t);
    }
    case CL_DEVICE_GLOBAL_MEM_CACHELINE_SIZE: u = 128; return OUT(u);
    case CL_DEVICE_GLOBAL_MEM_CACHE_SIZE: ul = 4 << 20; return OUT(ul);
    case CL_DEVICE_GLOBAL_MEM_SIZE: return OUT(prof.global_mem);
    case CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE: ul = 65536; return OUT(ul);
    case CL_DEVICE_MAX_CONSTANT_ARGS: u = 8; return OUT(u);
    case CL_DEVICE_LOCAL_MEM_TYPE: {
        cl_device_local_mem_type t = CL_LOCAL;
        return OUT(t);
    }
    case CL_DEVICE_LOCAL_MEM_SIZE: return OUT(prof.local_mem);
    case CL_DEVICE_ERROR_CORRECTION_SUPPORT: return OUT(b);
    case CL_DEVICE_HOST_UNIFIED_MEMORY: return OUT(prof.unified);
    case CL_DEVICE_PROFILING_TIMER_RESOLUTION: z = 1; return OUT(z);
    case CL_DEVICE_ENDIAN_LITTLE:
    case CL_DEVICE_AVAILABLE:
    case CL_DEVICE_COMPILER_AVAILABLE:
    case CL_DEVICE_LINKER_AVAILABLE: b = CL_TRUE; return OUT(b);
    case CL_DEVICE_EXECUTION_CAPABILITIES: {
        cl_device_exec_capabilities c = CL_EXEC_KERNEL;
        return OUT(c);
    }
    case CL_DEVICE_QUEUE_PROPERTIES: {
        cl_command_queue_properties q = CL_QUEUE_PROFILING_ENABLE | CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE;
        return OUT(q);
    }
    case CL_DEVICE_NAME: return OUT_STR(prof.name);
    case CL_DEVICE_VENDOR: return OUT_STR(prof.vendor);
    case CL_DRIVER_VERSION: return OUT_STR(prof.driver_version);
    case CL_DEVICE_PROFILE: return OUT_STR("FULL_PROFILE");
    case CL_DEVICE_VERSION: return OUT_STR(prof.version);
    case CL_DEVICE_OPENCL_C_VERSION: return OUT_STR(prof.c_version);
    case CL_DEVICE_EXTENSIONS: return OUT_STR(prof.extensions);
    case CL_DEVICE_BUILT_IN_KERNELS: return OUT_STR("");
    case CL_DEVICE_PLATFORM: {
        cl_platform_id p = &the_platform;
        return OUT(p);
    }
    case CL_DEVICE_PARENT_DEVICE: {
        cl_device_id d = NULL;
        return OUT(d);
    }
    case CL_DEVICE_PARTITION_MAX_SUB_DEVICES: return OUT(u);
    case CL_DEVICE_REFERENCE_COUNT: u = 1; return OUT(u);
    case CL_DEVICE_PRINTF_BUFFER_SIZE: z = 1 << 20; return OUT(z);
    case CL_DEVICE_PREFERRED_INTEROP_USER_SYNC: b = CL_TRUE; return OUT(b);
    case CL_DEVICE_PREFERRED_WORK_GROUP_SIZE_MULTIPLE: return OUT(prof.wg_multiple);
    case CL_DEVICE_MAX_NUM_SUB_GROUPS: u = (cl_uint)(prof.max_wg / prof.subgroups[0]); return OUT(u);
    case CL_DEVICE_SUB_GROUP_SIZES_INTEL:
        if (strcmp(prof.vendor, "Intel(R) Corporation") != 0)
            return CL_INVALID_VALUE;
        return copy_out(prof.subgroups, sizeof(size_t) * (size_t)prof.nsubgroups, size, value, ret);
    case CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV:
        if (!prof.nv)
            return CL_INVALID_VALUE;
        return OUT(prof.cc_major);
    case CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV:
        if (!prof.nv)
            return CL_INVALID_VALUE;
        return OUT(prof.cc_minor);
    case CL_DEVICE_REGISTERS_PER_BLOCK_NV:
        if (!prof.nv)
            return CL_INVALID_VALUE;
        return OUT(prof.nv_registers);
    case CL_DEVICE_WARP_SIZE_NV:
        if (!prof.nv)
            return CL_INVALID_VALUE;
        u = (cl_uint)prof.subgroups[0];
        return OUT(u);
    case CL_DEVICE_BOARD_NAME_AMD:
        if (!prof.board_name[0])
            return CL_INVALID_VALUE;
        return OUT_STR(prof.board_name);
    case CL_DEVICE_WAVEFRONT_WIDTH_AMD:
        if (!prof.board_name[0])
            return CL_INVALID_VALUE;
        u = (cl_uint)prof.subgroups[0];
        return OUT(u);
    default: return CL_INVALID_VALUE; /* as a driver answers a query it does not know */
    }
}

/* ---- contexts, queues, buffers ------------------------------------------------------------ */

static void *new_object(size_t size)
{
    void *o = calloc(1, size);
    if (o)
        *(cl_icd_dispatch **)o = &dispatch;
    return o;
}

static cl_context CL_API_CALL create_context(const cl_context_properties *props, cl_uint n, const cl_device_id *devices,
                                             void(CL_CALLBACK *notify)(const char *, const void *, size_t, void *),
                                             void *user, cl_int *err)
{
    (void)props, (void)notify, (void)user;
    cl_int e = CL_SUCCESS;
    if (n != 1 || !devices || devices[0] != &the_device)
        e = CL_INVALID_DEVICE;
    cl_context c = e == CL_SUCCESS ? new_object(sizeof(*c)) : NULL;
    if (e == CL_SUCCESS && !c)
        e = CL_OUT_OF_HOST_MEMORY;
    if (c)
        c->refs = 1;
    if (err)
        *err = e;
    return c;
}

static cl_context CL_API_CALL create_context_from_type(const cl_context_properties *props, cl_device_type type,
                                                       void(CL_CALLBACK *notify)(const char *, const void *, size_t,
                                                                                 void *),
                                                       void *user, cl_int *err)
{
    (void)type;
    cl_device_id d = &the_device;
    return create_context(props, 1, &d, notify, user, err);
}

static cl_int CL_API_CALL retain_context(cl_context c)
{
    c->refs++;
    return CL_SUCCESS;
}
static cl_int CL_API_CALL release_context(cl_context c)
{
    if (--c->refs == 0)
        free(c);
    return CL_SUCCESS;
}

static cl_int CL_API_CALL get_context_info(cl_context c, cl_context_info what, size_t size, void *value, size_t *ret)
{
    cl_uint one = 1;
    cl_device_id d = &the_device;
    switch (what) {
    case CL_CONTEXT_REFERENCE_COUNT: return OUT(c->refs);
    case CL_CONTEXT_NUM_DEVICES: return OUT(one);
    case CL_CONTEXT_DEVICES: return OUT(d);
    case CL_CONTEXT_PROPERTIES: return copy_out(NULL, 0, size, value, ret);
    default: return CL_INVALID_VALUE;
    }
}

static cl_command_queue CL_API_CALL create_queue(cl_context c, cl_device_id d, cl_command_queue_properties props,
                                                 cl_int *err)
{
    cl_command_queue q = d == &the_device ? new_object(sizeof(*q)) : NULL;
    if (q) {
        q->refs = 1;
        q->context = c;
        q->props = props;
    }
    if (err)
        *err = q ? CL_SUCCESS : CL_INVALID_DEVICE;
    return q;
}

static cl_command_queue CL_API_CALL create_queue_with_properties(cl_context c, cl_device_id d,
                                                                 const cl_queue_properties *props, cl_int *err)
{
    cl_command_queue_properties p = 0;
    for (const cl_queue_properties *q = props; q && q[0]; q += 2)
        if (q[0] == CL_QUEUE_PROPERTIES)
            p = (cl_command_queue_properties)q[1];
    return create_queue(c, d, p, err);
}

static cl_int CL_API_CALL retain_queue(cl_command_queue q)
{
    q->refs++;
    return CL_SUCCESS;
}
static cl_int CL_API_CALL release_queue(cl_command_queue q)
{
    if (--q->refs == 0)
        free(q);
    return CL_SUCCESS;
}

static cl_int CL_API_CALL get_queue_info(cl_command_queue q, cl_command_queue_info what, size_t size, void *value,
                                         size_t *ret)
{
    cl_device_id d = &the_device;
    switch (what) {
    case CL_QUEUE_CONTEXT: return OUT(q->context);
    case CL_QUEUE_DEVICE: return OUT(d);
    case CL_QUEUE_REFERENCE_COUNT: return OUT(q->refs);
    case CL_QUEUE_PROPERTIES: return OUT(q->props);
    default: return CL_INVALID_VALUE;
    }
}

static cl_mem CL_API_CALL create_buffer(cl_context c, cl_mem_flags flags, size_t bytes, void *host, cl_int *err)
{
    cl_int e = CL_SUCCESS;
    if (bytes == 0 || bytes > prof.max_alloc)
        e = CL_INVALID_BUFFER_SIZE;
    cl_mem m = e == CL_SUCCESS ? new_object(sizeof(*m)) : NULL;
    if (e == CL_SUCCESS && !m)
        e = CL_OUT_OF_HOST_MEMORY;
    if (m) {
        m->refs = 1;
        m->context = c;
        m->flags = flags ? flags : CL_MEM_READ_WRITE;
        m->size = bytes;
        m->host = (flags & CL_MEM_USE_HOST_PTR) ? host : NULL;
    }
    if (err)
        *err = e;
    return m;
}

static cl_mem CL_API_CALL create_sub_buffer(cl_mem parent, cl_mem_flags flags, cl_buffer_create_type type,
                                            const void *info, cl_int *err)
{
    const cl_buffer_region *r = info;
    cl_int e = CL_SUCCESS;
    if (type != CL_BUFFER_CREATE_TYPE_REGION || !r || r->size == 0 || r->origin + r->size > parent->size)
        e = CL_INVALID_VALUE;
    else if (r->origin % (prof.base_align_bits / 8))
        e = CL_MISALIGNED_SUB_BUFFER_OFFSET;
    cl_mem m = e == CL_SUCCESS ? new_object(sizeof(*m)) : NULL;
    if (m) {
        m->refs = 1;
        m->context = parent->context;
        m->flags = flags ? flags : parent->flags;
        m->size = r->size;
        m->origin = r->origin;
        m->parent = parent;
        parent->refs++;
    }
    if (err)
        *err = m ? CL_SUCCESS : e ? e : CL_OUT_OF_HOST_MEMORY;
    return m;
}

static cl_int CL_API_CALL retain_mem(cl_mem m)
{
    m->refs++;
    return CL_SUCCESS;
}
static cl_int CL_API_CALL release_mem(cl_mem m)
{
    if (--m->refs == 0) {
        if (m->parent)
            release_mem(m->parent);
        free(m);
    }
    return CL_SUCCESS;
}

static cl_int CL_API_CALL get_mem_info(cl_mem m, cl_mem_info what, size_t size, void *value, size_t *ret)
{
    cl_mem_object_type t = CL_MEM_OBJECT_BUFFER;
    switch (what) {
    case CL_MEM_TYPE: return OUT(t);
    case CL_MEM_FLAGS: return OUT(m->flags);
    case CL_MEM_SIZE: return OUT(m->size);
    case CL_MEM_HOST_PTR: return OUT(m->host);
    case CL_MEM_MAP_COUNT: {
        cl_uint z = 0;
        return OUT(z);
    }
    case CL_MEM_REFERENCE_COUNT: return OUT(m->refs);
    case CL_MEM_CONTEXT: return OUT(m->context);
    case CL_MEM_ASSOCIATED_MEMOBJECT: return OUT(m->parent);
    case CL_MEM_OFFSET: return OUT(m->origin);
    default: return CL_INVALID_VALUE;
    }
}

/* ---- events and commands ------------------------------------------------------------------ */

static cl_int done_event(cl_command_queue q, cl_event *event)
{
    if (!event)
        return CL_SUCCESS;
    cl_event e = new_object(sizeof(*e));
    if (!e)
        return CL_OUT_OF_HOST_MEMORY;
    e->refs = 1;
    e->queue = q;
    *event = e;
    return CL_SUCCESS;
}

static cl_int CL_API_CALL wait_events(cl_uint n, const cl_event *events)
{
    return n && events ? CL_SUCCESS : CL_INVALID_VALUE;
}

static cl_int CL_API_CALL get_event_info(cl_event e, cl_event_info what, size_t size, void *value, size_t *ret)
{
    cl_int status = CL_COMPLETE;
    cl_command_type t = CL_COMMAND_NDRANGE_KERNEL;
    switch (what) {
    case CL_EVENT_COMMAND_QUEUE: return OUT(e->queue);
    case CL_EVENT_CONTEXT: return OUT(e->queue->context);
    case CL_EVENT_COMMAND_TYPE: return OUT(t);
    case CL_EVENT_COMMAND_EXECUTION_STATUS: return OUT(status);
    case CL_EVENT_REFERENCE_COUNT: return OUT(e->refs);
    default: return CL_INVALID_VALUE;
    }
}

static cl_int CL_API_CALL retain_event(cl_event e)
{
    e->refs++;
    return CL_SUCCESS;
}
static cl_int CL_API_CALL release_event(cl_event e)
{
    if (--e->refs == 0)
        free(e);
    return CL_SUCCESS;
}

static cl_int CL_API_CALL get_profiling_info(cl_event e, cl_profiling_info what, size_t size, void *value, size_t *ret)
{
    (void)e;
    cl_ulong t = what == CL_PROFILING_COMMAND_END || what == CL_PROFILING_COMMAND_COMPLETE ? 1000 : 0;
    return OUT(t);
}

static cl_int CL_API_CALL flush_queue(cl_command_queue q)
{
    (void)q;
    return CL_SUCCESS;
}

static cl_int CL_API_CALL read_buffer(cl_command_queue q, cl_mem m, cl_bool blocking, size_t offset, size_t bytes,
                                      void *ptr, cl_uint nwait, const cl_event *wait, cl_event *event)
{
    (void)blocking, (void)nwait, (void)wait;
    if (offset + bytes > m->size || !ptr)
        return CL_INVALID_VALUE;
    memset(ptr, 0, bytes);
    return done_event(q, event);
}

static cl_int CL_API_CALL write_buffer(cl_command_queue q, cl_mem m, cl_bool blocking, size_t offset, size_t bytes,
                                       const void *ptr, cl_uint nwait, const cl_event *wait, cl_event *event)
{
    (void)blocking, (void)nwait, (void)wait;
    if (offset + bytes > m->size || !ptr)
        return CL_INVALID_VALUE;
    return done_event(q, event);
}

static cl_int CL_API_CALL copy_buffer(cl_command_queue q, cl_mem src, cl_mem dst, size_t so, size_t dso, size_t bytes,
                                      cl_uint nwait, const cl_event *wait, cl_event *event)
{
    (void)nwait, (void)wait;
    if (so + bytes > src->size || dso + bytes > dst->size)
        return CL_INVALID_VALUE;
    return done_event(q, event);
}

static cl_int CL_API_CALL fill_buffer(cl_command_queue q, cl_mem m, const void *pattern, size_t psize, size_t offset,
                                      size_t bytes, cl_uint nwait, const cl_event *wait, cl_event *event)
{
    (void)pattern, (void)nwait, (void)wait;
    if (offset + bytes > m->size || psize == 0 || bytes % psize || offset % psize)
        return CL_INVALID_VALUE;
    return done_event(q, event);
}

static void *CL_API_CALL map_buffer(cl_command_queue q, cl_mem m, cl_bool blocking, cl_map_flags flags, size_t offset,
                                    size_t bytes, cl_uint nwait, const cl_event *wait, cl_event *event, cl_int *err)
{
    (void)blocking, (void)flags, (void)nwait, (void)wait;
    void *p = offset + bytes <= m->size ? calloc(1, bytes ? bytes : 1) : NULL;
    cl_int e = p ? done_event(q, event) : CL_INVALID_VALUE;
    if (err)
        *err = e;
    return p;
}

static cl_int CL_API_CALL unmap_mem(cl_command_queue q, cl_mem m, void *ptr, cl_uint nwait, const cl_event *wait,
                                    cl_event *event)
{
    (void)m, (void)nwait, (void)wait;
    free(ptr);
    return done_event(q, event);
}

static cl_int CL_API_CALL marker(cl_command_queue q, cl_uint nwait, const cl_event *wait, cl_event *event)
{
    (void)nwait, (void)wait;
    return done_event(q, event);
}

/* ---- programs and kernels ----------------------------------------------------------------- */

static cl_program CL_API_CALL program_source(cl_context c, cl_uint n, const char **strings, const size_t *lengths,
                                             cl_int *err)
{
    size_t total = 0;
    for (cl_uint i = 0; i < n; i++)
        total += lengths && lengths[i] ? lengths[i] : strlen(strings[i]);
    cl_program p = new_object(sizeof(*p));
    char *src = p ? malloc(total + 1) : NULL;
    if (!src) {
        free(p);
        if (err)
            *err = CL_OUT_OF_HOST_MEMORY;
        return NULL;
    }
    size_t at = 0;
    for (cl_uint i = 0; i < n; i++) {
        const size_t len = lengths && lengths[i] ? lengths[i] : strlen(strings[i]);
        memcpy(src + at, strings[i], len);
        at += len;
    }
    src[total] = '\0';
    p->refs = 1;
    p->context = c;
    p->source = src;
    hash_source(src, p->hash);
    if (err)
        *err = CL_SUCCESS;
    return p;
}

/* A "binary" of this driver: its tag, then the program's source (CLBlast keeps binaries of what it
   builds and makes programs from them again). */
static const char binary_tag[] = "clmla-profile-binary\n";

static cl_program CL_API_CALL program_binary(cl_context c, cl_uint n, const cl_device_id *d, const size_t *lengths,
                                             const unsigned char **bins, cl_int *status, cl_int *err)
{
    (void)d;
    const size_t tag = sizeof(binary_tag) - 1;
    if (n != 1 || !lengths || !bins || lengths[0] < tag || memcmp(bins[0], binary_tag, tag) != 0) {
        for (cl_uint i = 0; status && i < n; i++)
            status[i] = CL_INVALID_BINARY;
        if (err)
            *err = CL_INVALID_BINARY; /* not one of this driver's */
        return NULL;
    }
    const char *src = (const char *)bins[0] + tag;
    const size_t len = lengths[0] - tag;
    cl_program p = program_source(c, 1, &src, &len, err);
    if (status)
        status[0] = p ? CL_SUCCESS : CL_INVALID_BINARY;
    return p;
}

static cl_int CL_API_CALL retain_program(cl_program p)
{
    p->refs++;
    return CL_SUCCESS;
}
static cl_int CL_API_CALL release_program(cl_program p)
{
    if (--p->refs == 0) { /* each kernel holds a reference of its own */
        free(p->source);
        free(p->options);
        free(p);
    }
    return CL_SUCCESS;
}

static cl_int CL_API_CALL build_program(cl_program p, cl_uint n, const cl_device_id *d, const char *options,
                                        void(CL_CALLBACK *notify)(cl_program, void *), void *user)
{
    (void)n, (void)d;
    free(p->options);
    p->options = strdup(options ? options : "");
    p->built = 1;
    pthread_mutex_lock(&record_lock);
    record_source(p);
    char *line = malloc(strlen(p->options) + 64);
    if (line) {
        sprintf(line, "build\t%s\t%s", p->hash, p->options);
        record_line(line);
        free(line);
    }
    pthread_mutex_unlock(&record_lock);
    if (notify)
        notify(p, user);
    return CL_SUCCESS;
}

static cl_int CL_API_CALL unload_compiler(void)
{
    return CL_SUCCESS;
}

static cl_int CL_API_CALL get_program_info(cl_program p, cl_program_info what, size_t size, void *value, size_t *ret)
{
    cl_uint one = 1;
    cl_device_id d = &the_device;
    switch (what) {
    case CL_PROGRAM_REFERENCE_COUNT: return OUT(p->refs);
    case CL_PROGRAM_CONTEXT: return OUT(p->context);
    case CL_PROGRAM_NUM_DEVICES: return OUT(one);
    case CL_PROGRAM_DEVICES: return OUT(d);
    case CL_PROGRAM_SOURCE: return OUT_STR(p->source);
    case CL_PROGRAM_BINARY_SIZES: {
        const size_t n = p->built ? sizeof(binary_tag) - 1 + strlen(p->source) : 0;
        return OUT(n);
    }
    case CL_PROGRAM_BINARIES: {
        unsigned char *out = NULL;
        if (!value || size < sizeof(out)) {
            if (ret)
                *ret = sizeof(out);
            return value ? CL_INVALID_VALUE : CL_SUCCESS;
        }
        memcpy(&out, value, sizeof(out));
        if (out && p->built) {
            memcpy(out, binary_tag, sizeof(binary_tag) - 1);
            memcpy(out + sizeof(binary_tag) - 1, p->source, strlen(p->source));
        }
        if (ret)
            *ret = sizeof(out);
        return CL_SUCCESS;
    }
    default: return CL_INVALID_VALUE;
    }
}

static cl_int CL_API_CALL get_build_info(cl_program p, cl_device_id d, cl_program_build_info what, size_t size,
                                         void *value, size_t *ret)
{
    (void)d;
    switch (what) {
    case CL_PROGRAM_BUILD_STATUS: {
        cl_build_status s = p->built ? CL_BUILD_SUCCESS : CL_BUILD_NONE;
        return OUT(s);
    }
    case CL_PROGRAM_BUILD_OPTIONS: return OUT_STR(p->options ? p->options : "");
    case CL_PROGRAM_BUILD_LOG: return OUT_STR("");
    case CL_PROGRAM_BINARY_TYPE: {
        cl_program_binary_type t = p->built ? CL_PROGRAM_BINARY_TYPE_EXECUTABLE : CL_PROGRAM_BINARY_TYPE_NONE;
        return OUT(t);
    }
    default: return CL_INVALID_VALUE;
    }
}

/* Whether the source defines a kernel of that name: "name(" after "kernel" on its line. */
static int defines_kernel(const char *src, const char *name)
{
    const size_t n = strlen(name);
    for (const char *at = strstr(src, name); at; at = strstr(at + 1, name)) {
        const char *after = at + n;
        while (*after == ' ')
            after++;
        if (*after != '(' || (at > src && (at[-1] == '_' || (at[-1] >= 'a' && at[-1] <= 'z') ||
                                           (at[-1] >= 'A' && at[-1] <= 'Z') || (at[-1] >= '0' && at[-1] <= '9'))))
            continue;
        const char *line = at;
        while (line > src && line[-1] != '\n')
            line--;
        for (const char *k = strstr(line, "kernel"); k && k < at; k = strstr(k + 1, "kernel"))
            return 1;
        /* "__kernel __attribute__((...))" on the line above, the name on the next */
        if (line > src) {
            const char *prev = line - 1;
            while (prev > src && prev[-1] != '\n')
                prev--;
            const char *k = strstr(prev, "kernel");
            if (k && k < line)
                return 1;
        }
    }
    return 0;
}

static cl_kernel CL_API_CALL create_kernel(cl_program p, const char *name, cl_int *err)
{
    cl_int e = CL_SUCCESS;
    if (!p->built)
        e = CL_INVALID_PROGRAM_EXECUTABLE;
    else if (!name || !defines_kernel(p->source, name))
        e = CL_INVALID_KERNEL_NAME;
    cl_kernel k = e == CL_SUCCESS ? new_object(sizeof(*k)) : NULL;
    if (k) {
        k->refs = 1;
        k->program = p;
        p->refs++;
        k->name = strdup(name);
        pthread_mutex_lock(&record_lock);
        char *line = malloc(strlen(p->options) + strlen(name) + 64);
        if (line) {
            sprintf(line, "kernel\t%s\t%s\t%s", p->hash, p->options, name);
            record_line(line);
            free(line);
        }
        pthread_mutex_unlock(&record_lock);
    }
    if (err)
        *err = k ? CL_SUCCESS : e ? e : CL_OUT_OF_HOST_MEMORY;
    return k;
}

static cl_int CL_API_CALL retain_kernel(cl_kernel k)
{
    k->refs++;
    return CL_SUCCESS;
}
static cl_int CL_API_CALL release_kernel(cl_kernel k)
{
    if (--k->refs == 0) {
        release_program(k->program);
        free(k->name);
        free(k);
    }
    return CL_SUCCESS;
}

static cl_int CL_API_CALL set_kernel_arg(cl_kernel k, cl_uint index, size_t size, const void *value)
{
    (void)k, (void)index, (void)size, (void)value;
    return CL_SUCCESS;
}

static cl_int CL_API_CALL get_kernel_info(cl_kernel k, cl_kernel_info what, size_t size, void *value, size_t *ret)
{
    cl_uint zero = 0;
    switch (what) {
    case CL_KERNEL_FUNCTION_NAME: return OUT_STR(k->name);
    case CL_KERNEL_NUM_ARGS: return OUT(zero);
    case CL_KERNEL_REFERENCE_COUNT: return OUT(k->refs);
    case CL_KERNEL_CONTEXT: return OUT(k->program->context);
    case CL_KERNEL_PROGRAM: return OUT(k->program);
    case CL_KERNEL_ATTRIBUTES: return OUT_STR("");
    default: return CL_INVALID_VALUE;
    }
}

static cl_int CL_API_CALL get_kernel_wg_info(cl_kernel k, cl_device_id d, cl_kernel_work_group_info what, size_t size,
                                             void *value, size_t *ret)
{
    (void)k, (void)d;
    size_t three[3] = {0, 0, 0};
    cl_ulong zero = 0;
    switch (what) {
    case CL_KERNEL_WORK_GROUP_SIZE: return OUT(prof.kernel_wg);
    case CL_KERNEL_COMPILE_WORK_GROUP_SIZE: return copy_out(three, sizeof(three), size, value, ret);
    case CL_KERNEL_LOCAL_MEM_SIZE:
    case CL_KERNEL_PRIVATE_MEM_SIZE: return OUT(zero);
    case CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE: return OUT(prof.wg_multiple);
    default: return CL_INVALID_VALUE;
    }
}

static cl_int CL_API_CALL enqueue_ndrange(cl_command_queue q, cl_kernel k, cl_uint dims, const size_t *offset,
                                          const size_t *global, const size_t *local, cl_uint nwait,
                                          const cl_event *wait, cl_event *event)
{
    (void)offset, (void)nwait, (void)wait;
    if (dims < 1 || dims > 3 || !global)
        return CL_INVALID_WORK_DIMENSION;
    size_t shape[3] = {1, 1, 1}, items = 1;
    for (cl_uint i = 0; i < dims; i++) {
        if (global[i] == 0)
            return CL_INVALID_GLOBAL_WORK_SIZE;
        if (local) {
            /* as an OpenCL 1.2 device checks a launch (clmla builds with no -cl-std=CL2.0, so no
               partial groups) */
            if (local[i] == 0 || local[i] > prof.items[i] || global[i] % local[i]) {
                fprintf(stderr,
                        "clmla profile driver: %s: launch of %s with global size %zu and local size %zu in "
                        "dimension %u refused (CL_INVALID_WORK_GROUP_SIZE)\n",
                        prof.name, k->name, global[i], local[i], i);
                return CL_INVALID_WORK_GROUP_SIZE;
            }
            shape[i] = local[i];
            items *= local[i];
        }
    }
    if (local && items > prof.kernel_wg) {
        fprintf(stderr, "clmla profile driver: %s: launch of %s with %zu items in a work-group refused (limit %zu)\n",
                prof.name, k->name, items, prof.kernel_wg);
        return CL_INVALID_WORK_GROUP_SIZE;
    }
    if (record_dir[0]) {
        /* one line per program, kernel and shape ("auto": the driver's choice) */
        const char *opts = k->program->options ? k->program->options : "";
        char shape_text[64];
        if (local)
            snprintf(shape_text, sizeof(shape_text), "%zux%zux%zu", shape[0], shape[1], shape[2]);
        else
            snprintf(shape_text, sizeof(shape_text), "auto");
        char *line = malloc(strlen(opts) + strlen(k->name) + 128);
        if (line) {
            sprintf(line, "launch\t%s\t%s\t%s\t%s", k->program->hash, opts, k->name, shape_text);
            pthread_mutex_lock(&record_lock);
            size_t i = 0;
            while (i < nlaunches && strcmp(launches[i], line) != 0)
                i++;
            char **grown = i == nlaunches ? realloc(launches, (nlaunches + 1) * sizeof(*launches)) : NULL;
            if (grown) {
                launches = grown;
                launches[nlaunches++] = line;
                record_line(line);
            } else {
                free(line);
            }
            pthread_mutex_unlock(&record_lock);
        }
    }
    return done_event(q, event);
}

/* ---- the loader's entry points ------------------------------------------------------------ */

/* Every entry the driver does not implement: a call to one is a use of OpenCL that this driver
   cannot stand in for, so it stops the process rather than answer wrongly. */
static void unsupported(void)
{
    fprintf(stderr, "clmla profile driver: an OpenCL function it does not implement was called\n");
    abort();
}

static void *CL_API_CALL extension_address(const char *name);
static void *CL_API_CALL extension_address_for_platform(cl_platform_id platform, const char *name);

static cl_int CL_API_CALL get_platform_ids(cl_uint n, cl_platform_id *platforms, cl_uint *count);

static int loaded; /* 1 profile read, -1 refused */

static void load_once(void)
{
    void (**slot)(void) = (void (**)(void))&dispatch;
    for (size_t i = 0; i < sizeof(dispatch) / sizeof(*slot); i++)
        slot[i] = unsupported;
    dispatch.clGetPlatformIDs = get_platform_ids;
    dispatch.clGetPlatformInfo = get_platform_info;
    dispatch.clGetDeviceIDs = get_device_ids;
    dispatch.clGetDeviceInfo = get_device_info;
    dispatch.clCreateContext = create_context;
    dispatch.clCreateContextFromType = create_context_from_type;
    dispatch.clRetainContext = retain_context;
    dispatch.clReleaseContext = release_context;
    dispatch.clGetContextInfo = get_context_info;
    dispatch.clCreateCommandQueue = create_queue;
    dispatch.clCreateCommandQueueWithProperties = create_queue_with_properties;
    dispatch.clRetainCommandQueue = retain_queue;
    dispatch.clReleaseCommandQueue = release_queue;
    dispatch.clGetCommandQueueInfo = get_queue_info;
    dispatch.clCreateBuffer = create_buffer;
    dispatch.clCreateSubBuffer = create_sub_buffer;
    dispatch.clRetainMemObject = retain_mem;
    dispatch.clReleaseMemObject = release_mem;
    dispatch.clGetMemObjectInfo = get_mem_info;
    dispatch.clCreateProgramWithSource = program_source;
    dispatch.clCreateProgramWithBinary = program_binary;
    dispatch.clRetainProgram = retain_program;
    dispatch.clReleaseProgram = release_program;
    dispatch.clBuildProgram = build_program;
    dispatch.clUnloadCompiler = unload_compiler;
    dispatch.clGetProgramInfo = get_program_info;
    dispatch.clGetProgramBuildInfo = get_build_info;
    dispatch.clCreateKernel = create_kernel;
    dispatch.clRetainKernel = retain_kernel;
    dispatch.clReleaseKernel = release_kernel;
    dispatch.clSetKernelArg = set_kernel_arg;
    dispatch.clGetKernelInfo = get_kernel_info;
    dispatch.clGetKernelWorkGroupInfo = get_kernel_wg_info;
    dispatch.clWaitForEvents = wait_events;
    dispatch.clGetEventInfo = get_event_info;
    dispatch.clRetainEvent = retain_event;
    dispatch.clReleaseEvent = release_event;
    dispatch.clGetEventProfilingInfo = get_profiling_info;
    dispatch.clFlush = flush_queue;
    dispatch.clFinish = flush_queue;
    dispatch.clEnqueueReadBuffer = read_buffer;
    dispatch.clEnqueueWriteBuffer = write_buffer;
    dispatch.clEnqueueCopyBuffer = copy_buffer;
    dispatch.clEnqueueFillBuffer = fill_buffer;
    dispatch.clEnqueueMapBuffer = map_buffer;
    dispatch.clEnqueueUnmapMemObject = unmap_mem;
    dispatch.clEnqueueNDRangeKernel = enqueue_ndrange;
    dispatch.clEnqueueMarkerWithWaitList = marker;
    dispatch.clEnqueueBarrierWithWaitList = marker;
    dispatch.clGetExtensionFunctionAddress = extension_address;
    dispatch.clGetExtensionFunctionAddressForPlatform = extension_address_for_platform;

    const char *path = getenv("CLMLA_PROFILE");
    char why[1024];
    if (!path || !*path) {
        fprintf(stderr, "clmla profile driver: CLMLA_PROFILE names no profile; no platform\n");
        loaded = -1;
        return;
    }
    if (profile_load(path, &prof, why, sizeof(why))) {
        fprintf(stderr, "clmla profile driver: profile %s refused: %s\n", path, why);
        loaded = -1;
        return;
    }
    const char *dir = getenv("CLMLA_PROFILE_RECORD");
    if (dir && *dir && strlen(dir) < sizeof(record_dir)) {
        snprintf(record_dir, sizeof(record_dir), "%s", dir);
        for (char *c = record_dir + 1; *c; c++) /* the folder and those above it */
            if (*c == '/') {
                *c = '\0';
                mkdir(record_dir, 0755);
                *c = '/';
            }
        mkdir(record_dir, 0755);
    }
    loaded = 1;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;

static cl_int CL_API_CALL get_platform_ids(cl_uint n, cl_platform_id *platforms, cl_uint *count)
{
    pthread_once(&once, load_once);
    if (loaded < 0) {
        if (count)
            *count = 0;
        return CL_PLATFORM_NOT_FOUND_KHR;
    }
    if (count)
        *count = 1;
    if (platforms && n > 0)
        platforms[0] = &the_platform;
    return CL_SUCCESS;
}

/* ocl-icd asks the library itself, by name, for the platform's extension suffix. */
EXPORT cl_int CL_API_CALL clGetPlatformInfo(cl_platform_id platform, cl_platform_info what, size_t size, void *value,
                                            size_t *ret)
{
    return get_platform_info(platform, what, size, value, ret);
}

EXPORT cl_int CL_API_CALL clIcdGetPlatformIDsKHR(cl_uint n, cl_platform_id *platforms, cl_uint *count)
{
    return get_platform_ids(n, platforms, count);
}

static void *CL_API_CALL extension_address(const char *name)
{
    if (name && strcmp(name, "clIcdGetPlatformIDsKHR") == 0)
        return (void *)clIcdGetPlatformIDsKHR;
    return NULL;
}

static void *CL_API_CALL extension_address_for_platform(cl_platform_id platform, const char *name)
{
    (void)platform;
    return extension_address(name);
}

EXPORT void *CL_API_CALL clGetExtensionFunctionAddress(const char *name)
{
    return extension_address(name);
}
