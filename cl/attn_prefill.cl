/* Decompressed causal attention for a prefill chunk (MLA.md section 5, second form).
 *
 * The chunk's n_queries tokens sit at positions prefix .. prefix+n_queries-1 of one sequence;
 * the keys are its tokens 0 .. prefix+n_queries-1 (cached prefix and the chunk itself):
 *   q      : row i (query i) at q[q_offset + i*q_row_stride]: per head h, DN nope then DR rope values
 *   kv_up  : row j at kv_up[kv_up_offset + j*kv_up_row_stride]: per head h, k^C (DN) then v^C (DV)
 *            (the up-projection W^UK / W^UV of the cached c^KV)
 *   k_rope : row j at k_rope[k_rope_offset + j*k_rope_row_stride]: the shared k^R (DR)
 *   out    : row i at out[out_offset + i*out_row_stride]: per head h, DV values
 * Query i attends to keys j <= prefix + i.
 *
 * Work-group (query tile, head): NT work-items, one query each. Tiles of KT keys are staged in
 * local memory (KT * (DN + DR + DV) floats) and every item runs an online softmax over them. */
#ifndef DN
#define DN 128
#endif
#ifndef DR
#define DR 64
#endif
#ifndef DV
#define DV 128
#endif
#ifndef NT
#define NT 32
#endif
#ifndef KT
#define KT 16
#endif
#define DQ (DN + DR)

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void attn_prefill(__global const float *q, const int q_offset, const int q_row_stride,
                  __global const float *kv_up, const int kv_up_offset, const int kv_up_row_stride,
                  __global const float *k_rope, const int k_rope_offset, const int k_rope_row_stride,
                  const int n_queries, const int prefix, const float scale,
                  __global float *out, const int out_offset, const int out_row_stride)
{
    __local float key[KT][DQ];
    __local float value[KT][DV];

    const int lid = get_local_id(0);
    const int i = get_global_id(0);
    const int h = get_global_id(1);
    const bool active = i < n_queries;
    const int last_query = min((int)(get_group_id(0) + 1) * NT, n_queries) - 1;
    const int key_end = prefix + last_query + 1; /* keys the tile's last query needs */
    const int my_end = prefix + i + 1;

    float qv[DQ];
    float acc[DV];
    for (int d = 0; d < DQ; d++)
        qv[d] = active ? q[q_offset + (size_t)i * q_row_stride + (size_t)h * DQ + d] : 0.0f;
    for (int d = 0; d < DV; d++)
        acc[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;

    for (int j0 = 0; j0 < key_end; j0 += KT) {
        for (int idx = lid; idx < KT * DQ; idx += NT) {
            const int kk = idx / DQ, d = idx % DQ, j = j0 + kk;
            float v = 0.0f;
            if (j < key_end)
                v = d < DN ? kv_up[kv_up_offset + (size_t)j * kv_up_row_stride + (size_t)h * (DN + DV) + d]
                           : k_rope[k_rope_offset + (size_t)j * k_rope_row_stride + (d - DN)];
            key[kk][d] = v;
        }
        for (int idx = lid; idx < KT * DV; idx += NT) {
            const int kk = idx / DV, d = idx % DV, j = j0 + kk;
            value[kk][d] = j < key_end ? kv_up[kv_up_offset + (size_t)j * kv_up_row_stride + (size_t)h * (DN + DV) + DN + d]
                                       : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (active && j0 < my_end) {
            float s[KT];
            float m_tile = -INFINITY;
            for (int kk = 0; kk < KT; kk++) {
                float dot = 0.0f;
                for (int d = 0; d < DQ; d++)
                    dot = fma(qv[d], key[kk][d], dot);
                s[kk] = j0 + kk < my_end ? dot * scale : -INFINITY;
                m_tile = fmax(m_tile, s[kk]);
            }
            const float m_new = fmax(m, m_tile);
            const float alpha = exp(m - m_new);
            l *= alpha;
            for (int d = 0; d < DV; d++)
                acc[d] *= alpha;
            for (int kk = 0; kk < KT; kk++) {
                const float p = exp(s[kk] - m_new);
                l += p;
                for (int d = 0; d < DV; d++)
                    acc[d] = fma(p, value[kk][d], acc[d]);
            }
            m = m_new;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (active) {
        const float inv = 1.0f / l;
        for (int d = 0; d < DV; d++)
            out[out_offset + (size_t)i * out_row_stride + (size_t)h * DV + d] = acc[d] * inv;
    }
}
