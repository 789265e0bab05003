/* Decoupled RoPE (docs/MLA.md section 3) on the rope part of every query head and on the shared k^R.
 *
 *   q     : [T, q_row_stride] floats from q_offset; head h of token t has its rope dims at
 *           q[t*q_row_stride + h*q_head_stride + q_rope_offset + 0 .. DR-1]
 *   kv    : [T, kv_row_stride] floats from kv_offset; k^R at kv[t*kv_row_stride + kv_rope_offset + ..]
 *   positions : [T] the table row of each token: its absolute position (for LongRoPE's long
 *           factors, the position plus the number of short rows before them)
 *   table : [rows, DR/2] float2 (A*cos, A*sin) of position*inv_freq[i], made on the host in
 *           double (the rope type's inv_freq and amplitude A folded in), so no angle is rounded
 *           to float.
 *
 * Work-item (i, h, t) rotates pair i of head h of token t; h == num_heads means k^R.
 * Pairing: interleaved (2i, 2i+1), or with HALF_SPLIT defined, (i, i + DR/2).
 *
 * With QSCALE defined, qscale [T] multiplies every value of token t's query heads (its nope dims
 * [0, q_rope_offset) and its rotated pair) after the rotation; k^R is left unscaled (Mistral 4's
 * per-position query scale). Work-item i scales nope dims i, i + DR/2, i + DR, ... */

__kernel void rope(__global float *q, const int q_offset, const int q_row_stride, const int q_head_stride,
                   const int q_rope_offset, const int num_heads,
                   __global float *kv, const int kv_offset, const int kv_row_stride, const int kv_rope_offset,
                   __global const int *positions, __global const float2 *table
#ifdef QSCALE
                   , __global const float *qscale
#endif
                   )
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
    float y0 = x0 * cs.x - x1 * cs.y;
    float y1 = x0 * cs.y + x1 * cs.x;
#ifdef QSCALE
    if (h < num_heads) {
        const float s = qscale[t];
        y0 *= s;
        y1 *= s;
        __global float *head = x - q_rope_offset;
        for (int j = i; j < q_rope_offset; j += DR / 2)
            head[j] *= s;
    }
#endif
    x[a] = y0;
    x[b] = y1;
}
