/* .npy reading and writing (float32 / float16, little-endian, C order, 1-D or 2-D). */
#include "npy.h"
#include "dtype.h"
#include "fileio.h"
#include "internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* ---- the header dict: a small tokenizer for the Python literal numpy writes ------------------- */

typedef struct scanner {
    const char *p, *end;
} scanner;

static void skip_space(scanner *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

/* Consumes `c` (after white space) when it is next. */
static int accept(scanner *s, char c)
{
    skip_space(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return 1;
    }
    return 0;
}

/* A quoted string ('...' or "...", no escapes: numpy's keys and dtype strings have none) into buf. */
static int scan_string(scanner *s, char *buf, size_t size)
{
    skip_space(s);
    if (s->p >= s->end || (*s->p != '\'' && *s->p != '"'))
        return 0;
    const char quote = *s->p++;
    size_t n = 0;
    while (s->p < s->end && *s->p != quote) {
        if (*s->p == '\\' || n + 1 >= size)
            return 0;
        buf[n++] = *s->p++;
    }
    if (s->p >= s->end)
        return 0;
    s->p++;
    buf[n] = '\0';
    return 1;
}

static int scan_word(scanner *s, const char *word)
{
    skip_space(s);
    const size_t n = strlen(word);
    if ((size_t)(s->end - s->p) >= n && memcmp(s->p, word, n) == 0) {
        s->p += n;
        return 1;
    }
    return 0;
}

/* A non-negative decimal integer (an old 'L' suffix allowed). */
static int scan_uint(scanner *s, uint64_t *value)
{
    skip_space(s);
    const char *start = s->p;
    uint64_t v = 0;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        const unsigned digit = (unsigned)(*s->p - '0');
        if (v > (UINT64_MAX - digit) / 10)
            return 0;
        v = v * 10 + digit;
        s->p++;
    }
    if (s->p == start)
        return 0;
    if (s->p < s->end && *s->p == 'L')
        s->p++;
    *value = v;
    return 1;
}

/* (a, b, ...) into shape; *ndim may exceed 2 (counted, not stored) so the caller can name it. */
static int scan_shape(scanner *s, int *ndim, uint64_t shape[2])
{
    if (!accept(s, '('))
        return 0;
    *ndim = 0;
    if (accept(s, ')'))
        return 1;
    for (;;) {
        uint64_t v = 0;
        if (!scan_uint(s, &v))
            return 0;
        if (*ndim < 2)
            shape[*ndim] = v;
        if (*ndim < 64)
            (*ndim)++;
        if (accept(s, ')'))
            return 1;
        if (!accept(s, ','))
            return 0;
        if (accept(s, ')'))
            return 1;
    }
}

