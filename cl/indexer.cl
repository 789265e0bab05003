/* DeepSeek Sparse Attention's lightning indexer (shared/design/DSA.md sections 3, 4 and 7): the
 * scores of every cached token for each query token, and the top-k selection of them.
 *
 * indexer_scores: for query token t (its queries q [HI, DI] after RoPE, its head weights w' [HI]
 * already scaled by (HI DI)^-1/2) and each position s < ctx_len[t] of its sequence,
 *     scores[t, s] = sum_h w'_h max(q_h . k_s, 0)
 * where k_s is the index key of position s in a paged key cache: blocks of BT tokens x DI values
 * (float32, bf16 bits with -D KEY_BF16, or half with -D KEY_F16), block b at keys + b BT DI, position s of the sequence
 * in block block_table[seq, s / BT] at row s % BT. Positions ctx_len[t] <= s < max_ctx get -inf.
 *
 *   q [T, HI, DI] float32 from q_offset; w [T, HI] float32 from w_offset;
 *   block_table [table_rows, max_blocks] int32; token_seq [T] (its row), token_ctx_len [T];
 *   scores [T, score_stride] float32 from score_offset, columns 0 .. max_ctx-1 written.
 *   token_offset: token t's entries of token_seq and token_ctx_len are at token_offset + t (a chunk
 *   of a step's tokens); q, w and scores start at their own offsets. The same for indexer_topk.
 * Build options: HI (heads), DI (head dim), BT (block tokens), KEY_BF16 or KEY_F16.
 *
 * Work: work-item (c, t) scores positions [c chunk, (c+1) chunk) of token t; items past T or past
 * max_ctx do nothing, so any global size covering (ceil(max_ctx / chunk), T) and any work-group
 * shape are correct. Shaped for CPUs (PoCL, a work-group of one item): the token's queries are
 * transposed once into local memory (DI x HI floats, 32 KiB for HI 64 and DI 128) in blocks of 16
 * heads (its weights in private memory); the keys go in tiles of KT = 16, converted to float32 in private memory; for each block of
 * 16 heads and each group of 4 keys, 8 float8 accumulators (4 keys x 2 vectors of 8 heads) run over
 * d with one broadcast key value per key and 2 query vectors per step (6 loads per 8 fma, all from
 * L1: the block's queries and the tile's keys take 8 KiB each at DI 128), then ReLU times the heads'
 * weights is added into one float8 per key, summed across its lanes once per key. 2 HI DI + 2 HI
 * FLOPs per key (16,512 for HI 64, DI 128). A table entry or row outside the arrays (num_blocks,
 * table_rows) is clamped: the scores are then meaningless but nothing is read out of bounds.
 *
 * indexer_topk: for each row t, with n = min(ctx_len[t], max_ctx) visible positions, the
 * n_t = min(top_k, n) positions ranked first by (score descending, position ascending), written in
 * ascending position order, then -1 up to top_k: out [T, top_k] int32 from out_offset. One
 * work-group per row (any size; part: 2 x its size uints of local memory). Radix select (DSA.md
 * section 7): scores map to uint32 keys in the same order (-0 as +0; NaN below -inf), then up to four
 * passes of 8 bits each histogram the keys that share the digits found so far and pick the digit of
 * the top_k-th largest, stopping early once the bucket holds exactly the keys still wanted. The
 * selection is every key above the prefix found plus the lowest positions among those equal to it:
 * each item walks a contiguous segment of the row, and a scan of the items' counts gives each its
 * place in the output. */
#ifndef HI
#define HI 64
#endif
#ifndef DI
#define DI 128
#endif
#ifndef BT
#define BT 64
#endif

#if defined(KEY_FP8)
/* DeepSeek's FP8 index keys: a block of BT tokens is BT x DI e4m3 codes, then BT float32 scales
   (DSA.md section 5); a key is the Hadamard rotation of the written one (indexer_key_write), and
   the scores kernel rotates the queries alike. DI is a power of two. */
#define KEY_T uchar
#define KEY_BYTES 1
#elif defined(KEY_BF16)
#define KEY_T ushort
#define KEY_BYTES 2
#define KEY_LOAD8(p, i) dt_bf16x8(vload8((i), (p)))
#define KEY_LOAD(p, i) dt_bf16((p)[i])
#elif defined(KEY_F16)
#define KEY_T half
#define KEY_BYTES 2
#define KEY_LOAD8(p, i) vload_half8((i), (p))
#define KEY_LOAD(p, i) vload_half((i), (p))
#else
#define KEY_T float
#define KEY_BYTES 4
#define KEY_LOAD8(p, i) vload8((i), (p))
#define KEY_LOAD(p, i) ((p)[i])
#endif

