/* Decompressed causal attention for a prefill chunk (docs/MLA.md section 5, second form).
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
 * local memory (KT * (DN + DR + DV) floats) and every item runs an online softmax over them.
 *
 * With -D SPARSE (DeepSeek Sparse Attention), query i attends only to the positions of its index
 * list, indices[indices_offset + i*topk + e], e < topk, in ascending order and -1 padded (as the
 * indexer's top-k writes them), and among those only to keys j <= prefix + i: each query walks its
 * list beside the keys. Both kernels take the same three arguments after the others. */
#ifndef DN
#define DN 128
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

/* The arguments every prefill kernel takes, in order, and the index lists the sparse ones take after
   them. */
#define PREFILL_PARAMS                                                                                     \
    __global const float *q, const int q_offset, const int q_row_stride, __global const float *kv_up,       \
        const int kv_up_offset, const int kv_up_row_stride, __global const float *k_rope,                   \
        const int k_rope_offset, const int k_rope_row_stride, const int n_queries, const int prefix,        \
        const float scale, __global float *out, const int out_offset, const int out_row_stride
#ifdef SPARSE
#define PREFILL_SPARSE_PARAMS , __global const int *indices, const int indices_offset, const int topk
#else
#define PREFILL_SPARSE_PARAMS
#endif

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void attn_prefill(PREFILL_PARAMS PREFILL_SPARSE_PARAMS)
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
#ifdef SPARSE
    __global const int *list = indices + indices_offset + (size_t)(active ? i : 0) * topk;
    int at = 0; /* the first entry of the list not below the tile */
#endif

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
            uint seen = 0u; /* SPARSE: the tile's keys on the list, bit kk */
#ifdef SPARSE
            while (at < topk && list[at] >= 0 && list[at] < j0)
                at++;
            for (int e = at; e < topk && list[e] >= 0 && list[e] < j0 + KT; e++)
                seen |= 1u << (list[e] - j0);
#else
            seen = ~0u;
