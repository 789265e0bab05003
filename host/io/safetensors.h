/* safetensors files (docs/MLA.md section 8): the header parsed and checked, tensors looked up,
 * copied out in their stored dtype or converted to float32, and the shard index of sharded
 * checkpoints.
 *
 *   file  = [8-byte little-endian header length N] [N bytes of JSON] [data]
 *   JSON  = {"__metadata__": {...}?, name: {"dtype": "BF16", "shape": [r, c], "data_offsets": [b, e]}, ...}
 *   data  = the tensors, row-major, little-endian; offsets relative to the start of data
 *
 * The parser works on a memory buffer (so the fuzzer can drive it) and reports problems in a
 * caller's buffer, prefixed with the file's name; it never touches the library's error state. */
#ifndef CLMLA_SAFETENSORS_H
#define CLMLA_SAFETENSORS_H
#include "clmla.h"

#include <stddef.h>
#include <stdint.h>

#define CLMLA_ST_MAX_DIMS 16
/* A header larger than this is refused (the reference implementation uses the same bound). */
#define CLMLA_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

typedef enum clmla_st_dtype {
    CLMLA_ST_F32,
    CLMLA_ST_F16,
    CLMLA_ST_BF16,
    CLMLA_ST_F8_E4M3,
    CLMLA_ST_OTHER_KNOWN, /* a dtype of the format clmla does not convert (I64, F8_E5M2, ...) */
    CLMLA_ST_UNKNOWN      /* a dtype name the format does not define; its size cannot be checked */
} clmla_st_dtype;

typedef struct clmla_st_tensor {
    char *name;
    char dtype_name[16];       /* as written, e.g. "BF16" (truncated if absurdly long) */
    clmla_st_dtype dtype;
    int ndim;
    int64_t shape[CLMLA_ST_MAX_DIMS];
    uint64_t begin, end;       /* byte range inside the data section */
} clmla_st_tensor;

typedef struct clmla_st_file {
    char *name;                /* for messages: the path, or what the caller called the buffer */
    const uint8_t *data;       /* the data section: data[0 .. data_size) */
    uint64_t data_size;
    clmla_st_tensor *tensors;  /* [num_tensors], sorted by name */
    size_t num_tensors;
    void *map;                 /* the whole mapped file (clmla_st_open), else NULL */
    size_t map_size;
} clmla_st_file;

/* Parses and checks the header of a safetensors image of `size` bytes: the header length within
   the buffer and at most CLMLA_ST_MAX_HEADER, valid JSON with nothing but white space after it,
   every entry an object with a dtype string, a shape of non-negative integers whose product does
   not overflow and data_offsets [begin, end] with end - begin = numel x element size, the ranges
   in bounds, contiguous from 0 and not overlapping, no name twice. On success *out refers into
   `data` (which must outlive it); on failure *out is empty and err holds "<name>: <problem>".
   Returns CLMLA_SUCCESS, CLMLA_ERROR_INVALID_FILE or CLMLA_ERROR_OUT_OF_HOST_MEMORY. */
clmla_status clmla_st_parse(const uint8_t *data, size_t size, const char *name, clmla_st_file *out, char *err,
                            size_t errsize);

/* Maps the file read-only and parses it. CLMLA_ERROR_IO when it cannot be opened or mapped. */
clmla_status clmla_st_open(const char *path, clmla_st_file *out, char *err, size_t errsize);

/* Frees what parse/open made and unmaps the file; accepts an empty (zeroed) file. */
void clmla_st_close(clmla_st_file *file);

/* The tensor of that name, or NULL. */
const clmla_st_tensor *clmla_st_find(const clmla_st_file *file, const char *name);

/* Number of elements (the shape was checked not to overflow). */
uint64_t clmla_st_numel(const clmla_st_tensor *t);

/* "[7168, 1536]" */
void clmla_st_shape_text(int ndim, const int64_t *shape, char *buf, size_t size);

/* Converts a tensor to float32 into out[numel]: F32, F16, BF16 as they are; F8_E4M3 needs its
   block scales `scale_inv` (F32, F16 or BF16, shape [ceil(rows/128), ceil(cols/128)] for a 2-D
   tensor), in the DeepSeek-V3 layout W[i,j] = fp8(Wq[i,j]) * S[i/128, j/128] (a float32 product).
   scale_file is the file holding scale_inv (it may differ from `file` in a sharded checkpoint).
   CLMLA_ERROR_UNSUPPORTED for another dtype, CLMLA_ERROR_SHAPE_MISMATCH for a wrong scale shape. */
clmla_status clmla_st_to_f32(const clmla_st_file *file, const clmla_st_tensor *t, const clmla_st_file *scale_file,
                             const clmla_st_tensor *scale_inv, float *out, char *err, size_t errsize);

/* The clmla_dtype a tensor is kept in as stored, for F32, F16, BF16 and F8_E4M3; any other dtype
   is CLMLA_ERROR_UNSUPPORTED, naming the tensor and its dtype. */
clmla_status clmla_st_stored_dtype(const clmla_st_file *file, const clmla_st_tensor *t, clmla_dtype *dtype, char *err,
                                   size_t errsize);

/* Copies a tensor's elements as stored (F32, F16, BF16 or F8_E4M3 codes) into
   out[numel * clmla_dtype_bytes], in the host's byte order: the array a clmla_tensor of that dtype
   points to. CLMLA_ERROR_UNSUPPORTED (naming the tensor and its dtype) for any other dtype. */
clmla_status clmla_st_copy_raw(const clmla_st_file *file, const clmla_st_tensor *t, void *out, char *err,
                               size_t errsize);

/* The block scales of the 2-D F8_E4M3 tensor t as float32 into out[ceil(rows/128) * ceil(cols/128)]
   (the clmla_tensor.scale of t), after the checks of clmla_st_to_f32: scale_inv present (else
   CLMLA_ERROR_MISSING_TENSOR naming it), of that shape (else CLMLA_ERROR_SHAPE_MISMATCH naming
   both shapes), stored F32, F16 or BF16 (else CLMLA_ERROR_UNSUPPORTED). */
clmla_status clmla_st_scales_f32(const clmla_st_file *file, const clmla_st_tensor *t, const clmla_st_file *scale_file,
                                 const clmla_st_tensor *scale_inv, float *out, char *err, size_t errsize);

/* ---- the shard index: model.safetensors.index.json ------------------------------------------ */

typedef struct clmla_st_index_entry {
    char *tensor;
    char *file;
} clmla_st_index_entry;

typedef struct clmla_st_index {
    clmla_st_index_entry *entries; /* sorted by tensor name */
    size_t num_entries;
} clmla_st_index;

/* Parses {"metadata": {...}?, "weight_map": {tensor: file, ...}}: weight_map must be an object of
   strings, each file a plain file name (no directory part, not "." or ".."), no tensor twice. */
clmla_status clmla_st_index_parse(const char *text, size_t length, const char *name, clmla_st_index *out, char *err,
                                  size_t errsize);
void clmla_st_index_free(clmla_st_index *index);
/* The shard file of a tensor, or NULL. */
const char *clmla_st_index_lookup(const clmla_st_index *index, const char *tensor);

#endif
