/* NumPy .npy files: float32 and float16 arrays of one or two dimensions, little-endian, C order.
 *
 *   file = "\x93NUMPY" [major] [minor] [header length: u16 (1.x) or u32 (2.x, 3.x), LE]
 *          [header: a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (T, D), }]
 *          [data]
 *
 * The parser works on a memory buffer (the fuzzer drives it) and writes problems to a caller's
 * buffer as "<name>: <problem>"; the public clmla_npy_read_f32 / clmla_npy_write_f32 wrap it. */
#ifndef CLMLA_NPY_H
#define CLMLA_NPY_H
#include "clmla.h"

#include <stddef.h>
#include <stdint.h>

typedef struct clmla_npy_info {
    int element_bytes;   /* 4: '<f4', 2: '<f2' */
    int ndim;            /* 1 or 2 */
    int64_t shape[2];    /* shape[1] = 1 when ndim is 1 */
    uint64_t numel;
    size_t data_offset;  /* where the data starts in the buffer */
} clmla_npy_info;

/* Checks magic, version, header length, the dict (exactly the keys descr, fortran_order, shape),
   the dtype (float32 / float16 little-endian only: big-endian, other dtypes and structured
   arrays are refused by name), fortran_order False, one or two dimensions, and that the data is
   exactly numel x element size bytes. CLMLA_ERROR_INVALID_FILE or CLMLA_ERROR_UNSUPPORTED. */
clmla_status clmla_npy_parse(const uint8_t *buf, size_t size, const char *name, clmla_npy_info *info, char *err,
                             size_t errsize);

/* The data of a parsed buffer as float32: out[numel]. */
void clmla_npy_to_f32(const uint8_t *buf, const clmla_npy_info *info, float *out);

#endif
