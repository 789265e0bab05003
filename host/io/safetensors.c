/* safetensors: header checks, tensor lookup, copies in the stored dtype and float32 conversion,
   the shard index. */
#include "safetensors.h"
#include "dtype.h"
#include "fileio.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Integers in JSON arrive as doubles: anything at or above 2^53 may have been rounded. */
#define MAX_EXACT_INTEGER 9007199254740992.0

static uint64_t read_u64_le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ---- dtypes --------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    clmla_st_dtype dtype;
    int bits;
} dtypes[] = {
    {"F32", CLMLA_ST_F32, 32}, {"F16", CLMLA_ST_F16, 16}, {"BF16", CLMLA_ST_BF16, 16},
    {"F8_E4M3", CLMLA_ST_F8_E4M3, 8},
    /* The rest of the format's dtypes: their sizes are checked, their values never read. */
    {"F64", CLMLA_ST_OTHER_KNOWN, 64}, {"I64", CLMLA_ST_OTHER_KNOWN, 64}, {"U64", CLMLA_ST_OTHER_KNOWN, 64},
    {"C64", CLMLA_ST_OTHER_KNOWN, 64}, {"I32", CLMLA_ST_OTHER_KNOWN, 32}, {"U32", CLMLA_ST_OTHER_KNOWN, 32},
    {"I16", CLMLA_ST_OTHER_KNOWN, 16}, {"U16", CLMLA_ST_OTHER_KNOWN, 16}, {"I8", CLMLA_ST_OTHER_KNOWN, 8},
    {"U8", CLMLA_ST_OTHER_KNOWN, 8}, {"BOOL", CLMLA_ST_OTHER_KNOWN, 8}, {"F8_E5M2", CLMLA_ST_OTHER_KNOWN, 8},
    {"F8_E8M0", CLMLA_ST_OTHER_KNOWN, 8}, {"F6_E2M3", CLMLA_ST_OTHER_KNOWN, 6}, {"F6_E3M2", CLMLA_ST_OTHER_KNOWN, 6},
    {"F4", CLMLA_ST_OTHER_KNOWN, 4},
};

/* Bits per element, 0 for an unknown dtype. */
static int dtype_lookup(const char *name, clmla_st_dtype *dtype)
{
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
        if (strcmp(dtypes[i].name, name) == 0) {
            *dtype = dtypes[i].dtype;
            return dtypes[i].bits;
        }
    *dtype = CLMLA_ST_UNKNOWN;
    return 0;
}

/* Element i of a float tensor of a convertible dtype, read byte by byte (the data section gives no
   alignment; safetensors is little-endian whatever the host). The decoding itself is dtype.h's. */
