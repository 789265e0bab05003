/* libFuzzer: a safetensors image through clmla_st_parse; on success every tensor must be found by
   name, lie inside the data, and convert (F8_E4M3 with its _scale_inv when present). Each tensor
   also goes through the readers the model loader uses (host/io/model.c): clmla_st_stored_dtype,
   clmla_st_copy_raw into numel x clmla_dtype_bytes bytes, and for F8_E4M3 clmla_st_scales_f32 into
   clmla_fp8_blocks(rows) x clmla_fp8_blocks(cols) floats, with "<name>_scale_inv" when the file has
   it and with no scales at all. Their error paths (an unsupported dtype, scales asked of a tensor
   that has none, scales missing) get buffers the calls must not write past. Outputs are summed into
   a volatile only so that the calls are kept; statuses are checked where the contracts fix them. */
#include "dtype.h"
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Tensors whose copy would take more than this are skipped, to keep the runs fast. */
#define MAX_BYTES ((size_t)4 << 20)

static volatile uint32_t sink;

static void touch(const void *p, size_t bytes)
{
    const uint8_t *b = p;
    uint32_t sum = 0;
    for (size_t i = 0; i < bytes; i++)
        sum += b[i];
    sink += sum;
}

static int little_endian_host(void)
{
    const uint16_t probe = 1;
    uint8_t first;
    memcpy(&first, &probe, 1);
    return first == 1;
}

/* The stored-dtype readers on t: its copy as stored, and for F8_E4M3 its block scales. */
static void read_stored(const clmla_st_file *f, const clmla_st_tensor *t, const clmla_st_tensor *scale)
{
    char err[1024] = "";
    clmla_dtype dtype = CLMLA_DTYPE_F32;
    const clmla_status st = clmla_st_stored_dtype(f, t, &dtype, err, sizeof(err));
    const int convertible = t->dtype == CLMLA_ST_F32 || t->dtype == CLMLA_ST_F16 || t->dtype == CLMLA_ST_BF16 ||
                            t->dtype == CLMLA_ST_F8_E4M3;
    if ((st == CLMLA_SUCCESS) != convertible || (st != CLMLA_SUCCESS && st != CLMLA_ERROR_UNSUPPORTED))
        abort();
    if (st != CLMLA_SUCCESS) {
        /* Refused before anything is written: a one-byte buffer is enough. */
        uint8_t one = 0;
        if (clmla_st_copy_raw(f, t, &one, err, sizeof(err)) != CLMLA_ERROR_UNSUPPORTED)
            abort();
        float s = 0;
        if (clmla_st_scales_f32(f, t, f, scale, &s, err, sizeof(err)) != CLMLA_ERROR_INVALID_ARGUMENT)
            abort();
        return;
    }

    /* The parser checked end - begin = numel x element size; the copy relies on it. */
    const uint64_t numel = clmla_st_numel(t);
    const size_t width = clmla_dtype_bytes(dtype);
    if (width == 0 || t->end - t->begin != numel * width)
        abort();
    const size_t bytes = (size_t)(t->end - t->begin);
    if (bytes <= MAX_BYTES) {
        uint8_t *raw = malloc(bytes ? bytes : 1);
        if (raw) {
            if (clmla_st_copy_raw(f, t, raw, err, sizeof(err)) != CLMLA_SUCCESS)
                abort();
            /* On a little-endian host (and for one-byte codes anywhere) the copy is the file's bytes. */
            if ((little_endian_host() || width == 1) && bytes && memcmp(raw, f->data + t->begin, bytes) != 0)
                abort();
            touch(raw, bytes);
            free(raw);
        }
    }

    if (dtype != CLMLA_DTYPE_FP8_E4M3) {
        float s = 0;
        if (clmla_st_scales_f32(f, t, f, scale, &s, err, sizeof(err)) != CLMLA_ERROR_INVALID_ARGUMENT)
            abort();
        return;
    }
    /* F8_E4M3: out[blocks(rows) * blocks(cols)] as model.c sizes it; a tensor that is not 2-D is
       refused before anything is written. Every factor is at most numel (or a zero extent makes
       the product 0), so the product does not overflow; and numel <= the data section's size. */
    size_t blocks = 0;
    if (t->ndim == 2)
        blocks = clmla_fp8_blocks((size_t)t->shape[0]) * clmla_fp8_blocks((size_t)t->shape[1]);
    if (blocks > MAX_BYTES / sizeof(float))
        return;
    float *scales = malloc((blocks ? blocks : 1) * sizeof(float));
    if (!scales)
        return;
    const clmla_status with = clmla_st_scales_f32(f, t, f, scale, scales, err, sizeof(err));
    if (with == CLMLA_SUCCESS) {
        if (t->ndim != 2 || !scale || clmla_st_numel(scale) != blocks)
            abort();
        touch(scales, blocks * sizeof(float));
    } else if (with != CLMLA_ERROR_UNSUPPORTED && with != CLMLA_ERROR_MISSING_TENSOR &&
               with != CLMLA_ERROR_SHAPE_MISMATCH) {
        abort();
    }
    /* The scales absent (no tensor, or no file to hold it): MISSING_TENSOR for a 2-D tensor. */
    const clmla_status absent = clmla_st_scales_f32(f, t, f, NULL, scales, err, sizeof(err));
    const clmla_status no_file = clmla_st_scales_f32(f, t, NULL, scale, scales, err, sizeof(err));
    const clmla_status want = t->ndim == 2 ? CLMLA_ERROR_MISSING_TENSOR : CLMLA_ERROR_UNSUPPORTED;
    if (absent != want || no_file != want)
        abort();
    touch(err, strlen(err));
    free(scales);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    clmla_st_file f;
    char err[1024];
    if (clmla_st_parse(data, size, "fuzz.safetensors", &f, err, sizeof(err)) != CLMLA_SUCCESS)
        return 0;
    for (size_t i = 0; i < f.num_tensors; i++) {
        const clmla_st_tensor *t = &f.tensors[i];
        if (clmla_st_find(&f, t->name) != t || t->begin > t->end || t->end > f.data_size)
            abort();
        /* As model.c names the block scales: "x.weight" -> "x.weight_scale_inv". */
        const size_t name_length = strlen(t->name);
        char *scale_name = malloc(name_length + sizeof("_scale_inv"));
        if (!scale_name)
            continue;
        memcpy(scale_name, t->name, name_length);
        memcpy(scale_name + name_length, "_scale_inv", sizeof("_scale_inv"));
        const clmla_st_tensor *scale = clmla_st_find(&f, scale_name);
        free(scale_name);

        read_stored(&f, t, scale);

        const uint64_t n = clmla_st_numel(t);
        if (n > (1u << 20))
            continue;
        float *out = malloc((size_t)(n ? n : 1) * sizeof(float));
        if (out)
            clmla_st_to_f32(&f, t, &f, scale, out, err, sizeof(err));
        free(out);
    }
    clmla_st_close(&f);
    return 0;
}
