/* Decoupled RoPE (MLA.md section 3) on the rope part of every query head and on the shared k^R.
 *
 *   q     : [T, q_row_stride] floats from q_offset; head h of token t has its rope dims at
 *           q[t*q_row_stride + h*q_head_stride + q_rope_offset + 0 .. DR-1]
 *   kv    : [T, kv_row_stride] floats from kv_offset; k^R at kv[t*kv_row_stride + kv_rope_offset + ..]
 *   positions : [T] absolute position of each token
 *   table : [max_position, DR/2] float2 (A*cos, A*sin) of position*inv_freq[i], made on the host
 *           in double (YaRN's inv_freq and amplitude A folded in), so no angle is rounded to float.
 *
 * Work-item (i, h, t) rotates pair i of head h of token t; h == num_heads means k^R.
 * Pairing: interleaved (2i, 2i+1), or with HALF_SPLIT defined, (i, i + DR/2). */
#ifndef DR
#define DR 64
#endif

__kernel void rope(__global float *q, const int q_offset, const int q_row_stride, const int q_head_stride,
                   const int q_rope_offset, const int num_heads,
                   __global float *kv, const int kv_offset, const int kv_row_stride, const int kv_rope_offset,
                   __global const int *positions, __global const float2 *table)
{
    const int i = get_global_id(0);
    const int h = get_global_id(1);
    const int t = get_global_id(2);
    if (i >= DR / 2)
        return;
    __global float *x = h < num_heads
        ? q + q_offset + (size_t)t * q_row_stride + (size_t)h * q_head_stride + q_rope_offset
        : kv + kv_offset + (size_t)t * kv_row_stride + kv_rope_offset;
#ifdef HALF_SPLIT
    const int a = i, b = i + DR / 2;
#else
    const int a = 2 * i, b = 2 * i + 1;
#endif
    const float2 cs = table[(size_t)positions[t] * (DR / 2) + i];
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * cs.x - x1 * cs.y;
    x[b] = x0 * cs.y + x1 * cs.x;
}