static float element(const uint8_t *p, clmla_st_dtype dtype, uint64_t i)
{
    switch (dtype) {
    case CLMLA_ST_F32: {
        const uint8_t *q = p + 4 * i;
        const uint32_t bits = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
        float f;
        memcpy(&f, &bits, sizeof(f));
        return f;
    }
    case CLMLA_ST_F16:
        return clmla_f16_to_float((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    case CLMLA_ST_BF16:
        return clmla_bf16_to_float((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    case CLMLA_ST_F8_E4M3:
        return clmla_e4m3_to_float(p[i]);
    default:
        return 0.0f;
    }
}

uint64_t clmla_st_numel(const clmla_st_tensor *t)
{
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

void clmla_st_shape_text(int ndim, const int64_t *shape, char *buf, size_t size)
{
    size_t used = 0;
    if (size == 0)
        return;
    buf[0] = '\0';
    for (int d = 0; d <= ndim; d++) {
        int n;
        if (d == ndim)
            n = snprintf(buf + used, size - used, "]");
        else
            n = snprintf(buf + used, size - used, "%s%lld", d ? ", " : "[", (long long)shape[d]);
        if (n < 0 || (size_t)n >= size - used)
            return;
        used += (size_t)n;
    }
}

/* ---- the header ----------------------------------------------------------------------------- */

static int json_uint(const cJSON *item, uint64_t *value)
{
    if (!cJSON_IsNumber(item))
        return 0;
    const double d = item->valuedouble;
    if (!(d >= 0 && d < MAX_EXACT_INTEGER) || d != (double)(uint64_t)d)
        return 0;
    *value = (uint64_t)d;
    return 1;
}

static int compare_by_name(const void *a, const void *b)
{
    return strcmp(((const clmla_st_tensor *)a)->name, ((const clmla_st_tensor *)b)->name);
}

static int compare_by_offset(const void *a, const void *b)
{
    const clmla_st_tensor *x = *(const clmla_st_tensor *const *)a, *y = *(const clmla_st_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

static void free_tensors(clmla_st_tensor *tensors, size_t n)
{
    for (size_t i = 0; tensors && i < n; i++)
        free(tensors[i].name);
    free(tensors);
}

/* One header entry into t. */
static clmla_status parse_entry(const cJSON *entry, const char *fname, uint64_t data_size, clmla_st_tensor *t, char *err,
                                size_t errsize)
{
    const char *tname = t->name;
    if (!cJSON_IsObject(entry))
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "header entry '%s' is not an object", tname);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!cJSON_IsString(dtype) || !dtype->valuestring)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "tensor '%s' has no \"dtype\" string", tname);
    if (!cJSON_IsArray(shape))
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "tensor '%s' has no \"shape\" array", tname);
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname,
                    "tensor '%s' has no \"data_offsets\" array of two integers", tname);

    snprintf(t->dtype_name, sizeof(t->dtype_name), "%s", dtype->valuestring);
    const int bits = dtype_lookup(dtype->valuestring, &t->dtype);
    if (strlen(dtype->valuestring) >= sizeof(t->dtype_name))
        t->dtype = CLMLA_ST_UNKNOWN;

    const int ndim = cJSON_GetArraySize(shape);
    if (ndim > CLMLA_ST_MAX_DIMS)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "tensor '%s' has %d dimensions, at most %d are supported",
                    tname, ndim, CLMLA_ST_MAX_DIMS);
    t->ndim = ndim;
    uint64_t numel = 1;
    int d = 0;
    for (const cJSON *dim = shape->child; dim; dim = dim->next, d++) {
        uint64_t v = 0;
        if (!json_uint(dim, &v) || v > (uint64_t)INT64_MAX)
            return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname,
                        "tensor '%s': shape dimension %d is not a non-negative integer", tname, d);
        t->shape[d] = (int64_t)v;
        /* numel * 64 bits must stay representable. */
        if (v != 0 && numel > (UINT64_MAX / 64) / v)
            return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "tensor '%s': the shape's element count overflows",
                        tname);
        numel *= v;
    }

    if (!json_uint(offsets->child, &t->begin) || !json_uint(offsets->child->next, &t->end))
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname,
                    "tensor '%s': data_offsets are not two non-negative integers", tname);
    if (t->begin > t->end)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "tensor '%s': data_offsets [%llu, %llu] end before they begin",
                    tname, (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > data_size)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname,
                    "tensor '%s': data_offsets [%llu, %llu] are out of bounds (the data section has %llu bytes)", tname,
                    (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)data_size);
    if (bits) {
        const uint64_t total_bits = numel * (uint64_t)bits;
        char shape_text[256];
        clmla_st_shape_text(t->ndim, t->shape, shape_text, sizeof(shape_text));
        if (total_bits % 8 != 0 || t->end - t->begin != total_bits / 8)
            return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname,
                        "tensor '%s': data_offsets [%llu, %llu] hold %llu bytes, but %s x %s needs %llu%s", tname,
                        (unsigned long long)t->begin, (unsigned long long)t->end,
                        (unsigned long long)(t->end - t->begin), t->dtype_name, shape_text,
                        (unsigned long long)(total_bits / 8), total_bits % 8 ? " and a fraction" : "");
    }
    return CLMLA_SUCCESS;
}

