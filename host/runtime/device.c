/* Device enumeration and device specs ("1:0", "2", "gpu", "nvidia", ...). */
#include "internal.h"
#include "device_spec.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void query_str(cl_device_id dev, cl_device_info what, char *out, size_t size)
{
    out[0] = '\0';
    if (clGetDeviceInfo(dev, what, size, out, NULL) != CL_SUCCESS)
        out[0] = '\0';
    out[size - 1] = '\0';
}

static int has_extension(cl_device_id dev, const char *ext)
{
    size_t size = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, 0, NULL, &size) != CL_SUCCESS || size == 0)
        return 0;
    char *all = malloc(size + 1);
    if (!all)
        return 0;
    int found = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, size, all, NULL) == CL_SUCCESS) {
        all[size] = '\0';
        size_t n = strlen(ext);
        for (const char *p = strstr(all, ext); p; p = strstr(p + 1, ext))
            if ((p == all || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) {
                found = 1;
                break;
            }
    }
    free(all);
    return found;
}

void clmla_device_query(cl_platform_id platform, cl_device_id dev, clmla_device_info *info)
{
    memset(info, 0, sizeof(*info));
    info->index = info->platform_index = info->device_index = -1;
    info->platform_id = platform;
    info->device_id = dev;
    if (clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof(info->platform_name), info->platform_name, NULL) != CL_SUCCESS)
        info->platform_name[0] = '\0';
    info->platform_name[sizeof(info->platform_name) - 1] = '\0';
    query_str(dev, CL_DEVICE_VENDOR, info->vendor, sizeof(info->vendor));
    query_str(dev, CL_DEVICE_NAME, info->name, sizeof(info->name));
    query_str(dev, CL_DEVICE_VERSION, info->device_version, sizeof(info->device_version));
    query_str(dev, CL_DRIVER_VERSION, info->driver_version, sizeof(info->driver_version));

    cl_device_type type = 0;
    clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof(type), &type, NULL);
    info->kind = (type & CL_DEVICE_TYPE_GPU)           ? CLMLA_DEVICE_KIND_GPU
                 : (type & CL_DEVICE_TYPE_CPU)         ? CLMLA_DEVICE_KIND_CPU
                 : (type & CL_DEVICE_TYPE_ACCELERATOR) ? CLMLA_DEVICE_KIND_ACCELERATOR
                                                       : CLMLA_DEVICE_KIND_OTHER;
    cl_ulong u = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(u), &u, NULL) == CL_SUCCESS)
        info->global_mem_bytes = u;
    u = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof(u), &u, NULL) == CL_SUCCESS)
        info->max_alloc_bytes = u;
    u = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof(u), &u, NULL) == CL_SUCCESS)
        info->local_mem_bytes = u;
    cl_uint cu = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof(cu), &cu, NULL) == CL_SUCCESS)
        info->compute_units = cu;
    size_t wg = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof(wg), &wg, NULL) == CL_SUCCESS)
        info->max_work_group_size = wg;
    info->fp16 = has_extension(dev, "cl_khr_fp16");
    info->fp64 = has_extension(dev, "cl_khr_fp64");
}

int clmla_device_pocl_cpu(const clmla_device_info *info)
{
    return info->kind == CLMLA_DEVICE_KIND_CPU && strstr(info->platform_name, "Portable Computing Language") != NULL;
}

int clmla_device_row_products_trusted(const clmla_device_info *info)
{
    return strstr(info->platform_name, "rusticl") == NULL;
}

int clmla_device_prefetches(const clmla_device_info *info)
{
    return clmla_device_pocl_cpu(info);
}