clmla_status clmla_npy_parse(const uint8_t *buf, size_t size, const char *name, clmla_npy_info *info, char *err,
                             size_t errsize)
{
    const char *fname = name ? name : "(npy)";
    if (!info || (!buf && size))
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_ARGUMENT, fname, "NULL argument");
    memset(info, 0, sizeof(*info));
    if (size < 10 || memcmp(buf, magic, sizeof(magic)) != 0)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "not a .npy file (no \\x93NUMPY magic)");
    const int major = buf[6];
    size_t header_start, header_len;
    if (major == 1) {
        header_start = 10;
        header_len = (size_t)buf[8] | (size_t)buf[9] << 8;
    } else if (major == 2 || major == 3) {
        if (size < 12)
            return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "truncated in the header length");
        header_start = 12;
        header_len = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
    } else {
        return clmla_file_error(err, errsize, CLMLA_ERROR_UNSUPPORTED, fname, ".npy format version %d.%d is not supported (1.x-3.x)",
                    major, buf[7]);
    }
    if (header_len > size - header_start)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname,
                    "header length %zu is past the end of the file (%zu bytes)", header_len, size);

    scanner s = {(const char *)buf + header_start, (const char *)buf + header_start + header_len};
    char descr[32] = "";
    int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0, ndim = 0;
    uint64_t shape[2] = {0, 0};
    if (!accept(&s, '{'))
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "the header is not a dict literal");
    while (!accept(&s, '}')) {
        char key[32];
        if (!scan_string(&s, key, sizeof(key)) || !accept(&s, ':'))
            return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "malformed header dict near byte %zu",
                        (size_t)(s.p - (const char *)buf));
        if (strcmp(key, "descr") == 0 && !have_descr) {
            have_descr = 1;
            if (!scan_string(&s, descr, sizeof(descr)))
                return clmla_file_error(err, errsize, CLMLA_ERROR_UNSUPPORTED, fname,
                            "'descr' is not a simple dtype string (structured arrays are not supported)");
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            have_order = 1;
            if (scan_word(&s, "True"))
                fortran = 1;
            else if (!scan_word(&s, "False"))
                return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "'fortran_order' is not True or False");
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            have_shape = 1;
            if (!scan_shape(&s, &ndim, shape))
                return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "'shape' is not a tuple of non-negative integers");
        } else {
            return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "unexpected or repeated key '%s' in the header", key);
        }
        if (!accept(&s, ',')) {
            if (!accept(&s, '}'))
                return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "malformed header dict near byte %zu",
                            (size_t)(s.p - (const char *)buf));
            break;
        }
    }
    skip_space(&s);
    if (s.p != s.end)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "data after the header dict");
    if (!have_descr || !have_order || !have_shape)
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "the header lacks '%s'",
                    !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");

    if (strcmp(descr, "<f4") == 0)
        info->element_bytes = 4;
    else if (strcmp(descr, "<f2") == 0)
        info->element_bytes = 2;
    else if (strcmp(descr, "<f8") == 0) /* numpy's default: rounded to float32 when read */
        info->element_bytes = 8;
    else if (strcmp(descr, ">f4") == 0 || strcmp(descr, ">f2") == 0 || strcmp(descr, ">f8") == 0)
        return clmla_file_error(err, errsize, CLMLA_ERROR_UNSUPPORTED, fname,
                    "dtype '%s' is big-endian; clmla reads little-endian float32 ('<f4'), float16 ('<f2') or "
                    "float64 ('<f8')", descr);
    else
        return clmla_file_error(err, errsize, CLMLA_ERROR_UNSUPPORTED, fname,
                    "dtype '%s' is not supported; clmla reads float32 ('<f4'), float16 ('<f2') or float64 ('<f8')",
                    descr);
    if (fortran)
        return clmla_file_error(err, errsize, CLMLA_ERROR_UNSUPPORTED, fname,
                    "the array is in Fortran order; save a C-ordered array (numpy.ascontiguousarray)");
    if (ndim < 1 || ndim > 2)
        return clmla_file_error(err, errsize, CLMLA_ERROR_UNSUPPORTED, fname, "the array has %d dimensions; 1 or 2 are supported",
                    ndim);
    if (ndim == 1)
        shape[1] = 1;
    if (shape[0] > (uint64_t)INT64_MAX || shape[1] > (uint64_t)INT64_MAX ||
        (shape[1] && shape[0] > (UINT64_MAX / 8) / shape[1]))
        return clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "the shape's element count overflows");
    info->ndim = ndim;
    info->shape[0] = (int64_t)shape[0];
    info->shape[1] = (int64_t)shape[1];
    info->numel = shape[0] * shape[1];
    info->data_offset = header_start + header_len;
    const uint64_t need = info->numel * (uint64_t)info->element_bytes, have = size - info->data_offset;
    if (have != need) {
        char shape_text[64];
        if (ndim == 1)
            snprintf(shape_text, sizeof(shape_text), "(%lld,)", (long long)info->shape[0]);
        else
            snprintf(shape_text, sizeof(shape_text), "(%lld, %lld)", (long long)info->shape[0], (long long)info->shape[1]);
        const clmla_status st =
            clmla_file_error(err, errsize, CLMLA_ERROR_INVALID_FILE, fname, "%s: %llu bytes of data, but shape %s of '%s' needs %llu",
                 have < need ? "truncated" : "trailing bytes", (unsigned long long)have, shape_text, descr,
                 (unsigned long long)need);
        memset(info, 0, sizeof(*info));
        return st;
    }
    return CLMLA_SUCCESS;
}