/* Sorted by offset, the ranges must tile [0, data_size) exactly. */
static clmla_status check_layout(clmla_st_tensor *tensors, size_t n, const char *fname, uint64_t data_size, char *err,
                                 size_t errsize)
{
    clmla_st_tensor **order = malloc((n ? n : 1) * sizeof(*order));
    if (!order)
        return clmla_file_error(err, errsize, CLMLA_ERROR_OUT_OF_HOST_MEMORY, fname, "out of host memory");
    for (size_t i = 0; i < n; i++)
        order[i] = &tensors[i];
    qsort(order, n, sizeof(*order), compare_by_offset);
    clmla_status st = CLMLA_SUCCESS;
    uint64_t expected = 0;
    for (size_t i = 0; i < n && st == CLMLA_SUCCESS; i++) {
        const clmla_st_tensor *t = order[i];
        if (t->begin < expected)
            st = clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname,
                      "tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", order[i - 1]->name,
                      (unsigned long long)order[i - 1]->begin, (unsigned long long)order[i - 1]->end, t->name,
                      (unsigned long long)t->begin, (unsigned long long)t->end);
        else if (t->begin > expected)
            st = clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname,
                      "data_offsets leave a gap of %llu bytes before tensor '%s' (the data must be contiguous)",
                      (unsigned long long)(t->begin - expected), t->name);
        expected = t->end;
    }
    if (st == CLMLA_SUCCESS && expected != data_size)
        st = clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname,
                  "the tensors cover %llu bytes of data but the data section has %llu bytes", (unsigned long long)expected,
                  (unsigned long long)data_size);
    free(order);
    return st;
}

static int only_white_space(const char *p, const char *end)
{
    for (; p < end; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            return 0;
    return 1;
}

/* The start of a parse of `size` bytes at `input` into `out` (out_size bytes, zeroed): refuses a
   NULL out, then a NULL input of some size (named `input_name`), as from fname. */
static clmla_status parse_start(const void *input, size_t size, const char *input_name, void *out, size_t out_size,
                                const char *fname, char *err, size_t errsize)
{
    if (!out)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_ARGUMENT, fname, "NULL output");
    memset(out, 0, out_size);
    if (!input && size)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_ARGUMENT, fname, "%s", input_name);
    return CLMLA_SUCCESS;
}

