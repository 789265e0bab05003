/* Adds a bias vector to the rows of a matrix, in place (the optional biases of q_a_proj,
 * kv_a_proj_with_mqa and o_proj when a checkpoint has "attention_bias": true).
 *
 *   x    : [rows, row_stride] floats from x_offset; x[r, i] += bias[i] for i < cols
 *   bias : [cols]
 *
 * Work-item (i, r) adds column i of row r. */
__kernel void add_bias(__global float *x, const int x_offset, const int row_stride, const int cols,
                       __global const float *bias)
{
    const int i = get_global_id(0);
    const int r = get_global_id(1);
    if (i < cols)
        x[x_offset + (size_t)r * row_stride + i] += bias[i];
}