void clmla_npy_to_f32(const uint8_t *buf, const clmla_npy_info *info, float *out)
{
    const uint8_t *p = buf + info->data_offset;
    for (uint64_t i = 0; i < info->numel; i++) {
        if (info->element_bytes == 2) {
            out[i] = clmla_f16_to_float((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        } else if (info->element_bytes == 8) {
            uint64_t bits = 0;
            for (int b = 7; b >= 0; b--)
                bits = bits << 8 | p[8 * i + (uint64_t)b];
            double v;
            memcpy(&v, &bits, sizeof(v));
            out[i] = (float)v;
        } else {
            const uint8_t *q = p + 4 * i;
            const uint32_t bits = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
            memcpy(&out[i], &bits, sizeof(float));
        }
    }
}

/* ---- public: files ---------------------------------------------------------------------------- */

clmla_status clmla_npy_read_f32(const char *path, float **data, int64_t shape[2], int *ndim)
{
    if (!path || !data || !shape || !ndim)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_npy_read_f32: NULL argument");
    *data = NULL;
    *ndim = 0;
    shape[0] = shape[1] = 0;
    char *text = NULL;
    size_t size = 0;
    char err[512];
    clmla_status st = clmla_read_file(path, SIZE_MAX / 2, "a .npy file", &text, &size, err, sizeof(err));
    if (st != CLMLA_SUCCESS)
        clmla_fail(NULL, st, "%s", err);
    uint8_t *buf = (uint8_t *)text;
    clmla_npy_info info;
    if (st == CLMLA_SUCCESS) {
        st = clmla_npy_parse(buf, size, path, &info, err, sizeof(err));
        if (st != CLMLA_SUCCESS)
            clmla_fail(NULL, st, "%s", err);
    }
    float *out = NULL;
    if (st == CLMLA_SUCCESS) {
        out = malloc(info.numel ? (size_t)info.numel * sizeof(float) : 1);
        if (!out)
            st = clmla_fail(NULL, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "%s: out of host memory for %llu values", path,
                            (unsigned long long)info.numel);
    }
    if (st == CLMLA_SUCCESS) {
        clmla_npy_to_f32(buf, &info, out);
        *data = out;
        *ndim = info.ndim;
        shape[0] = info.shape[0];
        shape[1] = info.ndim == 2 ? info.shape[1] : 0;
    }
    free(buf);
    return st;
}

clmla_status clmla_npy_write_f32(const char *path, const float *data, int ndim, const int64_t shape[2])
{
    if (!path || !shape || (ndim != 1 && ndim != 2) || shape[0] < 0 || (ndim == 2 && shape[1] < 0))
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_npy_write_f32: NULL path, or ndim not 1 or 2, "
                                                              "or a negative dimension");
    const uint64_t numel = (uint64_t)shape[0] * (uint64_t)(ndim == 2 ? shape[1] : 1);
    if (numel && !data)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_npy_write_f32: NULL data");
    /* Version 1.0: magic, 2 version bytes, u16 header length, dict padded with spaces and ending in
       '\n' so that the data starts at a multiple of 64 bytes, as numpy writes it. */
    char header[256];
    int n = ndim == 2 ? snprintf(header, sizeof(header), "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                                 (long long)shape[0], (long long)shape[1])
                      : snprintf(header, sizeof(header), "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld,), }",
                                 (long long)shape[0]);
    size_t len = (size_t)n;
    while ((10 + len + 1) % 64 != 0)
        header[len++] = ' ';
    header[len++] = '\n';
    uint8_t prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(len & 0xFF), (uint8_t)(len >> 8)};

    FILE *f = fopen(path, "wb");
    if (!f)
        return clmla_fail(NULL, CLMLA_ERROR_IO, "%s: cannot create: %s", path, strerror(errno));
    int ok = fwrite(prefix, 1, sizeof(prefix), f) == sizeof(prefix) && fwrite(header, 1, len, f) == len;
    /* Little-endian float32, byte by byte so that the file is right on any host. */
    uint8_t chunk[4096];
    size_t used = 0;
    for (uint64_t i = 0; ok && i < numel; i++) {
        uint32_t bits;
        memcpy(&bits, &data[i], sizeof(bits));
        for (int b = 0; b < 4; b++)
            chunk[used++] = (uint8_t)(bits >> (8 * b));
        if (used == sizeof(chunk)) {
            ok = fwrite(chunk, 1, used, f) == used;
            used = 0;
        }
    }
    if (ok && used)
        ok = fwrite(chunk, 1, used, f) == used;
    if (fclose(f) != 0)
        ok = 0;
    if (!ok)
        return clmla_fail(NULL, CLMLA_ERROR_IO, "%s: write error: %s", path, strerror(errno));
    return CLMLA_SUCCESS;
}