clmla_status clmla_st_parse(const uint8_t *data, size_t size, const char *name, clmla_st_file *out, char *err,
                            size_t errsize)
{
    const char *fname = name ? name : "(buffer)";
    const clmla_status bad = parse_start(data, size, "NULL data", out, sizeof(*out), fname, err, errsize);
    if (bad != CLMLA_SUCCESS)
        return bad;
    if (size < 8)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname,
                    "the file is %zu bytes long, too short for a safetensors header length (8 bytes)", size);
    const uint64_t header_size = read_u64_le(data);
    if (header_size > (uint64_t)size - 8)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname,
                    "header length %llu is past the end of the file (%zu bytes, %zu after the length)",
                    (unsigned long long)header_size, size, size - 8);
    if (header_size > CLMLA_ST_MAX_HEADER)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "header length %llu exceeds the limit of %llu bytes",
                    (unsigned long long)header_size, (unsigned long long)CLMLA_ST_MAX_HEADER);
    const char *text = (const char *)data + 8;
    const char *parse_end = NULL;
    cJSON *root = header_size ? cJSON_ParseWithLengthOpts(text, (size_t)header_size, &parse_end, 0) : NULL;
    if (!root) {
        const size_t at = parse_end && parse_end >= text ? (size_t)(parse_end - text) : 0;
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname,
                    "the header (%llu bytes) is not valid JSON (parsing stopped at byte %zu)", (unsigned long long)header_size,
                    at);
    }
    if (!parse_end || !only_white_space(parse_end, text + header_size)) {
        cJSON_Delete(root);
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "the header has data after its JSON object");
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "the header is JSON but not an object");
    }

    const uint64_t data_size = (uint64_t)size - 8 - header_size;
    size_t count = 0;
    for (const cJSON *e = root->child; e; e = e->next)
        if (!e->string || strcmp(e->string, "__metadata__") != 0)
            count++;
    clmla_st_tensor *tensors = calloc(count ? count : 1, sizeof(*tensors));
    if (!tensors) {
        cJSON_Delete(root);
        return clmla_file_error(err, errsize, CLMLA_ERROR_OUT_OF_HOST_MEMORY, fname, "out of host memory");
    }
    clmla_status st = CLMLA_SUCCESS;
    size_t n = 0;
    for (const cJSON *e = root->child; e && st == CLMLA_SUCCESS; e = e->next) {
        if (e->string && strcmp(e->string, "__metadata__") == 0)
            continue;
        clmla_st_tensor *t = &tensors[n++];
        t->name = strdup(e->string ? e->string : "");
        if (!t->name)
            st = clmla_file_error(err, errsize, CLMLA_ERROR_OUT_OF_HOST_MEMORY, fname, "out of host memory");
        else
            st = parse_entry(e, fname, data_size, t, err, errsize);
    }
    cJSON_Delete(root);
    if (st == CLMLA_SUCCESS) {
        qsort(tensors, n, sizeof(*tensors), compare_by_name);
        for (size_t i = 1; i < n && st == CLMLA_SUCCESS; i++)
            if (strcmp(tensors[i - 1].name, tensors[i].name) == 0)
                st = clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "tensor '%s' appears twice in the header",
                          tensors[i].name);
    }
    if (st == CLMLA_SUCCESS)
        st = check_layout(tensors, n, fname, data_size, err, errsize);
    if (st == CLMLA_SUCCESS) {
        out->name = strdup(fname);
        if (!out->name)
            st = clmla_file_error(err, errsize, CLMLA_ERROR_OUT_OF_HOST_MEMORY, fname, "out of host memory");
    }
    if (st != CLMLA_SUCCESS) {
        free_tensors(tensors, n);
        memset(out, 0, sizeof(*out));
        return st;
    }
    out->data = data + 8 + header_size;
    out->data_size = data_size;
    out->tensors = tensors;
    out->num_tensors = n;
    return CLMLA_SUCCESS;
}

clmla_status clmla_st_open(const char *path, clmla_st_file *out, char *err, size_t errsize)
{
    if (!out)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_ARGUMENT, path, "NULL output");
    memset(out, 0, sizeof(*out));
    if (!path)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_ARGUMENT, "(null)", "NULL path");
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return clmla_file_error(err, errsize, CLMLA_ERROR_IO, path, "cannot open: %s", strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        const int e = errno;
        close(fd);
        return clmla_file_error(err, errsize, CLMLA_ERROR_IO, path, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return clmla_file_error(err, errsize, CLMLA_ERROR_IO, path, "not a regular file");
    }
    const size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            const int e = errno;
            close(fd);
            return clmla_file_error(err, errsize, CLMLA_ERROR_IO, path, "cannot map %zu bytes: %s", size, strerror(e));
        }
    }
    close(fd);
    clmla_status st = clmla_st_parse(map, size, path, out, err, errsize);
    if (st != CLMLA_SUCCESS) {
        if (map)
            munmap(map, size);
        return st;
    }
    out->map = map;
    out->map_size = size;
    return CLMLA_SUCCESS;
}

void clmla_st_close(clmla_st_file *f)
{
    if (!f)
        return;
    free_tensors(f->tensors, f->num_tensors);
    free(f->name);
    if (f->map)
        munmap(f->map, f->map_size);
    memset(f, 0, sizeof(*f));
}

const clmla_st_tensor *clmla_st_find(const clmla_st_file *f, const char *name)
{
    if (!f || !name || !f->num_tensors)
        return NULL;
    clmla_st_tensor key;
    memset(&key, 0, sizeof(key));
    key.name = (char *)name;
    return bsearch(&key, f->tensors, f->num_tensors, sizeof(key), compare_by_name);
}