#define KG 4                /* keys per group: 4 x 2 float8 accumulators */
#ifndef KT
#define KT 16               /* keys per tile, a multiple of KG */
#endif
#define DI8 (DI / 8)        /* whole float8 steps of a key */

#ifdef KEY_FP8
/* The codes of the key of position pos in a sequence's block table row; its scale follows the
   block's codes. */
inline __global const KEY_T *key_row(__global const KEY_T *keys, __global const int *table_row, const int num_blocks,
                                     const int pos)
{
    const int b = clamp(table_row[pos / BT], 0, num_blocks - 1);
    return keys + (size_t)b * BT * (DI + 4) + (size_t)(pos % BT) * DI;
}
inline float key_scale(__global const KEY_T *keys, __global const int *table_row, const int num_blocks, const int pos)
{
    const int b = clamp(table_row[pos / BT], 0, num_blocks - 1);
    return ((__global const float *)(keys + (size_t)b * BT * (DI + 4) + (size_t)BT * DI))[pos % BT];
}
#else
/* The start of the key of position pos in a sequence's block table row. */
inline __global const KEY_T *key_row(__global const KEY_T *keys, __global const int *table_row, const int num_blocks,
                                     const int pos)
{
    const int b = clamp(table_row[pos / BT], 0, num_blocks - 1);
    return keys + ((size_t)b * BT + (size_t)(pos % BT)) * DI;
}
#endif

#define HIP ((HI + 7) / 8 * 8) /* heads padded to whole float8 vectors */
#define HV (HIP / 8)              /* head vectors */

/* Scores of the KG keys at rows K(0) .. K(3) for head vectors v .. v+NV-1 (NV 1 or 2): 4 x NV
   float8 accumulators over d, one broadcast key value and NV query vectors per step. */
#define SCORE_BLOCK2(K)                                                                              \
    {                                                                                                \
        float8 a00 = (float8)(0.0f), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, \
               a31 = a00;                                                                            \
        __local const float *qv = qt + v * 8 * DI;                                                   \
        for (int d = 0; d < DI; d++) {                                                               \
            const float8 x0 = vload8(0, qv + d * 16), x1 = vload8(0, qv + d * 16 + 8);              \
            const float y0 = K(0)[d], y1 = K(1)[d], y2 = K(2)[d], y3 = K(3)[d];                      \
            a00 = fma((float8)(y0), x0, a00);                                                        \
            a01 = fma((float8)(y0), x1, a01);                                                        \
            a10 = fma((float8)(y1), x0, a10);                                                        \
            a11 = fma((float8)(y1), x1, a11);                                                        \
            a20 = fma((float8)(y2), x0, a20);                                                        \
            a21 = fma((float8)(y2), x1, a21);                                                        \
            a30 = fma((float8)(y3), x0, a30);                                                        \
            a31 = fma((float8)(y3), x1, a31);                                                        \
        }                                                                                            \
        const float8 w0 = vload8(0, wl + v * 8), w1 = vload8(0, wl + v * 8 + 8), zero = (float8)(0.0f); \
        S(0) = fma(fmax(a00, zero), w0, fma(fmax(a01, zero), w1, S(0)));                             \
        S(1) = fma(fmax(a10, zero), w0, fma(fmax(a11, zero), w1, S(1)));                             \
        S(2) = fma(fmax(a20, zero), w0, fma(fmax(a21, zero), w1, S(2)));                             \
        S(3) = fma(fmax(a30, zero), w0, fma(fmax(a31, zero), w1, S(3)));                             \
    }
