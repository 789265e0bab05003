/* Copies tokens [0, n) of one sequence out of the paged cache into a dense float32 matrix, for
 * the decompressed path's up-projection (and for reading the cache back).
 *
 *   cache       : rows of CACHE_ROW_UNITS CACHE_Ts (cl/prelude.cl: float, half, bf16 or fp8)
 *   block_table : from table_offset, the sequence's block ids; token j lives in row
 *                 block_table[j / block_tokens] * block_tokens + j % block_tokens
 *   out         : [n, RKV + DR] float32 from out_offset
 *
 * Work-item (d, j) copies element d of token start + j. */
#define ROW (RKV + DR)

#define LOAD(p, i) CACHE_LOAD(p, i) /* cl/prelude.cl */

__kernel void cache_gather(__global const CACHE_T *cache, __global const int *block_table, const int table_offset, const int block_tokens,
                           const int start, __global float *out, const int out_offset)
{
    const int d = get_global_id(0);
    const int j = get_global_id(1);
    if (d >= ROW)
        return;
    const int token = start + j;
    const size_t row = (size_t)block_table[table_offset + token / block_tokens] * block_tokens + token % block_tokens;
    out[out_offset + (size_t)j * ROW + d] = LOAD(cache + row * CACHE_ROW_UNITS, d);
}
