/* Merges the split-KV partial results of attn_latent.cl by their log-sum-exp.
 *
 *   part_out [T, S, H, RKV], part_lse [T, S, H]: each split's normalised output and lse
 *   out [T, H, RKV] from out_offset, lse [T, H] from lse_offset:
 *     M = max_s lse_s,  w_s = exp(lse_s - M),  out = sum_s w_s out_s / sum_s w_s,
 *     lse = M + log(sum_s w_s)      (all splits empty: out 0, lse -inf)
 *
 * attn_combine: work-item (d, h, t) produces out[t, h, d]; item d == 0 also writes lse[t, h].
 * attn_combine_rows (below, for CPUs): work-item (h, t) produces the row out[t, h, :] and lse[t, h]. */

__kernel void attn_combine(__global const float *part_out, __global const float *part_lse, const int num_splits,
                           const int num_heads, __global float *out, const int out_offset, __global float *lse,
                           const int lse_offset)
{
    const int d = get_global_id(0);
    const int h = get_global_id(1);
    const int t = get_global_id(2);
    if (d >= RKV)
        return;
    const size_t first = (size_t)t * num_splits * num_heads + h; /* (t, s=0, h) */
    float m = -INFINITY;
    for (int s = 0; s < num_splits; s++)
        m = fmax(m, part_lse[first + (size_t)s * num_heads]);
    const size_t at = ((size_t)t * num_heads + h) * RKV + d;
    if (m == -INFINITY) {
        out[out_offset + at] = 0.0f;
        if (d == 0)
            lse[lse_offset + (size_t)t * num_heads + h] = -INFINITY;
        return;
    }
    float sum = 0.0f, acc = 0.0f;
    for (int s = 0; s < num_splits; s++) {
        const size_t row = first + (size_t)s * num_heads;
        const float w = exp(part_lse[row] - m);
        sum += w;
        acc = fma(w, part_out[row * RKV + d], acc);
    }
    out[out_offset + at] = acc / sum;
    if (d == 0)
        lse[lse_offset + (size_t)t * num_heads + h] = m + log(sum);
}

/* attn_combine_rows: the same merge for CPU devices, one work-item per (h, t) walking the row in
 * float8 steps. attn_combine computes every split's weight once per output value (RKV times over),
 * which on a CPU is most of the merge's time (docs/perf-log.md). Here each weight is computed once
 * per row: out = sum_s (w_s / sum) out_s. */
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void attn_combine_rows(__global const float *part_out, __global const float *part_lse, const int num_splits,
                       const int num_heads, __global float *out, const int out_offset, __global float *lse,
                       const int lse_offset)
{
    const int h = get_global_id(0);
    const int t = get_global_id(1);
    const size_t first = (size_t)t * num_splits * num_heads + h; /* (t, s=0, h) */
    __global float *dst = out + out_offset + ((size_t)t * num_heads + h) * RKV;
    float m = -INFINITY;
    for (int s = 0; s < num_splits; s++)
        m = fmax(m, part_lse[first + (size_t)s * num_heads]);
    for (int d = 0; d < RKV; d++)
        dst[d] = 0.0f;
    if (m == -INFINITY) {
        lse[lse_offset + (size_t)t * num_heads + h] = -INFINITY;
        return;
    }
    float sum = 0.0f;
    for (int s = 0; s < num_splits; s++)
        sum += exp(part_lse[first + (size_t)s * num_heads] - m);
    const float inv = 1.0f / sum;
    for (int s = 0; s < num_splits; s++) {
        const size_t row = first + (size_t)s * num_heads;
        const float w = exp(part_lse[row] - m) * inv;
        if (w == 0.0f)
            continue; /* an empty split, or one outweighed past float range */
        __global const float *src = part_out + row * RKV;
        int d = 0;
        for (; d + 8 <= RKV; d += 8)
            vstore8(fma((float8)(w), vload8(0, src + d), vload8(0, dst + d)), 0, dst + d);
        for (; d < RKV; d++)
            dst[d] = fma(w, src[d], dst[d]);
    }
    lse[lse_offset + (size_t)t * num_heads + h] = m + log(sum);
}