#endif
            for (int kk = 0; kk < KT; kk++) {
                float dot = 0.0f;
                for (int d = 0; d < DQ; d++)
                    dot = fma(qv[d], key[kk][d], dot);
                s[kk] = j0 + kk < my_end && ((seen >> kk) & 1u) ? dot * scale : -INFINITY;
                m_tile = fmax(m_tile, s[kk]);
            }
            const float m_new = fmax(m, m_tile);
            /* -inf only while no key so far was on the query's list (SPARSE): nothing to rescale */
            const float alpha = m_new == -INFINITY ? 1.0f : exp(m - m_new);
            l *= alpha;
            for (int d = 0; d < DV; d++)
                acc[d] *= alpha;
            for (int kk = 0; kk < KT; kk++) {
                if (j0 + kk >= my_end)
                    break; /* skipped, not weighted 0: 0 * a later token's NaN would be NaN */
                if (!((seen >> kk) & 1u))
                    continue; /* SPARSE: not on the list, skipped likewise */
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

/* ---- attn_prefill_tiled: the same attention in tiles for GPUs (experimental) --------------------
 *
 * Work-group (block of BQ queries, head) of NT = (BQ/2) * (BK/KPI) work-items. attn_prefill gives each
 * item one query and its DQ + DV floats of state, so a chunk has few work-groups and its items spill;
 * here the block's queries (scaled) sit in local memory and each tile of BK keys is one small
 * matrix product per step:
 *   A. scores: item (query pair qg, key group kg) computes the 2 x KPI scores of queries 2qg, 2qg+1
 *      with keys kg + NKG*kk (kk < KPI, NKG = BK/KPI; KPI 4, 2 or 1: fewer keys an item make more
 *      items share the same local memory), dot products in float4 steps over the key tile,
 *      which is staged in chunks of KC dimensions (rows KS = KC + 4 floats apart, so that the NKG
 *      items of a query pair read different banks) -> ps[q][k], -inf past each query's position;
 *   B. online softmax: item q < BQ owns row q: the tile's maximum, the rescale alpha of its running
 *      sums, the weights exp(s - max) in place; meanwhile every item stages the tile's values;
 *   C. values: item (query group of QC, float4 of DV) for (BQ/QC) * (DV/4) such pairs, OPI per item
 *      (QC 4, or 2 where quads would leave items idle):
 *      acc = alpha acc + sum_k w[q][k] v[k], keys past a query's position skipped (not weighted 0:
 *      0 times a later token's NaN would be NaN).
 * Selected by the latent tuning's prefill_tiled (on by default where work-group kernels run), its
 * tiles by prefill_queries, prefill_keys, prefill_chunk and prefill_item_keys (KPI). No SPARSE form:
 * steps that select keys keep attn_prefill. */
#ifndef BQ
#define BQ 32
#endif
#ifndef BK
#define BK 32
#endif
#ifndef KC
#define KC 64
#endif
#ifndef KPI
#define KPI 4
#endif
#if defined(TILED) && (BQ % 4 || BK % 4 || KC % 4 || DV % 4)
#error "attn_prefill_tiled: BQ, BK, KC and DV must be multiples of 4"
#endif
#if defined(TILED) && BK < 8
#error "attn_prefill_tiled: BK must be at least 8 (an item per query row in step B)"
#endif
#if defined(TILED) && KPI != 1 && KPI != 2 && KPI != 4
#error "attn_prefill_tiled: KPI must be 1, 2 or 4"
#endif
#define NKG (BK / KPI)                    /* key groups: items per query pair in step A */
#define TNT ((BQ / 2) * NKG)              /* work-items */
#define DQP ((DQ + 3) / 4 * 4)            /* a query row padded to whole float4s */
#define QS4 (DQP / 4 + 1)                 /* float4s between query rows in local memory */
#define KS4 (KC / 4 + 1)                  /* float4s between key rows of a staged chunk */
#define DV4 (DV / 4)
#define KV4 (BK * KS4 > BK * DV4 ? BK * KS4 : BK * DV4) /* a key chunk or the value tile */
#if (BQ / 4) * DV4 >= TNT
#define QC 4                              /* queries of an item in step C */
#else
#define QC 2
#endif
#define PV_GROUPS ((BQ / QC) * DV4)
#define OPI ((PV_GROUPS + TNT - 1) / TNT) /* (query group, value float4) pairs per item */
#define PS (BK + 1)                       /* floats between rows of the weights */

#ifdef TILED
__kernel __attribute__((reqd_work_group_size(TNT, 1, 1)))
void attn_prefill_tiled(PREFILL_PARAMS)
{
    __local float4 qs[BQ * QS4];
    __local float4 kv[KV4];
    __local float ps[BQ * PS];
    __local float alpha_l[BQ];
    __local float l_l[BQ];

    const int lid = get_local_id(0);
    const int q0 = get_group_id(0) * BQ;
    const int h = get_group_id(1);
    const int nq = min(BQ, n_queries - q0);  /* the block's queries */
    const int key_end = prefix + q0 + nq;     /* keys its last query sees */
    const int qg = lid / NKG, kg = lid % NKG; /* step A */
    __local float *qsf = (__local float *)qs;
    __local float *kvf = (__local float *)kv;

    for (int idx = lid; idx < BQ * DQP; idx += TNT) {
        const int r = idx / DQP, d = idx % DQP;
        qsf[r * QS4 * 4 + d] = r < nq && d < DQ ? q[q_offset + (size_t)(q0 + r) * q_row_stride + (size_t)h * DQ + d] * scale
                                                 : 0.0f;
    }
    float m_run = -INFINITY, l_run = 0.0f; /* row lid (items lid < BQ) */
    float4 acc[OPI][QC];
    for (int i = 0; i < OPI; i++)
        for (int r = 0; r < QC; r++)
            acc[i][r] = 0.0f;

    for (int j0 = 0; j0 < key_end; j0 += BK) {
        /* A. scores */
        float4 a[2][KPI];
        for (int r = 0; r < 2; r++)
            for (int kk = 0; kk < KPI; kk++)
                a[r][kk] = 0.0f;
        for (int c0 = 0; c0 < DQP; c0 += KC) {
            barrier(CLK_LOCAL_MEM_FENCE); /* the chunk (or the last tile's values) read by all */
            for (int idx = lid; idx < BK * KC; idx += TNT) {
                const int kk = idx / KC, d = idx % KC, j = j0 + kk, dd = c0 + d;
                float v = 0.0f;
                if (j < key_end && dd < DQ)
                    v = dd < DN ? kv_up[kv_up_offset + (size_t)j * kv_up_row_stride + (size_t)h * (DN + DV) + dd]
                                : k_rope[k_rope_offset + (size_t)j * k_rope_row_stride + (dd - DN)];
                kvf[kk * KS4 * 4 + d] = v;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            const int n4 = min(KC, DQP - c0) / 4;
            for (int d4 = 0; d4 < n4; d4++) {
                const float4 x0 = qs[(2 * qg) * QS4 + c0 / 4 + d4], x1 = qs[(2 * qg + 1) * QS4 + c0 / 4 + d4];
                #pragma unroll
                for (int kk = 0; kk < KPI; kk++) {
                    const float4 k4 = kv[(kg + NKG * kk) * KS4 + d4];
                    a[0][kk] = fma(x0, k4, a[0][kk]);
                    a[1][kk] = fma(x1, k4, a[1][kk]);
                }
            }
        }
        for (int r = 0; r < 2; r++) {
            const int qr = 2 * qg + r;
            for (int kk = 0; kk < KPI; kk++) {
                const int k = kg + NKG * kk;
                ps[qr * PS + k] = qr < nq && j0 + k <= prefix + q0 + qr
                                      ? a[r][kk].x + a[r][kk].y + a[r][kk].z + a[r][kk].w
                                      : -INFINITY;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* the scores written, the last key chunk read */

        /* B. row owners: softmax; everyone: the tile's values */
        if (lid < BQ) {
            float mt = -INFINITY;
            for (int k = 0; k < BK; k++)
                mt = fmax(mt, ps[lid * PS + k]);
            const float m_new = fmax(m_run, mt);
            /* -inf only while the row has seen no key (a query past the block's end) */
            const float alpha = m_new == -INFINITY ? 1.0f : exp(m_run - m_new);
            float sum = 0.0f;
            for (int k = 0; k < BK; k++) {
                const float sc = ps[lid * PS + k];
                const float w = sc == -INFINITY ? 0.0f : exp(sc - m_new);
                ps[lid * PS + k] = w;
                sum += w;
            }
            l_run = l_run * alpha + sum;
            m_run = m_new;
            alpha_l[lid] = alpha;
        }
        for (int idx = lid; idx < BK * DV; idx += TNT) {
            const int kk = idx / DV, d = idx % DV, j = j0 + kk;
            kvf[kk * DV + d] = j < key_end ? kv_up[kv_up_offset + (size_t)j * kv_up_row_stride + (size_t)h * (DN + DV) + DN + d]
                                           : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* C. values */
        #pragma unroll
        for (int i = 0; i < OPI; i++) {
            const int g = lid + i * TNT;
            if (PV_GROUPS % TNT == 0 || g < PV_GROUPS) {
                const int qq = g / DV4, v4 = g % DV4;
                int nv[QC]; /* keys of the tile each of the group's queries sees */
                for (int r = 0; r < QC; r++) {
                    const int qr = QC * qq + r;
                    acc[i][r] *= alpha_l[qr];
                    nv[r] = qr < nq ? clamp(prefix + q0 + qr - j0 + 1, 0, BK) : 0;
                }
                for (int k = 0; k < BK; k++) {
                    const float4 v = kv[k * DV4 + v4];
                    #pragma unroll
                    for (int r = 0; r < QC; r++)
                        if (k < nv[r])
                            acc[i][r] = fma((float4)(ps[(QC * qq + r) * PS + k]), v, acc[i][r]);
                }
            }
        }
        /* the next tile's first chunk waits at its barrier for this tile's readers */
    }
    if (lid < BQ)
        l_l[lid] = l_run;
    barrier(CLK_LOCAL_MEM_FENCE);
    #pragma unroll
    for (int i = 0; i < OPI; i++) {
        const int g = lid + i * TNT;
        if (PV_GROUPS % TNT == 0 || g < PV_GROUPS) {
            const int qq = g / DV4, v4 = g % DV4;
            for (int r = 0; r < QC; r++) {
                const int qr = QC * qq + r;
                if (qr < nq)
                    vstore4(acc[i][r] / l_l[qr], 0,
                            out + out_offset + (size_t)(q0 + qr) * out_row_stride + (size_t)h * DV + 4 * v4);
            }
        }
    }
}
#endif

/* ---- the same attention for CPU devices -------------------------------------------------------
 *
 * attn_prefill_rows: one work-item per (block of QBC consecutive queries, head), no barriers. It
 * walks the keys its last query needs in tiles of 8: copies the tile's keys [k^C ; k^R] and values
 * privately, computes the QBC x 8 scores two queries by four keys at a time in float8 registers
 * (in base 2: the queries are pre-scaled by log2(e)), stores them key-major, masks keys past each
 * query's position, runs the online softmax across 8 queries per vector (4 when QBC is not a
 * multiple of 8), and adds the weighted values two queries per pass. */
#ifndef QBC
#define QBC 16
#endif
#define KTC 8
/* queries per vector of the softmax: 8, or 4 when QBC is not a multiple of 8 */
#if QBC % 8 == 0
#define QW 8
#define floatQ float8
#define intQ int8
#define vloadQ vload8
#define vstoreQ vstore8
#define LANES (int8)(0, 1, 2, 3, 4, 5, 6, 7)
#define uintQ uint8
#define as_intQ as_int8
#elif QBC % 4 == 0
#define QW 4
#define floatQ float4
#define intQ int4
#define vloadQ vload4
#define vstoreQ vstore4
#define LANES (int4)(0, 1, 2, 3)
#define uintQ uint4
#define as_intQ as_int4
#else
#error "QBC must be a multiple of 4"
#endif
#define DQ8 (DQ / 8 * 8)
#define DV8 (DV / 8 * 8)

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void attn_prefill_rows(PREFILL_PARAMS PREFILL_SPARSE_PARAMS)
{
    const int i0 = get_global_id(0) * QBC;
    const int h = get_global_id(1);
    const int queries = min(QBC, n_queries - i0);
    const int key_end = prefix + i0 + queries; /* keys the block's last query needs */

    float qv[QBC][DQ]; /* pre-scaled by scale * log2(e): scores in base 2, weights exp2 */
    const float scale2 = scale * M_LOG2E_F;
    float acc[QBC][DV];
    float key[KTC][DQ];
    float value[KTC][DV];
    float p[KTC][QBC]; /* key-major: the softmax runs across QW queries per vector */
    float run_max[QBC], run_sum[QBC];
    for (int r = 0; r < QBC; r++) {
        const int i = i0 + min(r, queries - 1);
        for (int d = 0; d < DQ; d++)
            qv[r][d] = scale2 * q[q_offset + (size_t)i * q_row_stride + (size_t)h * DQ + d];
        for (int d = 0; d < DV; d++)
            acc[r][d] = 0.0f;
        run_max[r] = -INFINITY;
        run_sum[r] = 0.0f;
    }
#ifdef SPARSE
    int at[QBC]; /* per query, the first entry of its list not below the tile */
    for (int r = 0; r < QBC; r++)
        at[r] = 0;
#endif

    for (int j0 = 0; j0 < key_end; j0 += KTC) {
        const int nk = min(KTC, key_end - j0);
        /* the tile's keys on each query's list, bit kk (all of them without SPARSE) */
        uint seen[QBC];
        uint any = 0u;
        for (int r = 0; r < QBC; r++) {
#ifdef SPARSE
            __global const int *list = indices + indices_offset + (size_t)(i0 + min(r, queries - 1)) * topk;
            while (at[r] < topk && list[at[r]] >= 0 && list[at[r]] < j0)
                at[r]++;
            uint bits = 0u;
            for (int e = at[r]; e < topk && list[e] >= 0 && list[e] < j0 + KTC; e++)
                bits |= 1u << (list[e] - j0);
            seen[r] = r < queries ? bits : 0u;
#else
            seen[r] = 0xFFu;
#endif
            any |= seen[r];
        }
        if (any == 0u)
            continue; /* SPARSE: no query's list names a key of the tile */
#pragma unroll
        for (int kk = 0; kk < KTC; kk++) {
            const int j = j0 + min(kk, nk - 1);
            __global const float *kv = kv_up + kv_up_offset + (size_t)j * kv_up_row_stride + (size_t)h * (DN + DV);
            __global const float *kr = k_rope + k_rope_offset + (size_t)j * k_rope_row_stride;
            for (int d = 0; d < DN; d++)
                key[kk][d] = kv[d];
            for (int d = 0; d < DR; d++)
                key[kk][DN + d] = kr[d];
            for (int d = 0; d < DV; d++)
                value[kk][d] = kv[DN + d];
        }
        for (int r = 0; r < QBC; r += 2) {
#pragma unroll
            for (int kk = 0; kk < KTC; kk += 4) {
                float8 s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
                /* unrolled by 4, together with the vertical softmax below (docs/perf-log.md) */
#pragma unroll 4
                for (int d = 0; d < DQ8; d += 8) {
                    const float8 a = vload8(0, &qv[r][d]), b = vload8(0, &qv[r + 1][d]);
                    const float8 c0 = vload8(0, &key[kk][d]), c1 = vload8(0, &key[kk + 1][d]);
                    const float8 c2 = vload8(0, &key[kk + 2][d]), c3 = vload8(0, &key[kk + 3][d]);
                    s00 = fma(a, c0, s00); s01 = fma(a, c1, s01); s02 = fma(a, c2, s02); s03 = fma(a, c3, s03);
                    s10 = fma(b, c0, s10); s11 = fma(b, c1, s11); s12 = fma(b, c2, s12); s13 = fma(b, c3, s13);
                }
#define HSUM(v) (((v).s0 + (v).s1) + ((v).s2 + (v).s3) + ((v).s4 + (v).s5) + ((v).s6 + (v).s7))
                float r00 = HSUM(s00), r01 = HSUM(s01), r02 = HSUM(s02), r03 = HSUM(s03);
                float r10 = HSUM(s10), r11 = HSUM(s11), r12 = HSUM(s12), r13 = HSUM(s13);
#undef HSUM
                for (int d = DQ8; d < DQ; d++) {
                    r00 = fma(qv[r][d], key[kk][d], r00); r01 = fma(qv[r][d], key[kk + 1][d], r01);
                    r02 = fma(qv[r][d], key[kk + 2][d], r02); r03 = fma(qv[r][d], key[kk + 3][d], r03);
                    r10 = fma(qv[r + 1][d], key[kk][d], r10); r11 = fma(qv[r + 1][d], key[kk + 1][d], r11);
                    r12 = fma(qv[r + 1][d], key[kk + 2][d], r12); r13 = fma(qv[r + 1][d], key[kk + 3][d], r13);
                }
                p[kk][r] = r00; p[kk + 1][r] = r01; p[kk + 2][r] = r02; p[kk + 3][r] = r03;
                p[kk][r + 1] = r10; p[kk + 1][r + 1] = r11; p[kk + 2][r + 1] = r12; p[kk + 3][r + 1] = r13;
            }
        }
        /* Online softmax, QW queries per vector: a key's scores for them are one vector, so the
           maximum and the sum are vertical and one exp2 serves QW queries (per query it had been
           a vector exp of the tile, a scalar exp for the rescale and two horizontal reductions). */
        float alpha[QBC];
        for (int r0 = 0; r0 < QBC; r0 += QW) {
            /* query r sees keys j <= prefix + i0 + r, and only the tile's first nk */
            const intQ last = (intQ)(prefix + i0 + r0 - j0) + LANES; /* last visible key of the tile */
            floatQ sv[KTC];
            floatQ m_tile = (floatQ)(-INFINITY);
#ifdef SPARSE
            const uintQ bits = vloadQ(0, &seen[r0]);
#endif
#pragma unroll
            for (int kk = 0; kk < KTC; kk++) {
#ifdef SPARSE
                const intQ hidden = (intQ)(kk) > last || (intQ)(kk >= nk) || as_intQ(((bits >> (uint)kk) & 1u) == 0u);
#else
                const intQ hidden = (intQ)(kk) > last || (intQ)(kk >= nk);
#endif
                sv[kk] = select(vloadQ(0, &p[kk][r0]), (floatQ)(-INFINITY), hidden);
                m_tile = fmax(m_tile, sv[kk]);
            }
            const floatQ m_old = vloadQ(0, &run_max[r0]);
            const floatQ m = fmax(m_old, m_tile);
            /* m is -inf only while every score so far is -inf: nothing to rescale, weights 0 */
            const intQ none = isequal(m, (floatQ)(-INFINITY));
            const floatQ a = select(exp2(m_old - m), (floatQ)(1.0f), none);
            floatQ sum = (floatQ)(0.0f);
#pragma unroll
            for (int kk = 0; kk < KTC; kk++) {
                const floatQ w = select(exp2(sv[kk] - m), (floatQ)(0.0f), isequal(sv[kk], (floatQ)(-INFINITY)));
                vstoreQ(w, 0, &p[kk][r0]);
                sum += w;
            }
            vstoreQ(a, 0, &alpha[r0]);
            vstoreQ(vloadQ(0, &run_sum[r0]) * a + sum, 0, &run_sum[r0]);
            vstoreQ(m, 0, &run_max[r0]);
        }
        /* Keys a query must not see are skipped rather than weighted 0 (0 * a later token's NaN
           is NaN); only the tiles on the causal diagonal need the per-key test. */
#ifdef SPARSE
        const bool all_visible = false; /* the lists decide key by key */
#else
        const bool all_visible = nk == KTC && j0 + KTC <= prefix + i0 + 1;
#endif
        for (int r = 0; r < QBC; r += 2) {
            const float a0 = alpha[r], a1 = alpha[r + 1];
            if (all_visible) {
                for (int d = 0; d < DV8; d += 8) {
                    float8 x0 = vload8(0, &acc[r][d]) * a0, x1 = vload8(0, &acc[r + 1][d]) * a1;
#pragma unroll
                    for (int kk = 0; kk < KTC; kk++) {
                        const float8 v = vload8(0, &value[kk][d]);
                        x0 = fma((float8)(p[kk][r]), v, x0);
                        x1 = fma((float8)(p[kk][r + 1]), v, x1);
                    }
                    vstore8(x0, 0, &acc[r][d]);
                    vstore8(x1, 0, &acc[r + 1][d]);
                }
                for (int d = DV8; d < DV; d++) {
                    float x0 = acc[r][d] * a0, x1 = acc[r + 1][d] * a1;
                    for (int kk = 0; kk < KTC; kk++) {
                        x0 = fma(p[kk][r], value[kk][d], x0);
                        x1 = fma(p[kk][r + 1], value[kk][d], x1);
                    }
                    acc[r][d] = x0;
                    acc[r + 1][d] = x1;
                }
            } else {
                const int vis0 = min(nk, prefix + i0 + r + 1 - j0), vis1 = min(nk, prefix + i0 + r + 2 - j0);
                const uint sel0 = seen[r], sel1 = seen[r + 1];
                for (int d = 0; d < DV; d++) {
                    float x0 = acc[r][d] * a0, x1 = acc[r + 1][d] * a1;
                    for (int kk = 0; kk < vis0; kk++)
                        if ((sel0 >> kk) & 1u)
                            x0 = fma(p[kk][r], value[kk][d], x0);
                    for (int kk = 0; kk < vis1; kk++)
                        if ((sel1 >> kk) & 1u)
                            x1 = fma(p[kk][r + 1], value[kk][d], x1);
                    acc[r][d] = x0;
                    acc[r + 1][d] = x1;
                }
            }
        }
    }
    for (int r = 0; r < queries; r++) {
        const float inv = 1.0f / run_sum[r];
        for (int d = 0; d < DV; d++)
            out[out_offset + (size_t)(i0 + r) * out_row_stride + (size_t)h * DV + d] = acc[r][d] * inv;
    }
}
