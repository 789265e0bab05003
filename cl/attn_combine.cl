/* Merges the split-KV partial results of attn_latent.cl by their log-sum-exp.
 *
 *   part_out [T, S, H, RKV], part_lse [T, S, H]: each split's normalised output and lse
 *   out [T, H, RKV] from out_offset, lse [T, H] from lse_offset:
 *     M = max_s lse_s,  w_s = exp(lse_s - M),  out = sum_s w_s out_s / sum_s w_s,
 *     lse = M + log(sum_s w_s)      (all splits empty: out 0, lse -inf)
 *
 * Work-item (d, h, t) produces out[t, h, d]; item d == 0 also writes lse[t, h]. */
#ifndef RKV
#define RKV 512
#endif

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