clmla_status clmla_devices_list(clmla_device_info **devices, size_t *count)
{
    if (!devices || !count)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_devices_list: NULL output pointer");
    *devices = NULL;
    *count = 0;

    cl_uint nplat = 0;
    cl_int err = clGetPlatformIDs(0, NULL, &nplat);
    if (err == -1001 /* CL_PLATFORM_NOT_FOUND_KHR: the ICD loader found no driver */ || (err == CL_SUCCESS && nplat == 0))
        return clmla_fail(NULL, CLMLA_ERROR_NO_PLATFORM,
                          "no OpenCL platform is installed (no ICD in /etc/OpenCL/vendors or "
                          "OCL_ICD_VENDORS); install a driver, e.g. pocl-opencl-icd for the CPU");
    if (err != CL_SUCCESS)
        return clmla_fail_cl(NULL, err, "clGetPlatformIDs");

    cl_platform_id *plats = calloc(nplat, sizeof(*plats));
    if (!plats)
        return clmla_fail(NULL, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    err = clGetPlatformIDs(nplat, plats, NULL);
    if (err != CL_SUCCESS) {
        free(plats);
        return clmla_fail_cl(NULL, err, "clGetPlatformIDs");
    }

    clmla_device_info *list = NULL;
    size_t n = 0;
    clmla_status status = CLMLA_SUCCESS;
    for (cl_uint p = 0; p < nplat && status == CLMLA_SUCCESS; p++) {
        cl_uint ndev = 0;
        err = clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &ndev);
        if (err != CL_SUCCESS || ndev == 0)
            continue; /* a platform without devices (or a broken one) is skipped, not fatal */
        cl_device_id *ids = calloc(ndev, sizeof(*ids));
        clmla_device_info *grown = realloc(list, (n + ndev) * sizeof(*list));
        if (!ids || !grown) {
            free(ids);
            if (grown)
                list = grown;
            status = clmla_fail(NULL, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
            break;
        }
        list = grown;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, ndev, ids, NULL) == CL_SUCCESS) {
            for (cl_uint d = 0; d < ndev; d++) {
                clmla_device_query(plats[p], ids[d], &list[n]);
                list[n].index = (int)n;
                list[n].platform_index = (int)p;
                list[n].device_index = (int)d;
                n++;
            }
        }
        free(ids);
    }
    free(plats);
    if (status != CLMLA_SUCCESS) {
        free(list);
        return status;
    }
    if (n == 0) {
        free(list);
        return clmla_fail(NULL, CLMLA_ERROR_NO_DEVICE, "OpenCL platforms are installed but none exposes a device");
    }
    size_t def = clmla_spec_default_index(list, n);
    list[def].is_default = 1;
    *devices = list;
    *count = n;
    return CLMLA_SUCCESS;
}

void clmla_free(void *ptr)
{
    free(ptr);
}

const char *clmla_device_kind_name(clmla_device_kind k)
{
    switch (k) {
    case CLMLA_DEVICE_KIND_CPU: return "cpu";
    case CLMLA_DEVICE_KIND_GPU: return "gpu";
    case CLMLA_DEVICE_KIND_ACCELERATOR: return "accelerator";
    default: return "other";
    }
}

void clmla_describe_device_list(const clmla_device_info *devs, size_t n, char *buf, size_t size)
{
    size_t used = strlen(buf);
    for (size_t i = 0; i < n && used + 1 < size; i++) {
        int w = snprintf(buf + used, size - used, "\n  %zu  %d:%d  %-11s %s / %s (%s)", i,
                         devs[i].platform_index, devs[i].device_index, clmla_device_kind_name(devs[i].kind),
                         devs[i].vendor, devs[i].name, devs[i].platform_name);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

clmla_status clmla_device_resolve(const char *spec, size_t *index)
{
    if (!index)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_device_resolve: NULL index pointer");
    clmla_device_info *devs = NULL;
    size_t n = 0;
    clmla_status status = clmla_devices_list(&devs, &n);
    if (status != CLMLA_SUCCESS)
        return status;
    clmla_env env;
    clmla_env_read(&env);
    char why[CLMLA_ERRMSG_SIZE];
    status = clmla_spec_match(spec, env.device, devs, n, index, why, sizeof(why));
    if (status != CLMLA_SUCCESS)
        clmla_fail(NULL, status, "%s", why);
    free(devs);
    return status;
}
