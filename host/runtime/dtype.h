/* Element types on the host: sizes, names, decoding codes to float and encoding floats to codes
   (round to nearest even), and the 128 x 128 block quantisation of FP8 weights. The device's side
   of the same formats is cl/prelude.cl. Numbering: clmla_dtype (include/clmla.h). */
#ifndef CLMLA_DTYPE_H
#define CLMLA_DTYPE_H
#include "clmla.h"

#include <stddef.h>
#include <stdint.h>

/* Side of an FP8 scale block, in elements, along both dimensions. */
#define CLMLA_FP8_BLOCK 128
/* The fp8 product kernels take block scales below this (with the decoder GPUs use they multiply a
   scale by 2^120 once and decode codes 2^-120 times their value, cl/prelude.cl; the one CPUs use
   needs only 2^8, but one limit holds for every device, so that a weight is held the same way
   everywhere); a weight with a larger one is held in float32. Real checkpoints' scales are near
   max|W| / 448, far below. */
#define CLMLA_FP8_SCALE_LIMIT 256.0f

/* Bytes of one element (FP8: of one code; its scales are extra), 0 for an unknown dtype. */
size_t clmla_dtype_bytes(clmla_dtype dtype);
/* 1 for the four dtypes clmla_dtype names. */
int clmla_dtype_valid(clmla_dtype dtype);

/* Decoders: exact. e4m3: OCP E4M3FN (bias 7, subnormals, 0x7F / 0xFF NaN, no infinities). */
float clmla_f16_to_float(uint16_t h);
float clmla_bf16_to_float(uint16_t b);
float clmla_e4m3_to_float(uint8_t c);
/* Encoders: round to nearest, ties to even. f16: past 65504 infinity; bf16: NaN stays NaN;
   e4m3: magnitudes past 448 saturate to 448, NaN to 0x7F (sign kept). */
uint16_t clmla_float_to_f16(float f);
uint16_t clmla_float_to_bf16(float f);
uint8_t clmla_double_to_e4m3(double x);

/* Element i of an array of `dtype` codes (FP8: the code alone, unscaled), as float. */
float clmla_dtype_element(const void *data, clmla_dtype dtype, size_t i);

/* Number of scale blocks along a dimension of n elements. */
static inline size_t clmla_fp8_blocks(size_t n)
{
    return (n + CLMLA_FP8_BLOCK - 1) / CLMLA_FP8_BLOCK;
}

/* W[i, j] of a tensor (any dtype; FP8 times its block scale), as float. */
float clmla_tensor_element(const clmla_tensor *t, size_t i, size_t j);

/* Quantises W [rows, cols] (float values in `w`) to FP8 blocks: for each 128 x 128 block the
   float32 scale s = max|W| / 448 (a block of zeros: s = 1), and codes e4m3(W / s) with the quotient
   taken in double (one rounding). codes [rows * cols], scale [blocks(rows) * blocks(cols)].
   Returns 0, or -1 (nothing meaningful written) when a value is not finite. */
int clmla_fp8_quantize(const float *w, size_t rows, size_t cols, uint8_t *codes, float *scale);

#endif
