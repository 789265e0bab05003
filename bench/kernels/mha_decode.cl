/* clmla-bench's own kernels for the attention MLA is compared against (not part of the library).
 *
 * mha_decode: one query token per sequence and head over a full per-head K/V cache, as standard
 * multi-head attention stores it, with an online softmax:
 *   score_j  = scale * q[b,h,:] . k_j            k_j = [k_nope_j (DN) ; k_rope_j (DR)]
 *   out[b,h] = sum_j softmax(score)_j v_j        v_j: DV values
 * The three operands come with their own strides (in elements), so the same kernel reads
 *   - the MHA baseline's cache, K [B, H, ctx, DQ] and V [B, H, ctx, DV] (k_rope = K + DN), and
 *   - the decompressed MLA path: k_nope and v up-projected per head from c^KV,
 *     [ctx, H, DN + DV] rows, and k_rope, the latent cache's shared DR values (head stride 0).
 *
 * Two shapes of it: mha_decode below (work-groups sharing a tile through local memory: GPUs) and
 * mha_decode_rows further down (one work-item per head and split, no barriers: CPUs), picked by
 * device type as the library picks its latent attention kernel.
 *
 * mha_decode: work-group (split s, head h, sequence b) of NT work-items walks keys
 * [s*split_tokens, min((s+1)*split_tokens, ctx)) in tiles of NT keys:
 *   1. work-item lid scores key t0+lid (one dot product of DQ values)          -> score[NT]
 *   2. every item takes the tile maximum and its own key's weight exp(s - max)  -> weight[NT]
 *   3. item lid owns output dims lid, lid+NT, ... and adds weight[k] * v_k[d] over the tile
 * Output per split: part_out [B, H, S, DV] normalised, part_lse [B, H, S]; mha_combine merges the
 * splits by their log-sum-exp. With one split part_out is already the final [B, H, DV]. */
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
#define NT 64
#endif
#define DQ (DN + DR)
#define DPI ((DV + NT - 1) / NT)

#ifdef KV_F16
#define KV_T half
#define LOAD(p, i) vload_half((i), (p))
#else
#define KV_T float
#define LOAD(p, i) ((p)[i])
#endif

/* The arguments of mha_decode and mha_decode_rows (the host sets them alike for either). */
#define MHA_DECODE_ARGS                                                                                        \
    __global const float *q, /* [B, H, DQ] */                                                                  \
    __global const KV_T *k_nope, const int kn_offset, const int kn_seq, const int kn_head, const int kn_token, \
    __global const KV_T *k_rope, const int kr_offset, const int kr_seq, const int kr_head, const int kr_token, \
    __global const KV_T *v, const int v_offset, const int v_seq, const int v_head, const int v_token,         \
    const int ctx_len, const int split_tokens, const float scale, const int b0,                               \
    __global float *part_out, /* [B, H, S, DV] */                                                              \
    __global float *part_lse  /* [B, H, S] */

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void mha_decode(MHA_DECODE_ARGS)
{
    const int lid = get_local_id(0);
    const int split = get_group_id(0), h = get_group_id(1), b = get_group_id(2);
    const int qb = b0 + b; /* query and output row: a launch may cover sequences b0, b0+1, ... */
    const int num_splits = get_num_groups(0), num_heads = get_num_groups(1);
    __local float q_local[DQ];
    __local float score[NT];
    __local float weight[NT];

    for (int i = lid; i < DQ; i += NT)
        q_local[i] = q[(qb * num_heads + h) * DQ + i] * scale;
    barrier(CLK_LOCAL_MEM_FENCE);

    __global const KV_T *kn = k_nope + kn_offset + b * kn_seq + h * kn_head;
    __global const KV_T *kr = k_rope + kr_offset + b * kr_seq + h * kr_head;
    __global const KV_T *vv = v + v_offset + b * v_seq + h * v_head;
    const int begin = split * split_tokens;
    const int end = min(begin + split_tokens, ctx_len);

    float acc[DPI];
    for (int i = 0; i < DPI; i++)
        acc[i] = 0.0f;
    float running_max = -INFINITY, running_sum = 0.0f;

    for (int t0 = begin; t0 < end; t0 += NT) {
        const int n = min(NT, end - t0);
        float s = -INFINITY;
        if (lid < n) {
            const int j = t0 + lid;
            float dot = 0.0f;
            for (int i = 0; i < DN; i++)
                dot += q_local[i] * LOAD(kn, j * kn_token + i);
            for (int i = 0; i < DR; i++)
                dot += q_local[DN + i] * LOAD(kr, j * kr_token + i);
            s = dot;
        }
        score[lid] = s;
        barrier(CLK_LOCAL_MEM_FENCE);

        float tile_max = running_max;
        for (int k = 0; k < n; k++)
            tile_max = fmax(tile_max, score[k]);
        weight[lid] = lid < n ? exp(s - tile_max) : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);

        const float correction = exp(running_max - tile_max); /* 0 on the first tile */
        running_sum *= correction;
        for (int i = 0; i < DPI; i++)
            acc[i] *= correction;
        for (int k = 0; k < n; k++) {
            const float w = weight[k];
            running_sum += w;
            __global const KV_T *row = vv + (t0 + k) * v_token;
            for (int i = 0; i < DPI; i++) {
                const int d = lid + i * NT;
                if (DV % NT == 0 || d < DV)
                    acc[i] += w * LOAD(row, d);
            }
        }
        running_max = tile_max;
        barrier(CLK_LOCAL_MEM_FENCE); /* score and weight are rewritten by the next tile */
    }

    const int out_row = (qb * num_heads + h) * num_splits + split;
    const float inv = running_sum > 0.0f ? 1.0f / running_sum : 0.0f;
    for (int i = 0; i < DPI; i++) {
        const int d = lid + i * NT;
        if (DV % NT == 0 || d < DV)
            part_out[out_row * DV + d] = acc[i] * inv;
    }
    if (lid == 0)
        part_lse[out_row] = running_sum > 0.0f ? running_max + log(running_sum) : -INFINITY;
}

