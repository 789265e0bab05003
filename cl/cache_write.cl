/* Writes new tokens' c^KV (after RMSNorm) and k^R (after RoPE) into their slots of the paged
 * latent cache of one layer.
 *
 *   c_kv   : rows of RKV floats, row t at c_kv[c_kv_offset + t*c_kv_stride]
 *   k_rope : rows of DR floats,  row t at k_rope[k_rope_offset + t*k_rope_stride]
 *   slots  : [T] cache row of token t (block * block_tokens + index in block)
 *   cache  : [rows, RKV + DR] of CACHE_T (cl/prelude.cl: float, half or bf16), rounded to nearest even
 *
 * Work-item (d, t) copies element d of the cache row of token t. */
#ifndef RKV
#define RKV 512
#endif
#ifndef DR
#define DR 64
#endif
#define ROW (RKV + DR)


__kernel void cache_write(__global const float *c_kv, const int c_kv_offset, const int c_kv_stride,
                          __global const float *k_rope, const int k_rope_offset, const int k_rope_stride,
                          __global const int *slots, __global CACHE_T *cache)
{
    const int d = get_global_id(0);
    const int t = get_global_id(1);
    if (d >= ROW)
        return;
    const float v = d < RKV ? c_kv[c_kv_offset + (size_t)t * c_kv_stride + d]
                            : k_rope[k_rope_offset + (size_t)t * k_rope_stride + (d - RKV)];
    const size_t at = (size_t)slots[t] * ROW + d;
    CACHE_STORE(v, at, cache); /* cl/prelude.cl */
}
