/* Latent (absorbed) attention over the paged cache (MLA.md section 5), FlashMLA-style.
 *
 * For query token t and head h, over keys j < token_ctx_len[t] of its sequence:
 *   score_j = scale * (q_latent[t,h,:] . c^KV_j + q_rope[t,h,:] . k^R_j)
 *   out[t,h,:] = sum_j softmax(score)_j c^KV_j        lse[t,h] = log sum_j exp(score_j)
 * The cache row [c^KV_j ; k^R_j] (ROW = RKV + DR values) is one key of width ROW whose first RKV
 * values are also the value: multi-query attention with one shared head.
 *
 * Work-group (head group g, split s, token t): NT work-items, HG heads (h0 = g*HG ...), keys
 * [s*split_tokens, min((s+1)*split_tokens, ctx)). Each cache row is read once per head group.
 *
 *   work-item lid owns row elements d = lid, lid+NT, lid+2NT, ... (DPI of them: coalesced loads)
 *   per tile of KT keys:
 *     1. partial[lid][k][h] = sum over its d of q[h][d] * c[k][d]         (private, then local)
 *     2. item col = k*HG+h adds the NT partials of its column -> score     (local)
 *     3. items lid < HG update the running max / sum of head lid and turn
 *        the tile's scores into weights exp(score - max)                   (local)
 *     4. every item rescales and accumulates acc[h][d] += w[k][h] * c[k][d] for its d
 *
 * Output rows are per split: out [T, num_splits, H, RKV], lse [T, num_splits, H]; with one split
 * that is the final [T, H, RKV] / [T, H], else attn_combine.cl merges the splits by their lse.
 * Local memory: NT*KT*HG + 2*KT*HG + 3*HG floats. */
#ifndef RKV
#define RKV 512
#endif
#ifndef DR
#define DR 64
#endif
#ifndef NT
#define NT 64
#endif
#ifndef HG
#define HG 8
#endif
#ifndef KT
#define KT 8
#endif
#define ROW (RKV + DR)
#define DPI ((ROW + NT - 1) / NT)
#define COLS (KT * HG)

#ifdef CACHE_F16
#define CACHE_T half
#define LOAD(p, i) vload_half((i), (p))
#else
#define CACHE_T float
#define LOAD(p, i) ((p)[i])
#endif

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void attn_latent(__global const float *q_latent, const int q_latent_offset, const int q_latent_token_stride,
                 const int q_latent_head_stride,
                 __global const float *q_rope, const int q_rope_offset, const int q_rope_token_stride,
                 const int q_rope_head_stride,
                 __global const CACHE_T *cache,
                 __global const int *block_table, const int max_blocks_per_seq, const int block_tokens,
                 __global const int *token_seq, __global const int *token_ctx_len,
                 const int num_heads, const int num_splits, const int split_tokens, const float scale,
                 __global float *out, const int out_offset, __global float *lse, const int lse_offset)
{
    __local float partial[NT * COLS]; /* [NT][KT][HG] */
    __local float weight[COLS];       /* [KT][HG]: scores, then exp(score - running max) */
    __local float rescale[HG];
    __local float run_max[HG];
    __local float run_sum[HG];

    const int lid = get_local_id(0);
    const int h0 = get_group_id(0) * HG;
    const int split = get_global_id(1);
    const int t = get_global_id(2);
    const int ctx = token_ctx_len[t];
    const int k_begin = split * split_tokens;
    const int k_end = min(ctx, k_begin + split_tokens);
    __global const int *table = block_table + (size_t)token_seq[t] * max_blocks_per_seq;

    float q[HG][DPI];
    float acc[HG][DPI];
    for (int h = 0; h < HG; h++) {
        const int head = h0 + h;
        for (int k = 0; k < DPI; k++) {
            const int d = lid + k * NT;
            float v = 0.0f;
            if (head < num_heads && d < ROW)
                v = d < RKV ? q_latent[q_latent_offset + (size_t)t * q_latent_token_stride + (size_t)head * q_latent_head_stride + d]
                            : q_rope[q_rope_offset + (size_t)t * q_rope_token_stride + (size_t)head * q_rope_head_stride + (d - RKV)];
            q[h][k] = v;
            acc[h][k] = 0.0f;
        }
    }
    if (lid < HG) {
        run_max[lid] = -INFINITY;
        run_sum[lid] = 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int j0 = k_begin; j0 < k_end; j0 += KT) {
        float c[KT][DPI];
        for (int kk = 0; kk < KT; kk++) {
            const int j = j0 + kk;
            size_t base = 0;
            if (j < k_end)
                base = ((size_t)table[j / block_tokens] * block_tokens + j % block_tokens) * ROW;
            for (int k = 0; k < DPI; k++) {
                const int d = lid + k * NT;
                c[kk][k] = (j < k_end && d < ROW) ? LOAD(cache, base + d) : 0.0f;
            }
        }
        /* 1. partial dot products over this item's elements */
        for (int kk = 0; kk < KT; kk++)
            for (int h = 0; h < HG; h++) {
                float s = 0.0f;
                for (int k = 0; k < DPI; k++)
                    s = fma(q[h][k], c[kk][k], s);
                partial[lid * COLS + kk * HG + h] = s;
            }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* 2. one column per item: the full score of (key kk, head h) */
        for (int col = lid; col < COLS; col += NT) {
            float s = 0.0f;
            for (int n = 0; n < NT; n++)
                s += partial[n * COLS + col];
            weight[col] = (j0 + col / HG < k_end) ? s * scale : -INFINITY;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* 3. online softmax, one item per head */
        if (lid < HG) {
            const float m_old = run_max[lid];
            float m_new = m_old;
            for (int kk = 0; kk < KT; kk++)
                m_new = fmax(m_new, weight[kk * HG + lid]);
            const float alpha = exp(m_old - m_new); /* 0 on the first tile (m_old = -inf) */
            float sum = run_sum[lid] * alpha;
            for (int kk = 0; kk < KT; kk++) {
                const float p = exp(weight[kk * HG + lid] - m_new);
                weight[kk * HG + lid] = p;
                sum += p;
            }
            run_max[lid] = m_new;
            run_sum[lid] = sum;
            rescale[lid] = alpha;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* 4. accumulate the weighted latent rows */
        for (int h = 0; h < HG; h++) {
            const float alpha = rescale[h];
            for (int k = 0; k < DPI; k++) {
                float a = acc[h][k] * alpha;
                for (int kk = 0; kk < KT; kk++)
                    a = fma(weight[kk * HG + h], c[kk][k], a);
                acc[h][k] = a;
            }
        }
        /* The next tile writes partial[] (read in step 2, before the step-2 barrier) and weight[]
           (after its own step-1 barrier, which every item reaches only after step 4): no race. */
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    const size_t row0 = (size_t)t * num_splits + split;
    for (int h = 0; h < HG; h++) {
        const int head = h0 + h;
        if (head >= num_heads)
            break;
        const float l = run_sum[h];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int k = 0; k < DPI; k++) {
            const int d = lid + k * NT;
            if (d < RKV)
                out[out_offset + (row0 * num_heads + head) * RKV + d] = acc[h][k] * inv;
        }
        if (lid == 0)
            lse[lse_offset + row0 * num_heads + head] = l > 0.0f ? run_max[h] + log(l) : -INFINITY;
    }
}