/* mha_decode_rows: the same attention shaped for CPU devices, where a work-group's barriers
 * become loops over its work-items: one work-item per (split, head, sequence), no barriers,
 * global size (S, H, B), work-groups of one item. The item walks its keys in tiles of KTC: scores
 * as float8 dot products against its private, pre-scaled query, the online softmax per tile,
 * then acc[DV] += weight * v for the tile's rows, eight values at a time. Each K and V row is read
 * once, in order: a stream per item. Outputs as mha_decode. */
#ifndef KTC
#define KTC 8
#endif
#define DN8 (DN / 8 * 8)
#define DR8 (DR / 8 * 8)
#define DV8 (DV / 8 * 8)
#ifdef KV_F16
#define LOAD8(p) vload_half8(0, (p))
#else
#define LOAD8(p) vload8(0, (p))
#endif

static float dot_row(const float *q, __global const KV_T *row, const int n, const int n8)
{
    float8 acc8 = (float8)(0.0f);
    for (int i = 0; i < n8; i += 8)
        acc8 = fma(vload8(0, q + i), LOAD8(row + i), acc8);
    float acc = (acc8.s0 + acc8.s1) + (acc8.s2 + acc8.s3) + (acc8.s4 + acc8.s5) + (acc8.s6 + acc8.s7);
    for (int i = n8; i < n; i++)
        acc += q[i] * LOAD(row, i);
    return acc;
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void mha_decode_rows(MHA_DECODE_ARGS)
{
    const int split = get_global_id(0), h = get_global_id(1), b = get_global_id(2);
    const int qb = b0 + b;
    const int num_splits = get_global_size(0), num_heads = get_global_size(1);
    float q_private[DQ];
    float acc[DV];
    float weight[KTC];
    for (int i = 0; i < DQ; i++)
        q_private[i] = q[(qb * num_heads + h) * DQ + i] * scale;
    for (int d = 0; d < DV; d++)
        acc[d] = 0.0f;

    __global const KV_T *kn = k_nope + kn_offset + b * kn_seq + h * kn_head;
    __global const KV_T *kr = k_rope + kr_offset + b * kr_seq + h * kr_head;
    __global const KV_T *vv = v + v_offset + b * v_seq + h * v_head;
    const int begin = split * split_tokens;
    const int end = min(begin + split_tokens, ctx_len);
    float running_max = -INFINITY, running_sum = 0.0f;

    for (int t0 = begin; t0 < end; t0 += KTC) {
        const int n = min(KTC, end - t0);
        float tile_max = running_max;
        for (int k = 0; k < n; k++) {
            const int j = t0 + k;
            weight[k] = dot_row(q_private, kn + j * kn_token, DN, DN8) + dot_row(q_private + DN, kr + j * kr_token, DR, DR8);
            tile_max = fmax(tile_max, weight[k]);
        }
        const float correction = exp(running_max - tile_max); /* 0 on the first tile */
        running_sum *= correction;
        for (int k = 0; k < n; k++) {
            weight[k] = exp(weight[k] - tile_max);
            running_sum += weight[k];
        }
        for (int d = 0; d < DV8; d += 8) {
            float8 a = vload8(0, acc + d) * correction;
            for (int k = 0; k < n; k++)
                a = fma((float8)(weight[k]), LOAD8(vv + (t0 + k) * v_token + d), a);
            vstore8(a, 0, acc + d);
        }
        for (int d = DV8; d < DV; d++) {
            float a = acc[d] * correction;
            for (int k = 0; k < n; k++)
                a += weight[k] * LOAD(vv, (t0 + k) * v_token + d);
            acc[d] = a;
        }
        running_max = tile_max;
    }

    const int out_row = (qb * num_heads + h) * num_splits + split;
    const float inv = running_sum > 0.0f ? 1.0f / running_sum : 0.0f;
    for (int d = 0; d < DV; d++)
        part_out[out_row * DV + d] = acc[d] * inv;
    part_lse[out_row] = running_sum > 0.0f ? running_max + log(running_sum) : -INFINITY;
}

/* Global size (DV, H, B): merges the S splits of one (sequence, head) into out [B, H, DV]. */
__kernel void mha_combine(__global const float *part_out, __global const float *part_lse, const int num_splits,
                          __global float *out)
{
    const int d = get_global_id(0), h = get_global_id(1), b = get_global_id(2);
    const int num_heads = get_global_size(1);
    const int row0 = (b * num_heads + h) * num_splits;
    float m = -INFINITY;
    for (int s = 0; s < num_splits; s++)
        m = fmax(m, part_lse[row0 + s]);
    float sum = 0.0f, acc = 0.0f;
    if (m > -INFINITY) {
        for (int s = 0; s < num_splits; s++) {
            const float w = exp(part_lse[row0 + s] - m);
            sum += w;
            acc += w * part_out[(row0 + s) * DV + d];
        }
    }
    out[(b * num_heads + h) * DV + d] = sum > 0.0f ? acc / sum : 0.0f;
}

/* The decompressed path's f16 latent cache as float32 for the SGEMM up-projection: n values
   from src + src_offset. */
__kernel void half_to_float(__global const half *src, const int src_offset, __global float *dst, const int n)
{
    for (int i = get_global_id(0); i < n; i += get_global_size(0))
        dst[i] = vload_half(src_offset + i, src);
}