clmla_status clmla_st_stored_dtype(const clmla_st_file *f, const clmla_st_tensor *t, clmla_dtype *dtype, char *err,
                                   size_t errsize)
{
    if (!f || !t || !dtype)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_ARGUMENT, f ? f->name : NULL, "NULL argument");
    switch (t->dtype) {
    case CLMLA_ST_F32:
        *dtype = CLMLA_DTYPE_F32;
        return CLMLA_SUCCESS;
    case CLMLA_ST_F16:
        *dtype = CLMLA_DTYPE_F16;
        return CLMLA_SUCCESS;
    case CLMLA_ST_BF16:
        *dtype = CLMLA_DTYPE_BF16;
        return CLMLA_SUCCESS;
    case CLMLA_ST_F8_E4M3:
        *dtype = CLMLA_DTYPE_FP8_E4M3;
        return CLMLA_SUCCESS;
    default:
        return clmla_file_error(err, errsize, CLMLA_ERROR_UNSUPPORTED, f->name,
                                "tensor '%s' has dtype %s; clmla reads F32, F16, BF16 and F8_E4M3 (with _scale_inv "
                                "block scales)", t->name, t->dtype_name);
    }
}

/* The checks an F8_E4M3 tensor's block scales must pass before anything reads them: t 2-D,
   scale_inv present, [ceil(rows/128), ceil(cols/128)], of a float dtype. *cols_blocks gets the
   second extent. */
static clmla_status check_scales(const clmla_st_file *f, const clmla_st_tensor *t, const clmla_st_file *scale_file,
                                 const clmla_st_tensor *scale_inv, int64_t *cols_blocks, char *err, size_t errsize)
{
    if (t->ndim != 2)
        return clmla_file_error(err, errsize, CLMLA_ERROR_UNSUPPORTED, f->name,
                    "tensor '%s' is F8_E4M3 with %d dimensions; clmla reads F8_E4M3 as 2-D weights with 128x128 block "
                    "scales only", t->name, t->ndim);
    if (!scale_inv || !scale_file)
        return clmla_file_error(err, errsize, CLMLA_ERROR_MISSING_TENSOR, f->name,
                    "tensor '%s' is F8_E4M3 but its block scales '%s_scale_inv' are missing", t->name, t->name);
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const int64_t want[2] = {(rows + 127) / 128, (cols + 127) / 128};
    if (scale_inv->ndim != 2 || scale_inv->shape[0] != want[0] || scale_inv->shape[1] != want[1]) {
        char got_text[256], want_text[64];
        clmla_st_shape_text(scale_inv->ndim, scale_inv->shape, got_text, sizeof(got_text));
        clmla_st_shape_text(2, want, want_text, sizeof(want_text));
        return clmla_file_error(err, errsize, CLMLA_ERROR_SHAPE_MISMATCH, scale_file->name,
                    "block scales '%s' have shape %s; 128x128 blocks of '%s' [%lld, %lld] need %s", scale_inv->name,
                    got_text, t->name, (long long)rows, (long long)cols, want_text);
    }
    if (scale_inv->dtype != CLMLA_ST_F32 && scale_inv->dtype != CLMLA_ST_F16 && scale_inv->dtype != CLMLA_ST_BF16)
        return clmla_file_error(err, errsize, CLMLA_ERROR_UNSUPPORTED, scale_file->name,
                    "block scales '%s' have dtype %s; F32, F16 or BF16 expected", scale_inv->name, scale_inv->dtype_name);
    *cols_blocks = want[1];
    return CLMLA_SUCCESS;
}