#define SCORE_BLOCK1(K)                                                                              \
    {                                                                                                \
        float8 a0 = (float8)(0.0f), a1 = a0, a2 = a0, a3 = a0;                                       \
        __local const float *qv = qt + v * 8 * DI;                                                   \
        for (int d = 0; d < DI; d++) {                                                               \
            const float8 x0 = vload8(0, qv + d * 8);                                                 \
            a0 = fma((float8)(K(0)[d]), x0, a0);                                                     \
            a1 = fma((float8)(K(1)[d]), x0, a1);                                                     \
            a2 = fma((float8)(K(2)[d]), x0, a2);                                                     \
            a3 = fma((float8)(K(3)[d]), x0, a3);                                                     \
        }                                                                                            \
        const float8 w0 = vload8(0, wl + v * 8), zero = (float8)(0.0f);                              \
        S(0) = fma(fmax(a0, zero), w0, S(0));                                                        \
        S(1) = fma(fmax(a1, zero), w0, S(1));                                                        \
        S(2) = fma(fmax(a2, zero), w0, S(2));                                                        \
        S(3) = fma(fmax(a3, zero), w0, S(3));                                                        \
    }

inline float hsum8(const float8 v)
{
    const float4 a = v.lo + v.hi;
    const float2 b = a.lo + a.hi;
    return b.x + b.y;
}

/* Scores of positions [start, last) of a sequence (its block table row) for the queries in qt and
   weights in wl (below). */
inline void score_range(__local const float *qt, const float *wl, __global const KEY_T *keys,
                        const int num_blocks, __global const int *table_row, const int start, const int last,
                        __global float *out)
{
    /* Tiles of KT keys: for each block of 16 heads (8 KiB of qt at d 128) all the tile's keys (8 KiB
       of float32 at d 128), so that both stay in a 32 KiB L1 data cache across the block's groups. */
    float kb[KT * DI]; /* the tile's keys as float32, in L1 while the tile is scored */
#define KROW(j) (kb + (size_t)(jg + (j)) * DI)
    float8 acc[KT]; /* per key, by head lane */
#define S(j) acc[jg + (j)]

    for (int g = start; g < last; g += KT) {
        /* the tile's keys; positions past last repeat the last one (their scores are not stored) */
        for (int j = 0; j < KT; j++) {
            __global const KEY_T *r = key_row(keys, table_row, num_blocks, min(g + j, last - 1));
#ifdef KEY_FP8
            const float ks = key_scale(keys, table_row, num_blocks, min(g + j, last - 1));
            for (int i = 0; i < DI8; i++)
                vstore8(dt_e4m3x8s(vload8(i, r), ks), i, kb + j * DI);
            for (int d = DI8 * 8; d < DI; d++)
                kb[j * DI + d] = dt_e4m3u(r[d]) * DT_E4M3_UNIT * ks;
#else
            for (int i = 0; i < DI8; i++)
                vstore8(KEY_LOAD8(r, i), i, kb + j * DI);
            for (int d = DI8 * 8; d < DI; d++)
                kb[j * DI + d] = KEY_LOAD(r, d);
#endif
            acc[j] = (float8)(0.0f);
        }
#ifdef CLMLA_PREFETCH
        /* the next tile's rows, while this one is scored: the copy above then finds them in cache
           instead of waiting on memory row by row */
        for (int j = 0; j < KT && g + KT + j < last; j++) {
            __global const char *r = (__global const char *)key_row(keys, table_row, num_blocks, g + KT + j);
            for (int b = 0; b < DI * KEY_BYTES; b += 64)
                __builtin_prefetch(r + b, 0, 3);
        }
#endif
        const int n = min(KT, last - g);
        const int groups = (n + KG - 1) / KG;
        int v = 0;
        for (; v + 2 <= HV; v += 2)
            for (int jg = 0; jg < groups * KG; jg += KG)
                SCORE_BLOCK2(KROW)
        if (v < HV)
            for (int jg = 0; jg < groups * KG; jg += KG)
                SCORE_BLOCK1(KROW)
        for (int j = 0; j < n; j++)
            out[g + j] = hsum8(acc[j]);
    }
#undef S
#undef KROW
}

/* The queries of a token are transposed into local memory once, by blocks of 16 heads
   qt[block][d][16] (heads padded to HIP with zeros; a last block of 8 is [d][8]), so that the keys' values are broadcast against 8 heads at a time with no horizontal
   sums per head. A block is 64 contiguous bytes per d: a layout [d][HIP] would read one line per 256
   bytes, a quarter of the L1 sets, which the block's 128 lines fill to the last way. The weights,
   heads padded with 0 as well, are in private memory.
   A work-group serves its tokens (dimension 1) one at a time: all its items load the token's queries,
   then the items of that token score their chunks (one round per token: a group of one item on CPUs,
   any shape elsewhere). */
