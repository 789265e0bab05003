/* Writes new tokens' c^KV (after RMSNorm) and k^R (after RoPE) into their slots of the paged
 * latent cache of one layer.
 *
 *   c_kv   : rows of RKV floats, row t at c_kv[c_kv_offset + t*c_kv_stride]
 *   k_rope : rows of DR floats,  row t at k_rope[k_rope_offset + t*k_rope_stride]
 *   slots  : [T] cache row of token t (block * block_tokens + index in block)
 *   cache  : rows of CACHE_ROW_UNITS CACHE_Ts (cl/prelude.cl: float, half, bf16 or fp8)
 *
 * Work-item (d, t) stores value d of the cache row of token t, rounded to nearest even. With
 * CACHE_FP8 (FlashMLA's layout, cl/prelude.cl) work-item (d, t) with d < RKV/128 quantises tile d
 * of c^KV instead, as FlashMLA's tests/quant.py does: its scale is max(max|x| / 448, 1e-4)
 * rounded up to a power of two (so at least 2^-13), which makes x / scale exact and at most 448
 * in magnitude, and the codes are e4m3(x / scale); the items after them store k^R as bf16. A tile
 * that holds a NaN gets a NaN scale, so that all of it reads back as NaN (the decoder of
 * cl/prelude.cl does not test codes for NaN). */
#define ROW (RKV + DR)


/* Work-item (d, t)'s part of token t's row r (above). */
inline void write_row_part(const int d, const int t, __global const float *c_kv, const int c_kv_offset,
                           const int c_kv_stride, __global const float *k_rope, const int k_rope_offset,
                           const int k_rope_stride, __global CACHE_T *r)
{
#ifdef CACHE_FP8
    if (d < RKV / 128) {
        __global const float *x = c_kv + c_kv_offset + (size_t)t * c_kv_stride + d * 128;
        float amax = 0.0f;
        int nan = 0;
        for (int i = 0; i < 128; i++) {
            amax = fmax(amax, fabs(x[i]));
            nan |= isnan(x[i]);
        }
        /* 2^ceil(log2(max(amax / 448, 1e-4))), from the bits: the argument is positive and normal */
        const uint b = as_uint(fmax(amax / 448.0f, 1e-4f));
        const float scale = nan ? NAN : as_float((b & 0x007FFFFFu) ? (b & 0x7F800000u) + 0x00800000u : b);
        ((__global float *)(r + RKV))[d] = scale;
        for (int i = 0; i < 128; i++)
            r[d * 128 + i] = dt_to_e4m3(x[i] / scale);
    } else if (d < RKV / 128 + DR) {
        const int i = d - RKV / 128;
        ((__global ushort *)(r + RKV + 4 * (RKV / 128)))[i] = dt_to_bf16(k_rope[k_rope_offset + (size_t)t * k_rope_stride + i]);
    }
#else
    if (d >= ROW)
        return;
    const float v = d < RKV ? c_kv[c_kv_offset + (size_t)t * c_kv_stride + d]
                            : k_rope[k_rope_offset + (size_t)t * k_rope_stride + (d - RKV)];
    CACHE_STORE(v, d, r); /* cl/prelude.cl */
#endif
}

__kernel void cache_write(__global const float *c_kv, const int c_kv_offset, const int c_kv_stride,
                          __global const float *k_rope, const int k_rope_offset, const int k_rope_stride,
                          __global const int *slots, __global CACHE_T *cache)
{
    const int d = get_global_id(0);
    const int t = get_global_id(1);
    write_row_part(d, t, c_kv, c_kv_offset, c_kv_stride, k_rope, k_rope_offset, k_rope_stride,
                   cache + (size_t)slots[t] * CACHE_ROW_UNITS);
}

/* The same for slots a caller gives (clmla_paged_write, vLLM's slot_mapping), from slots_offset: a
 * slot of -1 skips its token; one outside -1 .. num_slots - 1 is not written, and sets bit 4 of
 * *status (CLMLA_PAGED_BAD_SLOT). */
__kernel void cache_write_slots(__global const float *c_kv, const int c_kv_offset, const int c_kv_stride,
                                __global const float *k_rope, const int k_rope_offset, const int k_rope_stride,
                                __global const int *slots, const int slots_offset, const int num_slots,
                                __global CACHE_T *cache, __global int *status)
{
    const int d = get_global_id(0);
    const int t = get_global_id(1);
    const int slot = slots[slots_offset + t];
    if (slot < -1 || slot >= num_slots) {
        if (d == 0)
            atomic_or(status, 4);
        return;
    }
    if (slot == -1)
        return;
    write_row_part(d, t, c_kv, c_kv_offset, c_kv_stride, k_rope, k_rope_offset, k_rope_stride,
                   cache + (size_t)slot * CACHE_ROW_UNITS);
}