clmla_status clmla_st_to_f32(const clmla_st_file *f, const clmla_st_tensor *t, const clmla_st_file *scale_file,
                             const clmla_st_tensor *scale_inv, float *out, char *err, size_t errsize)
{
    if (!f || !t || !out)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_ARGUMENT, f ? f->name : NULL, "NULL argument");
    clmla_dtype dtype;
    clmla_status st = clmla_st_stored_dtype(f, t, &dtype, err, errsize);
    if (st != CLMLA_SUCCESS)
        return st;
    const uint8_t *p = f->data + t->begin;
    const uint64_t n = clmla_st_numel(t);
    if (t->dtype != CLMLA_ST_F8_E4M3) {
        for (uint64_t i = 0; i < n; i++)
            out[i] = element(p, t->dtype, i);
        return CLMLA_SUCCESS;
    }

    /* F8_E4M3: W[i, j] = fp8(Wq[i, j]) * S[i / 128, j / 128]. */
    int64_t cols_blocks = 0;
    st = check_scales(f, t, scale_file, scale_inv, &cols_blocks, err, errsize);
    if (st != CLMLA_SUCCESS)
        return st;
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const uint8_t *s = scale_file->data + scale_inv->begin;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            const float scale = element(s, scale_inv->dtype, (uint64_t)((i / 128) * cols_blocks + j / 128));
            out[i * cols + j] = clmla_e4m3_to_float(p[i * cols + j]) * scale;
        }
    return CLMLA_SUCCESS;
}

clmla_status clmla_st_copy_raw(const clmla_st_file *f, const clmla_st_tensor *t, void *out, char *err, size_t errsize)
{
    if (!f || !t || !out)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_ARGUMENT, f ? f->name : NULL, "NULL argument");
    clmla_dtype dtype;
    const clmla_status st = clmla_st_stored_dtype(f, t, &dtype, err, errsize);
    if (st != CLMLA_SUCCESS)
        return st;
    const size_t width = clmla_dtype_bytes(dtype);
    const size_t bytes = (size_t)(t->end - t->begin); /* numel x width, checked by the parser */
    const uint8_t *p = f->data + t->begin;
    uint8_t *q = out;
    /* safetensors is little-endian: on a little-endian host, and for one-byte codes anywhere, the
       file's bytes are already the host's elements. */
    const uint16_t probe = 1;
    uint8_t first_byte;
    memcpy(&first_byte, &probe, 1);
    if (first_byte == 1 || width == 1) {
        memcpy(q, p, bytes);
        return CLMLA_SUCCESS;
    }
    /* A big-endian host: the layer reads elements in the host's order. */
    for (size_t i = 0; i < bytes; i += width)
        for (size_t b = 0; b < width; b++)
            q[i + b] = p[i + width - 1 - b];
    return CLMLA_SUCCESS;
}

clmla_status clmla_st_scales_f32(const clmla_st_file *f, const clmla_st_tensor *t, const clmla_st_file *scale_file,
                                 const clmla_st_tensor *scale_inv, float *out, char *err, size_t errsize)
{
    if (!f || !t || !out)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_ARGUMENT, f ? f->name : NULL, "NULL argument");
    if (t->dtype != CLMLA_ST_F8_E4M3)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_ARGUMENT, f->name,
                                "tensor '%s' has dtype %s; only F8_E4M3 tensors have block scales", t->name,
                                t->dtype_name);
    int64_t cols_blocks = 0;
    const clmla_status st = check_scales(f, t, scale_file, scale_inv, &cols_blocks, err, errsize);
    if (st != CLMLA_SUCCESS)
        return st;
    const uint64_t n = clmla_st_numel(scale_inv);
    const uint8_t *s = scale_file->data + scale_inv->begin;
    for (uint64_t i = 0; i < n; i++)
        out[i] = element(s, scale_inv->dtype, i);
    return CLMLA_SUCCESS;
}

/* ---- the shard index ------------------------------------------------------------------------ */

static int compare_entries(const void *a, const void *b)
{
    return strcmp(((const clmla_st_index_entry *)a)->tensor, ((const clmla_st_index_entry *)b)->tensor);
}

