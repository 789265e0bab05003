/* Every numerical tolerance of the test suite, in one place. Errors are relative to the float64
   reference (ref/): max|got - want| / max|want| over the compared array (mla_ref_max_rel_err),
   unless a line says otherwise. */
#ifndef CLMLA_TEST_TOLERANCE_H
#define CLMLA_TEST_TOLERANCE_H

/* Attention output (after o_proj, or the latent o-bar and lse of clmla_attention_latent) and cache
   contents, when the latent cache holds float32. float32 GEMMs with K up to 16384 stay well
   inside this. */
#define TOL_F32_CACHE 1e-4

/* The same with a float16 cache: c^KV and k^R are rounded to 11 significant bits (2^-11 = 4.9e-4
   relative per element) before attention reads them. */
#define TOL_F16_CACHE 5e-3

/* The same with a bfloat16 cache: 8 significant bits (2^-8 = 3.9e-3 relative per element), eight
   times coarser than float16. Against a reference that rounds its cache alike (ref/,
   mla_ref_features.cache_type), every 16-bit cache is held to TOL_F32_CACHE instead. */
#define TOL_BF16_CACHE 4e-2

/* A 16-bit cache's contents against the reference's own rounding of them: the library rounds its
   float32 value and the reference its double one, so a value within float32's error of a tie may
   land one unit in the last place apart (seen: 1 value in about 10^4). Relative to the array's
   largest value, one unit is at most 2^-10 (f16), 2^-7 (bf16) or 2^-3 (fp8's e4m3 codes). */
#define TOL_ROUNDED_ELEMENT(dtype)                                                                      \
    ((dtype) == CLMLA_CACHE_FP8 ? 0x1p-3 : (dtype) == CLMLA_CACHE_BF16 ? 0x1p-7 : (dtype) == CLMLA_CACHE_F16 ? 0x1p-10 : 0.0)

/* The tolerance that goes with a clmla_cache_dtype. */
#define TOL_FOR_DTYPE(dtype)                                                                            \
    ((dtype) == CLMLA_CACHE_F16 ? TOL_F16_CACHE : (dtype) == CLMLA_CACHE_BF16 ? TOL_BF16_CACHE : TOL_F32_CACHE)

/* Two library computations of the same thing (absorbed vs decompressed path, a batch vs each
   sequence alone, prefill vs chunked prefill vs decode), relative to max|second|. Both are within
   TOL_FOR_DTYPE of the reference; in practice they agree far closer, so the same bound is used. */
#define TOL_AGREE_F32 1e-4
#define TOL_AGREE_F16 5e-3
#define TOL_AGREE_BF16 4e-2
#define TOL_AGREE_FOR_DTYPE(dtype)                                                                      \
    ((dtype) == CLMLA_CACHE_F16 ? TOL_AGREE_F16 : (dtype) == CLMLA_CACHE_BF16 ? TOL_AGREE_BF16 : TOL_AGREE_F32)

/* A product y = x W^T alone (clmla_linear) against float64 sums of the same float32 inputs, with K
   up to about 1000: float32 accumulation gives a few 1e-7; 1e-5 leaves room for any order. */
#define TOL_LINEAR_F32 1e-5

/* clmla_layer_config_softmax_scale against mla_ref_softmax_scale (same formula, double). */
#define TOL_SOFTMAX_SCALE_REL 1e-12

/* ... and against the 6-decimal numbers printed in docs/MLA.md section 4: they are rounded, so the
   exact value may differ from them by up to half a unit in the 6th decimal (1.6e-6 to 3.4e-6
   relative for the three presets, so a 1e-6 relative bound would reject the exact value). */
#define TOL_SOFTMAX_SCALE_DOC_ABS 5e-7

/* One float16 element read back from the cache (round to nearest even): per element
   |got - want| <= 2^-11 |want| + 2^-25 (the last term covers half subnormals). */
#define TOL_F16_ELEMENT_REL (1.0 / 2048.0)
#define TOL_F16_ELEMENT_ABS (1.0 / 33554432.0)

#endif
