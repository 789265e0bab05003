/* RMSNorm of matrix rows, in place (docs/MLA.md section 2: the latent norms of c^Q and c^KV).
 *
 *   x : [rows, row_stride] floats starting at x_offset; the first `cols` of each row are
 *       normalised, the rest (k^R behind c^KV in the kv_a output) are left alone:
 *       x[r, i] = w[i] * x[r, i] / sqrt(mean_{i < cols} x[r, i]^2 + eps)
 *   w : [cols]
 *
 * One work-group of WG work-items per row: each sums the squares of a strided slice of the
 * columns, a tree in local memory adds the WG partial sums, then all scale their slice. */
#ifndef WG
#define WG 64
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void rmsnorm(__global float *x, const int x_offset, const int row_stride, const int cols,
             __global const float *w, const float eps)
{
    __local float partial[WG];
    const int lid = get_local_id(0);
    __global float *row = x + x_offset + (size_t)get_group_id(0) * row_stride;

    float sum = 0.0f;
    for (int i = lid; i < cols; i += WG) {
        const float v = row[i];
        sum = fma(v, v, sum);
    }
    partial[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = WG / 2; width > 0; width >>= 1) {
        if (lid < width)
            partial[lid] += partial[lid + width];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float inv_rms = 1.0f / sqrt(partial[0] / (float)cols + eps);
    for (int i = lid; i < cols; i += WG)
        row[i] = w[i] * (row[i] * inv_rms);
}