void clmla_st_index_free(clmla_st_index *index)
{
    if (!index)
        return;
    for (size_t i = 0; i < index->num_entries; i++) {
        free(index->entries[i].tensor);
        free(index->entries[i].file);
    }
    free(index->entries);
    memset(index, 0, sizeof(*index));
}

static int plain_file_name(const char *s)
{
    return s[0] && strchr(s, '/') == NULL && strchr(s, '\\') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

clmla_status clmla_st_index_parse(const char *text, size_t length, const char *name, clmla_st_index *out, char *err,
                                  size_t errsize)
{
    const char *fname = name ? name : "(index)";
    const clmla_status bad = parse_start(text, length, "NULL text", out, sizeof(*out), fname, err, errsize);
    if (bad != CLMLA_SUCCESS)
        return bad;
    const char *parse_end = NULL;
    cJSON *root = length ? cJSON_ParseWithLengthOpts(text, length, &parse_end, 0) : NULL;
    if (!root) {
        const size_t at = parse_end && parse_end >= text ? (size_t)(parse_end - text) : 0;
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "not valid JSON (parsing stopped at byte %zu)", at);
    }
    /* Trailing white space (and a NUL some writers leave) is fine; anything else is not. */
    const char *p = parse_end ? parse_end : text + length;
    while (p < text + length && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\0'))
        p++;
    const cJSON *map = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    clmla_status st = CLMLA_SUCCESS;
    if (p != text + length)
        st = clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "data after the JSON object");
    else if (!cJSON_IsObject(root))
        st = clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "JSON but not an object");
    else if (!cJSON_IsObject(map))
        st = clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "no \"weight_map\" object");
    size_t n = 0;
    if (st == CLMLA_SUCCESS) {
        for (const cJSON *e = map->child; e; e = e->next)
            n++;
        out->entries = calloc(n ? n : 1, sizeof(*out->entries));
        if (!out->entries)
            st = clmla_file_error(err, errsize, CLMLA_ERROR_OUT_OF_HOST_MEMORY, fname, "out of host memory");
    }
    for (const cJSON *e = st == CLMLA_SUCCESS ? map->child : NULL; e && st == CLMLA_SUCCESS; e = e->next) {
        const char *tensor = e->string ? e->string : "";
        if (!cJSON_IsString(e) || !e->valuestring) {
            st = clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "weight_map entry '%s' is not a file name string", tensor);
            break;
        }
        if (!plain_file_name(e->valuestring)) {
            st = clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname,
                      "weight_map places '%s' in '%s', which is not a plain file name in the model folder", tensor,
                      e->valuestring);
            break;
        }
        clmla_st_index_entry *entry = &out->entries[out->num_entries++];
        entry->tensor = strdup(tensor);
        entry->file = strdup(e->valuestring);
        if (!entry->tensor || !entry->file)
            st = clmla_file_error(err, errsize, CLMLA_ERROR_OUT_OF_HOST_MEMORY, fname, "out of host memory");
    }
    cJSON_Delete(root);
    if (st == CLMLA_SUCCESS) {
        qsort(out->entries, out->num_entries, sizeof(*out->entries), compare_entries);
        for (size_t i = 1; i < out->num_entries && st == CLMLA_SUCCESS; i++)
            if (strcmp(out->entries[i - 1].tensor, out->entries[i].tensor) == 0)
                st = clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "weight_map names tensor '%s' twice",
                          out->entries[i].tensor);
    }
    if (st != CLMLA_SUCCESS)
        clmla_st_index_free(out);
    return st;
}

const char *clmla_st_index_lookup(const clmla_st_index *index, const char *tensor)
{
    if (!index || !tensor || !index->num_entries)
        return NULL;
    clmla_st_index_entry key = {(char *)tensor, NULL};
    const clmla_st_index_entry *e = bsearch(&key, index->entries, index->num_entries, sizeof(key), compare_entries);
    return e ? e->file : NULL;
}