__kernel void indexer_scores(__global const float *q, const int q_offset, __global const float *w, const int w_offset,
                             __global const KEY_T *keys, const int num_blocks,
                             __global const int *block_table, const int table_rows, const int max_blocks,
                             __global const int *token_seq, __global const int *token_ctx_len, const int num_tokens,
                             const int max_ctx, const int chunk,
                             __global float *scores, const int score_offset, const int score_stride,
                             const int token_offset)
{
    __local float qt[DI * HIP];
    float wl[HIP]; /* the token's weights, heads padded with 0 (private: local memory holds just qt,
                      32 KiB at HI 64 and DI 128, the least a GPU may have) */
    const int l0 = get_local_size(0), l1 = get_local_size(1);
    const int lid = get_local_id(1) * l0 + get_local_id(0), nl = l0 * l1;
    const int start = get_global_id(0) * chunk;
    for (int r = 0; r < l1; r++) {
        const int t = get_group_id(1) * l1 + r;
        if (t >= num_tokens)
            break; /* the same for every item of the group */
        if (r > 0)
            barrier(CLK_LOCAL_MEM_FENCE); /* the previous token's queries are no longer read */
        __global const float *qg = q + q_offset + (size_t)t * HI * DI;
        __global const float *wg = w + w_offset + (size_t)t * HI;
        for (int i = lid; i < DI * HIP; i += nl) {
            const int h = i / DI, d = i % DI, b = h / 16, width = min(16, HIP - 16 * b);
            qt[b * 16 * DI + d * width + h % 16] = h < HI ? qg[i] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#ifdef KEY_FP8
        /* the keys are stored rotated by H / sqrt(DI) (H Sylvester's Hadamard matrix, symmetric and
           orthogonal up to that factor): q . k = (H q) . (H k / sqrt(DI)) / sqrt(DI), so each head's
           query is rotated here by the fast transform and the 1 / sqrt(DI) goes into its weight */
        for (int len = 1; len < DI; len *= 2) {
            for (int i = lid; i < HIP * (DI / 2); i += nl) {
                const int h = i / (DI / 2), p = i % (DI / 2), d0 = p / len * 2 * len + p % len, d1 = d0 + len;
                const int b = h / 16, width = min(16, HIP - 16 * b);
                __local float *col = qt + b * 16 * DI + h % 16;
                const float x0 = col[d0 * width], x1 = col[d1 * width];
                col[d0 * width] = x0 + x1;
                col[d1 * width] = x0 - x1;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
#endif
        if (get_local_id(1) != r || start >= max_ctx)
            continue;
        for (int h = 0; h < HIP; h++)
#ifdef KEY_FP8
            wl[h] = h < HI ? wg[h] * rsqrt((float)DI) : 0.0f;
#else
            wl[h] = h < HI ? wg[h] : 0.0f;
#endif
        const int end = min(start + chunk, max_ctx);
        const int ctx = clamp(token_ctx_len[token_offset + t], 0, max_ctx);
        __global float *out = scores + score_offset + (size_t)t * score_stride;
        for (int s = max(start, ctx); s < end; s++)
            out[s] = -INFINITY;
        const int last = min(end, ctx); /* positions [start, last) are scored */
        if (start < last)
            score_range(qt, wl, keys, num_blocks,
                        block_table + (size_t)clamp(token_seq[token_offset + t], 0, table_rows - 1) * max_blocks, start, last, out);
    }
}

/* ---- top-k ----------------------------------------------------------------------------------------- */

/* The order-preserving key of a score: larger scores give larger keys; -0 maps as +0, NaN to 0
   (below -inf, 0x007FFFFF). */
inline uint topk_key(const float f)
{
    uint b = as_uint(f);
    if ((b << 1) == 0u)
        b = 0u;
    if (isnan(f))
        return 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__kernel void indexer_topk(__global const float *scores, const int score_offset, const int score_stride,
                           __global const int *token_ctx_len, const int num_tokens, const int max_ctx,
                           const int top_k, __global int *out, const int out_offset, __local uint *part,
                           const int token_offset)
{
    __local uint hist[256];
    __local uint pick[2]; /* the digit found and the keys still wanted in it */
    const int t = get_group_id(0);
    const int lid = get_local_id(0), nt = get_local_size(0);
    if (t >= num_tokens)
        return; /* the whole group */
    const int n = clamp(token_ctx_len[token_offset + t], 0, max_ctx);
    __global int *dst = out + out_offset + (size_t)t * top_k;
    if (n <= top_k) { /* every visible position */
        for (int i = lid; i < top_k; i += nt)
            dst[i] = i < n ? i : -1;
        return;
    }
    __global const float *row = scores + score_offset + (size_t)t * score_stride;
    const int seg = (n + nt - 1) / nt;
    const int lo = min(lid * seg, n), hi = min(lo + seg, n);

    uint prefix = 0u, mask = 0u, want = (uint)top_k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = lid; i < 256; i += nt)
            hist[i] = 0u;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int p = lo; p < hi; p++) {
            const uint u = topk_key(row[p]);
            if ((u & mask) == prefix)
                atomic_inc(&hist[(u >> shift) & 255u]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid == 0) {
            uint left = want, b = 255u;
            while (b > 0u && hist[b] < left)
                left -= hist[b--];
            pick[0] = b;
            pick[1] = left;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const uint digit = pick[0], left = pick[1];
        const uint in_bucket = hist[digit];
        prefix |= digit << shift;
        mask |= 255u << shift;
        want = left;
        if (in_bucket == left) /* the whole bucket is taken: no tie to break inside it */
            break;
        barrier(CLK_LOCAL_MEM_FENCE); /* hist and pick are read before the next pass rewrites them */
    }

    /* keys above the prefix, and the first `want` (by position) equal to it */
    uint above = 0u, equal = 0u;
    for (int p = lo; p < hi; p++) {
        const uint m = topk_key(row[p]) & mask;
        above += m > prefix;
        equal += m == prefix;
    }
    part[lid] = above;
    part[nt + lid] = equal;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) { /* exclusive scans of both counts */
        uint a = 0u, e = 0u;
        for (int i = 0; i < nt; i++) {
            const uint ai = part[i], ei = part[nt + i];
            part[i] = a;
            part[nt + i] = e;
            a += ai;
            e += ei;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    uint eq_before = part[nt + lid];
    uint at = part[lid] + min(eq_before, want);
    for (int p = lo; p < hi; p++) {
        const uint m = topk_key(row[p]) & mask;
        if (m > prefix || (m == prefix && eq_before++ < want))
            dst[at++] = p;
    }
}

/* indexer_key_write: the index key of each new token (DSA.md section 3.3), written into the paged key
 * cache: k = LayerNorm(src row) (mean, population variance, (k - mean) / sqrt(var + eps) * norm_w +
 * norm_b), then RoPE on k[0 .. DR) with the token's row of the layer's RoPE table (float2 A cos,
 * A sin per pair; pairs (i, i + DR/2) with -D IDX_HALF_SPLIT, else (2i, 2i + 1)), then stored at the
 * token's slot (keys + slot DI) as float32 or rounded to bf16 (KEY_BF16) or f16 (KEY_F16), to nearest even.
 *   src [T, src_stride] float32 from src_offset (W_k x); positions [T] table rows; slots [T].
 * One work-group of WGK items (a power of two) per token. Build options: DI, DR, WGK, IDX_HALF_SPLIT,
 * KEY_BF16, KEY_F16, KEY_FP8 (then rotated and quantised as described below). */
#ifndef WGK
#define WGK 64
#endif

#ifdef IDX_HALF_SPLIT
#define IDX_PAIR_A(i) (i)
#define IDX_PAIR_B(i) ((i) + DR / 2)
#else
#define IDX_PAIR_A(i) (2 * (i))
#define IDX_PAIR_B(i) (2 * (i) + 1)
#endif

/* The sum of v over the WGK items of the group (a tree in part[WGK]), returned to every item; part
   may be reused once it returns. Every item of the group must call it. */
inline float group_sum(__local float *part, const int lid, const float v)
{
    part[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = WGK / 2; w > 0; w >>= 1) {
        if (lid < w)
            part[lid] += part[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = part[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}

__kernel __attribute__((reqd_work_group_size(WGK, 1, 1)))
void indexer_key_write(__global const float *src, const int src_offset, const int src_stride,
                       __global const float *norm_w, __global const float *norm_b, const float eps,
                       __global const int *positions, __global const float2 *table, __global const int *slots,
                       __global KEY_T *keys)
{
    __local float part[WGK];
    __local float row[DI];
    const int lid = get_local_id(0), t = get_group_id(0);
    __global const float *x = src + src_offset + (size_t)t * src_stride;
    float sum = 0.0f;
    for (int i = lid; i < DI; i += WGK)
        sum += x[i];
    const float mean = group_sum(part, lid, sum) / (float)DI;
    float sq = 0.0f;
    for (int i = lid; i < DI; i += WGK) {
        const float d = x[i] - mean;
        sq = fma(d, d, sq);
    }
    const float inv = 1.0f / sqrt(group_sum(part, lid, sq) / (float)DI + eps);
    for (int i = lid; i < DI; i += WGK)
        row[i] = (x[i] - mean) * inv * norm_w[i] + norm_b[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    __global const float2 *cs = table + (size_t)positions[t] * (DR / 2);
    for (int i = lid; i < DR / 2; i += WGK) {
        const int a = IDX_PAIR_A(i), b = IDX_PAIR_B(i);
        const float2 c = cs[i];
        const float x0 = row[a], x1 = row[b];
        row[a] = x0 * c.x - x1 * c.y; /* each pair belongs to one item: no race */
        row[b] = x0 * c.y + x1 * c.x;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#ifdef KEY_FP8
    /* DeepSeek's FP8 keys (DSA.md 3.4-3.5): the key rotated by H / sqrt(DI) (the fast transform in
       local memory), then e4m3 codes of key / s with s = 2^ceil(log2(max(amax, 1e-4) / 448)), the
       act_quant rule of DeepSeek-V3.2's reference (a NaN anywhere gives a NaN scale) */
    for (int len = 1; len < DI; len *= 2) {
        for (int p = lid; p < DI / 2; p += WGK) {
            const int d0 = p / len * 2 * len + p % len, d1 = d0 + len;
            const float x0 = row[d0], x1 = row[d1];
            row[d0] = x0 + x1;
            row[d1] = x0 - x1;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float amax = 0.0f;
    int nan = 0;
    for (int i = lid; i < DI; i += WGK) {
        row[i] *= rsqrt((float)DI);
        amax = fmax(amax, fabs(row[i]));
        nan |= isnan(row[i]);
    }
    part[lid] = nan ? NAN : amax;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = WGK / 2; w > 0; w >>= 1) {
        if (lid < w)
            part[lid] = isnan(part[lid + w]) ? part[lid + w] : isnan(part[lid]) ? part[lid] : fmax(part[lid], part[lid + w]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const uint sb = as_uint(fmax(part[0], 1e-4f) / 448.0f);
    const float scale = isnan(part[0]) ? NAN : as_float((sb & 0x007FFFFFu) ? (sb & 0x7F800000u) + 0x00800000u : sb);
    const int blk = slots[t] / BT, off = slots[t] % BT;
    __global uchar *codes = keys + (size_t)blk * BT * (DI + 4) + (size_t)off * DI;
    for (int i = lid; i < DI; i += WGK)
        codes[i] = dt_to_e4m3(row[i] / scale);
    if (lid == 0)
        ((__global float *)(keys + (size_t)blk * BT * (DI + 4) + (size_t)BT * DI))[off] = scale;
#else
    __global KEY_T *out = keys + (size_t)slots[t] * DI;
    for (int i = lid; i < DI; i += WGK)
#if defined(KEY_BF16)
        out[i] = dt_to_bf16(row[i]);
#elif defined(KEY_F16)
        vstore_half_rte(row[i], i, out);
#else
        out[i] = row[i];
#endif
#endif
}

/* indexer_q_rope: RoPE on q_h[0 .. DR) of every indexer head of every token, in place (the rope dims
 * come first in each head: DSA.md section 2), pairing as indexer_key_write.
 *   q [T, HI, DI] float32 from q_offset; positions [T] rows of the RoPE table.
 * Work-item (i, h, t) rotates pair i of head h of token t. */
__kernel void indexer_q_rope(__global float *q, const int q_offset, __global const int *positions,
                             __global const float2 *table)
{
    const int i = get_global_id(0), h = get_global_id(1), t = get_global_id(2);
    if (i >= DR / 2 || h >= HI)
        return;
    __global float *x = q + q_offset + ((size_t)t * HI + h) * DI;
    const float2 c = table[(size_t)positions[t] * (DR / 2) + i];
    const int a = IDX_PAIR_A(i), b = IDX_PAIR_B(i);
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c.x - x1 * c.y;
    x[b] = x0 * c.y + x1 * c.x;
}
