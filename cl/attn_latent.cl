/* Latent (absorbed) attention over the paged cache (docs/MLA.md section 5), FlashMLA-style.
 *
 * For query token t and head h, over keys j < token_ctx_len[t] of its sequence:
 *   score_j = scale * (q_latent[t,h,:] . c^KV_j + q_rope[t,h,:] . k^R_j)
 *   out[t,h,:] = sum_j softmax(score)_j c^KV_j        lse[t,h] = log sum_j exp(score_j)
 * The cache row [c^KV_j ; k^R_j] (ROW = RKV + DR values) is one key of width ROW whose first RKV
 * values are also the value: multi-query attention with one shared head.
 *
 * With -D SPARSE (clmla_attention_latent_sparse: DeepSeek Sparse Attention's selected tokens) both
 * kernels take three more arguments, indices, indices_offset and topk, and the keys of token t are
 * the positions indices[indices_offset + t*topk + e] for entries e < topk instead of 0 .. ctx-1:
 * "key j" below is then entry j of the token's list (splits and tiles cut the list), translated
 * through the block table. An entry outside [0, ctx) is no key: its score is -inf and its weight
 * 0 (attn_latent reads position 0's row for it and drops the score; attn_latent_rows gives it the
 * row of its tile's first key and skips a tile with none), so a split or tile without keys leaves
 * the online softmax as it was and a split without any writes out 0, lse -inf. Without SPARSE the
 * code is that of the dense kernels, token for token.
 *
 * attn_latent (GPUs and other devices with many lanes per compute unit): work-group (head group g,
 * split s, token t) of NT work-items and HG heads h0 = g*HG .. (padded to HGP = 4, 8 or 16 heads,
 * whose queries are zero and whose results are never stored), keys [s*split_tokens,
 * min((s+1)*split_tokens, ctx)) in tiles of TK = KPT*HPI*NT/HGP keys. The group's queries,
 * scaled, sit in local memory; every cache row is read by one work-group per head group and split.
 *   A. scores: item (keys KPT*kk .. +KPT-1 with kk = lid / HQ, heads HPI*hq .. +HPI-1 with
 *      hq = lid % HQ, HQ = HGP/HPI) computes the full ROW-long dot products of its KPT keys with
 *      its HPI heads' queries (HPI 4 by default; 8 or 16: each cached value loaded, and for a cache
 *      of f16, bf16 or fp8 decoded, by fewer items, at the price of more query loads per FMA): the
 *      rows stream from global memory in float4s, UA of each row loaded before any is used, and
 *      each query float4 read from local memory feeds KPT keys; no partial sums to reduce. -> s[kk][h]
 *   B. online softmax: item (head h = lid % HGP, gi = lid / HGP) takes the maximum of KB = HPI*KPT
 *      keys; after a barrier every item reads the GI = NT/HGP maxima of its head, so all of them
 *      hold the same running maximum; each turns its KB scores into weights exp(s - max) and
 *      keeps its own running sum of them (added up over gi at the end). -> weights in s, alpha
 *   C. values: item lid owns row elements d = lid, lid + NT, ... < RKV (coalesced loads, DPT of
 *      them) for all HGP heads: acc[h][i] = alpha[h] acc[h][i] + sum_kk w[kk][h] c[kk][d], the
 *      weights read as float4 broadcasts, UC keys' values loaded before any is used. The tile's
 *      rows were read in A a moment before, so they come from the L1/L2 caches.
 * Four barriers per tile, none inside a loop over keys or elements.
 *   With -D RS=2 or 4 (row slices, the latent tuning's group_row_slices) step A gives each key's
 *   dot products to RS items, slice r summing float4s r, r + RS, r + 2 RS, ... of the row (adjacent
 *   items, adjacent float4s), into RS partial scores that step B adds up: tiles of TK = KPT*NT/(HQ*RS)
 *   keys, whose chain of loads per item is RS times shorter. For few work-groups (batch 1, short
 *   splits), where each group's chain of dependent load rounds, not the device's throughput, sets
 *   the time.
 *
 * With -D FOLD=F (F > 1, never with SPARSE; multi-token decode) a work-group takes up to F query
 * tokens of one sequence as well: its HG = HT*F "heads" are (token i, head h0 + h) for i < F and
 * h < HT, virtual head v = i*HT + h, so each cache row is read once for the F tokens' queries, as
 * FlashMLA folds the query length into the heads. The tokens of a sequence's group are consecutive,
 * token_first[t] naming the first of t's (or, token_first NULL, groups of query_len tokens from
 * token 0); the work-group on token t works when t is the first of a run of F of its group's tokens
 * and stops at once otherwise. Each virtual head keeps its own token's context: key j scores -inf
 * for it from token_ctx_len[its token] on (causal among the new tokens).
 *
 * On a GPU what limits the kernel is the load traffic per FMA through L1 and local memory, not
 * DRAM, hence: KPT = 4 keys per item (each query float4 read from local memory feeds four keys)
 * with NT = 128; acc[][] indexed only by constants once the loops are unrolled (a loop with an
 * early exit makes compilers keep it in stack memory); UA = 4 float4s of each row in flight
 * (within the registers that leave two groups per compute unit); the queries staged by float4s in
 * one unrolled loop. The runs behind each are in docs/perf-log.md, "GPUs: attn_latent".
 *
 * Output rows are per split: out [T, num_splits, H, RKV], lse [T, num_splits, H]; with one split
 * that is the final [T, H, RKV] / [T, H], else attn_combine.cl merges the splits by their lse.
 * Local memory (floats): HGP*ROWV*4 (queries) + RS*TK*HGP (scores) + GI*HGP (maxima, sums) + HGP
 * (alpha) + TK ints (row slots); NT = 128, KPT = 4, 16 heads, ROW 576: 45.1 KiB. */
#ifndef NT
#define NT 128
#endif
#ifndef HG
#define HG 16
#endif
/* FOLD and HT (see above): their defaults are cl/prelude.cl's */
#define ROW (RKV + DR)
#define HGP (HG <= 4 ? 4 : HG <= 8 ? 8 : 16) /* heads padded to whole quads, a power of two */
#ifndef KPT
#define KPT 4                                /* keys per item in step A */
#endif
#define UA 4                                 /* float4s of each row in flight per item in step A */
#define UC 4                                 /* keys in flight per item in step C */
#ifndef HPI
#define HPI 4                                /* heads per item in step A: 4, 8 or 16 */
#endif
#if HPI != 4 && HPI != 8 && HPI != 16
#error "HPI must be 4, 8 or 16"
#endif
#define HPIE (HPI < HGP ? HPI : HGP)         /* at most the group's padded heads */
#define HQ (HGP / HPIE)                      /* items per key and row slice in step A */
#define HQ4 (HGP / 4)                        /* head quads: float4s of a key's scores */
#ifndef RS
#define RS 1                                 /* row slices: items per key and head set in step A (below) */
#endif
#if RS != 1 && RS != 2 && RS != 4
#error "RS must be 1, 2 or 4"
#endif
#define TK (KPT * NT / (HQ * RS))            /* keys per tile */
#if KPT * HPIE % RS
#error "RS must divide KPT * HPIE (step B's keys per item)"
#endif
#define GI (NT / HGP)                        /* items per head in step B */
#define KB (TK / GI)                         /* keys per item in step B: 4 * KPT */
#define ROW4 (ROW / 4)                       /* whole float4s of a row */
#define ROWV ((ROW + 3) / 4)                 /* float4s of a padded query row */
#define DPT ((RKV + NT - 1) / NT)            /* value elements per item in step C */
#define QIT ((HGP * ROWV + NT - 1) / NT)     /* query float4s per item */
/* QLAYOUT: where float4 v of head hd's scaled query sits in local memory. 0: [HGP][ROWV], each head's
   row contiguous; 1: [ROWV][HPIE][HQ], so that the HQ items of one key in step A (head quads hq, the
   same h and v) read adjacent float4s: no two of a quarter-warp's distinct addresses share a bank on
   GPUs with 32 four-byte banks, where layout 0 puts them 4*ROWV float4s apart, all in one bank group. */
#ifndef QLAYOUT
#define QLAYOUT 0
#endif
#if QLAYOUT == 0
#define QIDX(hd, v) ((hd) * ROWV + (v))
#else
#define QIDX(hd, v) (((v) * HPIE + (hd) % HPIE) * HQ + (hd) / HPIE)
#endif
#if NT * DPT == RKV
#define IN_VALUES(d) 1                       /* step C: every item's elements lie inside the row */
#else
#define IN_VALUES(d) ((d) < RKV)
#endif

/* Step C's update of the accumulators by UC keys' values c[u][] and weights, FMA(w, c, acc) the
   product (attn_latent below). */
#define C_UPDATE(FMA)                                                                              \
    {                                                                                              \
        _Pragma("unroll") for (int u = 0; u < UC; u++) {                                           \
            const int kw = min(k0 + u, nk - 1);                                                    \
            _Pragma("unroll") for (int q = 0; q < HQ4; q++) {                                      \
                const float4 w = sw[kw * HQ4 + q];                                                 \
                _Pragma("unroll") for (int i = 0; i < DPT; i++) {                                  \
                    acc[4 * q][i] = FMA(w.x, c[u][i], acc[4 * q][i]);                              \
                    acc[4 * q + 1][i] = FMA(w.y, c[u][i], acc[4 * q + 1][i]);                      \
                    acc[4 * q + 2][i] = FMA(w.z, c[u][i], acc[4 * q + 2][i]);                      \
                    acc[4 * q + 3][i] = FMA(w.w, c[u][i], acc[4 * q + 3][i]);                      \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }
#define C_FMA_GUARDED(w, c, a) ((w) == 0.0f ? (a) : fma((w), (c), (a)))

/* The cache's loads (cl/prelude.cl); float rows of a multiple of 4 start 16-byte aligned, so
   their float4s load as such. */
#define LOAD(p, i) CACHE_LOAD(p, i)
#define LOAD_VALUE(p, i) CACHE_LOAD_VALUE(p, i) /* c^KV only (step C) */
#if !defined(CACHE_CONVERTS) && ROW % 4 == 0
#define LOAD4(p, i) (((__global const float4 *)(p))[i])
#else
#define LOAD4(p, i) CACHE_LOAD4(p, i)
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
                 __global float *out, const int out_offset, __global float *lse, const int lse_offset
#ifdef SPARSE
                 , __global const int *indices, const int indices_offset, const int topk
#endif
#ifdef MASK
                 , __global const half *mask, const int mask_offset, const int mask_stride
#endif
#if FOLD > 1
                 , __global const int *token_first, const int query_len
#endif
                 , const ulong cache_offset /* the rows start this many CACHE_T units into `cache` */
                 )
{
    cache += cache_offset;
    __local float4 qs[HGP * ROWV]; /* scaled queries (QLAYOUT), zero past ROW and for padding heads */
    __local float4 sw[RS * TK * HQ4]; /* [RS][TK][HGP]: the tile's (partial) scores, then in [0] its weights */
    __local float red[GI * HGP];   /* [GI][HGP]: per-item maxima, at the end per-item sums */
    __local float alpha_l[HGP];    /* exp(old max - new max) of the tile, per head */
    __local int slot_l[TK];        /* cache slot of each key of the tile */

    const int lid = get_local_id(0);
    const int split = get_global_id(1);
    const int t = get_global_id(2);
#if FOLD > 1
    /* the group's tokens t .. t+nq-1; virtual head v: token t + VTOK(v), head VHEAD(v) */
    const int h0 = get_group_id(0) * HT;
    const int first = LATENT_RUN_FIRST(t);
    if ((t - first) % FOLD) /* the group of token first + FOLD*((t - first) / FOLD) takes it */
        return;
    const int tokens = get_global_size(2);
    int nq = 1, ctx = token_ctx_len[t], ctx_min = ctx; /* the most and fewest keys of the group's tokens */
    while (nq < FOLD && t + nq < tokens && LATENT_RUN_FIRST(t + nq) == first) {
        ctx = max(ctx, token_ctx_len[t + nq]);
        ctx_min = min(ctx_min, token_ctx_len[t + nq++]);
    }
#define VTOK(v) ((v) / HT)
#define VHEAD(v) (h0 + (v) % HT)
#define VLIVE(v) ((v) < HG && (v) / HT < nq && h0 + (v) % HT < num_heads)
#else
    const int h0 = get_group_id(0) * HG;
    const int ctx = token_ctx_len[t];
#define VTOK(v) 0
#define VHEAD(v) (h0 + (v))
#define VLIVE(v) ((v) < HG && h0 + (v) < num_heads)
#endif
    /* keys (SPARSE: entries of the token's index list) k_begin .. k_end-1 */
    const int k_begin = split * split_tokens, k_end = LATENT_KEYS_END(ctx, k_begin);
#ifdef SPARSE
    __global const int *list = LATENT_LIST(t);
#endif
    __global const int *table = block_table + (size_t)token_seq[t] * max_blocks_per_seq;
    /* the output row (token, split, head) of virtual head v */
#define OUT_ROW(v) (((size_t)(t + VTOK(v)) * num_splits + split) * num_heads + VHEAD(v))

    if (k_end <= k_begin) { /* no keys (the same for the whole group): out 0, lse -inf; the token's
                               queries are not read (a layer step leaves them unwritten for tokens
                               that take the decompressed path) */
        for (int h = 0; h < HG; h++) {
            if (!VLIVE(h))
                continue;
            for (int d = lid; d < RKV; d += NT)
                out[out_offset + OUT_ROW(h) * RKV + d] = 0.0f;
            if (lid == 0)
                lse[lse_offset + OUT_ROW(h)] = -INFINITY;
        }
        return;
    }

    /* the queries, scaled, a float4 per item and step: all QIT loads of an item are independent,
       so they are in flight together (one loop of scalar loads and stores took 72 round trips) */
    #pragma unroll
    for (int it = 0; it < QIT; it++) {
        const int i4 = lid + it * NT;
        const int h = i4 / ROWV, d = (i4 % ROWV) * 4, head = VHEAD(h);
        float4 v = 0.0f;
        if (i4 < HGP * ROWV && VLIVE(h)) {
            const size_t tq = (size_t)(t + VTOK(h));
            __global const float *ql = q_latent + q_latent_offset + tq * q_latent_token_stride +
                                       (size_t)head * q_latent_head_stride;
            __global const float *qr = q_rope + q_rope_offset + tq * q_rope_token_stride +
                                       (size_t)head * q_rope_head_stride;
            if (d + 4 <= RKV)
                v = vload4(0, ql + d);
            else if (d >= RKV && d + 4 <= ROW)
                v = vload4(0, qr + (d - RKV));
            else {
                v.x = d < RKV ? ql[d] : d < ROW ? qr[d - RKV] : 0.0f;
                v.y = d + 1 < RKV ? ql[d + 1] : d + 1 < ROW ? qr[d + 1 - RKV] : 0.0f;
                v.z = d + 2 < RKV ? ql[d + 2] : d + 2 < ROW ? qr[d + 2 - RKV] : 0.0f;
                v.w = d + 3 < RKV ? ql[d + 3] : d + 3 < ROW ? qr[d + 3 - RKV] : 0.0f;
            }
        }
        if (i4 < HGP * ROWV)
            qs[QIDX(h, i4 % ROWV)] = v * scale;
    }

    barrier(CLK_LOCAL_MEM_FENCE);

    /* step A: keys KPT*kk_a .. of the tile, heads HPIE*hq .. +HPIE-1, row slice ra */
    const int kk_a = lid / (HQ * RS), hq = lid % HQ, ra = lid / HQ % RS;
    const int hb = lid % HGP, gi = lid / HGP;  /* step B: head, item of that head */
    float m_run = -INFINITY, l_run = 0.0f;     /* head hb: running maximum (the same in every item), own sum */
#if FOLD > 1
    int lim[HPIE]; /* step A: the keys of the item's heads' tokens (0 for a head not stored) */
    for (int c = 0; c < HPIE; c++)
        lim[c] = VLIVE(HPIE * hq + c) ? token_ctx_len[t + VTOK(HPIE * hq + c)] : 0;
#endif
    float acc[HGP][DPT];
    for (int h = 0; h < HGP; h++)
        for (int i = 0; i < DPT; i++)
            acc[h][i] = 0.0f;
    __local float *s = (__local float *)sw;

    for (int j0 = k_begin; j0 < k_end; j0 += TK) {
        const int nk = min(TK, k_end - j0); /* the same in every item */
        /* A. scores of keys kk_a*KPT .. +KPT-1 with heads 4hq .. 4hq+3 (keys past the end: -inf) */
        {
            __global const CACHE_T *rowp[KPT];
#ifdef SPARSE
            int live[KPT]; /* the entry is a key: a position in [0, ctx) */
            for (int k = 0; k < KPT; k++) {
                const int kk = kk_a * KPT + k;
                const int pos = kk < nk ? list[j0 + kk] : -1;
                live[k] = pos >= 0 && pos < ctx;
                const int j = live[k] ? pos : 0; /* no key: position 0's row (ctx >= 1), score dropped */
                const int slot = table[j / block_tokens] * block_tokens + j % block_tokens;
                if (hq == 0 && ra == 0 && kk < nk)
                    slot_l[kk] = live[k] ? slot : -1; /* -1: no values in step C */
                rowp[k] = cache + (size_t)slot * CACHE_ROW_UNITS;
            }
#else
            for (int k = 0; k < KPT; k++) {
                const int kk = kk_a * KPT + k;
                const int j = j0 + (kk < nk ? kk : 0); /* past the end: key j0's row, score dropped */
                const int slot = table[j / block_tokens] * block_tokens + j % block_tokens;
                if (hq == 0 && ra == 0 && kk < nk)
                    slot_l[kk] = slot;
                rowp[k] = cache + (size_t)slot * CACHE_ROW_UNITS;
            }
#endif
            float4 a[KPT][HPIE];
            for (int k = 0; k < KPT; k++)
                for (int h = 0; h < HPIE; h++)
                    a[k][h] = 0.0f;
            /* float4s ra, ra + RS, ... of each row (all of them with one slice), UA of each row loaded
               before any is used: KPT*UA loads in flight per item */
            const int nv = (ROW4 - ra + RS - 1) / RS;
            int i = 0;
            for (; i + UA <= nv; i += UA) {
                float4 c[KPT][UA];
                #pragma unroll
                for (int k = 0; k < KPT; k++)
                    #pragma unroll
                    for (int u = 0; u < UA; u++)
                        c[k][u] = LOAD4(rowp[k], (i + u) * RS + ra);
                #pragma unroll
                for (int u = 0; u < UA; u++)
                    #pragma unroll
                    for (int h = 0; h < HPIE; h++) {
                        const float4 qv = qs[QIDX(HPIE * hq + h, (i + u) * RS + ra)];
                        #pragma unroll
                        for (int k = 0; k < KPT; k++)
                            a[k][h] = fma(qv, c[k][u], a[k][h]);
                    }
            }
            for (; i < nv; i++)
                for (int k = 0; k < KPT; k++) {
                    const float4 c = LOAD4(rowp[k], i * RS + ra);
                    for (int h = 0; h < HPIE; h++)
                        a[k][h] = fma(qs[QIDX(HPIE * hq + h, i * RS + ra)], c, a[k][h]);
                }
#if ROW % 4
            if (ra == ROW4 % RS) /* the slice whose next float4 would be the row's last, partial one */
                for (int k = 0; k < KPT; k++) {
                    float4 c = 0.0f;
                    c.x = LOAD(rowp[k], 4 * ROW4);
#if ROW % 4 > 1
                    c.y = LOAD(rowp[k], 4 * ROW4 + 1);
#endif
#if ROW % 4 > 2
                    c.z = LOAD(rowp[k], 4 * ROW4 + 2);
#endif
                    for (int h = 0; h < HPIE; h++)
                        a[k][h] = fma(qs[QIDX(HPIE * hq + h, ROW4)], c, a[k][h]);
                }
#endif
            /* the item's scores as float4s of 4 heads: sw[key][HPIE / 4 * hq + f] */
#define SUM4(f4) ((f4).x + (f4).y + (f4).z + (f4).w)
            for (int k = 0; k < KPT; k++) {
                const int kk = kk_a * KPT + k;
                #pragma unroll
                for (int f = 0; f < HPIE / 4; f++) {
                    const float4 sc = (float4)(SUM4(a[k][4 * f]), SUM4(a[k][4 * f + 1]), SUM4(a[k][4 * f + 2]),
                                               SUM4(a[k][4 * f + 3]));
                    __local float4 *dst = &sw[(ra * TK + kk) * HQ4 + HPIE / 4 * hq + f];
#ifdef SPARSE
                    *dst = live[k] ? sc : (float4)(-INFINITY);
#elif defined(MASK)
                    /* the mask's value for key j0 + kk, added once: to row slice 0's partial score */
                    const float mv = ra == 0 && kk < nk
                                         ? vload_half(0, mask + mask_offset + (size_t)t * mask_stride + j0 + kk)
                                         : 0.0f;
                    *dst = kk < nk ? sc + (float4)(mv) : (float4)(-INFINITY);
#elif FOLD > 1
                    const int j = j0 + kk, in = kk < nk; /* key j, for each head if its token sees it */
                    *dst = (float4)(in && j < lim[4 * f] ? sc.x : -INFINITY, in && j < lim[4 * f + 1] ? sc.y : -INFINITY,
                                    in && j < lim[4 * f + 2] ? sc.z : -INFINITY, in && j < lim[4 * f + 3] ? sc.w : -INFINITY);
#else
                    *dst = kk < nk ? sc : (float4)(-INFINITY);
#endif
                }
            }
#undef SUM4
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* B. the tile's maximum per head (with row slices, each score the sum of its partial
           scores, kept in slice 0's place), then weights and sums */
        float mx = -INFINITY;
        for (int i = 0; i < KB; i++) {
#if RS > 1
            const int at = (KB * gi + i) * HGP + hb;
            float sc = s[at];
            for (int r = 1; r < RS; r++)
                sc += s[r * TK * HGP + at];
            s[at] = sc;
            mx = fmax(mx, sc);
#else
            mx = fmax(mx, s[(KB * gi + i) * HGP + hb]);
#endif
        }
        red[gi * HGP + hb] = mx;
        barrier(CLK_LOCAL_MEM_FENCE);
        float m_new = m_run;
        for (int g = 0; g < GI; g++)
            m_new = fmax(m_new, red[g * HGP + hb]);
        /* m_new is -inf only while every score so far is -inf or not a number: nothing to rescale;
           keys past the end weigh 0, and a NaN score stays NaN */
        const float a = m_new == -INFINITY ? 1.0f : exp(m_run - m_new);
        float sum = 0.0f;
        for (int i = 0; i < KB; i++) {
            const int at = (KB * gi + i) * HGP + hb;
            const float w = s[at] == -INFINITY ? 0.0f : exp(s[at] - m_new);
            s[at] = w;
            sum += w;
        }
        l_run = l_run * a + sum;
        m_run = m_new;
        if (gi == 0)
            alpha_l[hb] = a;
        barrier(CLK_LOCAL_MEM_FENCE);

        /* C. acc = alpha acc + w^T c over the tile's keys, elements lid + i*NT of each row */
        for (int h = 0; h < HGP; h++) {
            const float ah = alpha_l[h];
            for (int i = 0; i < DPT; i++)
                acc[h][i] *= ah;
        }
        /* UC keys' values loaded before any is used */
        for (int k0 = 0; k0 < nk; k0 += UC) {
            float c[UC][DPT];
            #pragma unroll
            for (int u = 0; u < UC; u++) {
                /* past the end: values 0 (no early exit: acc[][] must stay in registers) */
#ifdef SPARSE
                const int su = k0 + u < nk ? slot_l[k0 + u] : -1; /* -1 also for an entry that is no key */
                const int valid = su >= 0;
                __global const CACHE_T *row = cache + (size_t)(valid ? su : 0) * CACHE_ROW_UNITS;
#else
                const int valid = k0 + u < nk;
                __global const CACHE_T *row = cache + (size_t)slot_l[valid ? k0 + u : nk - 1] * CACHE_ROW_UNITS;
#endif
                #pragma unroll
                for (int i = 0; i < DPT; i++) {
                    const int d = lid + i * NT;
                    c[u][i] = valid && IN_VALUES(d) ? LOAD_VALUE(row, d) : 0.0f;
                }
            }
#if FOLD > 1
            /* a key that some of the group's tokens do not see weighs 0 for them, and 0 times a value
               that is not finite (a later token's NaN input) would reach them as NaN: in a tile that
               crosses a token's last key, a weight of 0 adds nothing */
            if (j0 + nk > ctx_min)
                C_UPDATE(C_FMA_GUARDED)
            else
#endif
#ifdef MASK
            /* a key the mask removes adds nothing, whatever its row holds (ggml skips it) */
            C_UPDATE(C_FMA_GUARDED)
#else
                C_UPDATE(fma)
#endif
        }
        /* the next tile writes sw, slot_l, red and alpha_l only after this */
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    /* the sums of each head, over its GI items */
    red[gi * HGP + hb] = l_run;
    barrier(CLK_LOCAL_MEM_FENCE);
    /* every index into acc[][] a constant after unrolling: a loop with an early exit left the
       NVIDIA compiler indexing it at run time, which put all of acc in stack memory */
    #pragma unroll
    for (int h = 0; h < HG; h++) {
        if (!VLIVE(h))
            continue;
        float l = 0.0f;
        for (int g = 0; g < GI; g++)
            l += red[g * HGP + h];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int i = 0; i < DPT; i++) {
            const int d = lid + i * NT;
            if (d < RKV)
                out[out_offset + OUT_ROW(h) * RKV + d] = acc[h][i] * inv;
        }
        if (lid == h) /* item h is (head h, gi 0): its m_run is head h's maximum */
            lse[lse_offset + OUT_ROW(h)] = l > 0.0f ? m_run + log(l) : -INFINITY;
    }
}
#undef VTOK
#undef VHEAD
#undef VLIVE
#undef OUT_ROW

/* ---- the same attention for CPU devices -------------------------------------------------------
 *
 * attn_latent_rows: one work-item per (head group of HGC heads, split, token), no barriers. The
 * item walks its keys in tiles of KTC rows (an f32 tile is read in place; an f16 or bf16 tile is converted
 * into private memory by the first score pass, which uses the values as it converts them), computes
 * the HGC x KTC scores two heads by four keys
 * at a time in float8 registers, runs the online softmax eight heads per vector, then adds the
 * weighted rows into its
 * private accumulators [HGC][RKV] in blocks of four heads x 16 values held in registers over the
 * tile. Scores read a key row once per two heads, sums once per four heads, and q / the
 * accumulators once per KTC keys; with HGC = 16 this is a small GEMM per tile, which is what a CPU
 * core does well (HGC even; a multiple of 4 uses the 4-head blocks throughout). Scores are kept in base 2 (q is pre-scaled by scale * log2(e), weights are exp2, the lse is
 * converted back to natural log at the end) and key-major, p[key][head], so that the softmax is
 * vertical vector work: one exp2 of eight heads per key and no horizontal max or sum.
 * Outputs as attn_latent. The runs behind these choices are in docs/perf-log.md, "CPU devices:
 * attn_latent_rows". */
/* With CLMLA_PREFETCH (CPU devices, clang-based compilers), the next tile's rows are prefetched
 * one 64-byte line every PFS vector steps of the score passes, so that the misses overlap the fma
 * instead of queueing behind each other as one burst per tile would. The score loop runs in
 * groups of PFS unrolled steps with one prefetch per group rather than testing d at every step.
 * With ROW = 576 and PFS = 4 there are 18 groups per
 * pass and 16 passes per tile of 8: 288 groups for the tile's 8 x 36 lines, one line each. */
#define PFS 4
#define LPR ((CACHE_ROW_UNITS * (int)sizeof(CACHE_T) + 63) / 64) /* cache lines per row */
/* lines prefetched per group of PFS steps: the next tile's KTC x LPR lines spread over the tile's
   (HGC / 2) x (KTC / 4) score passes of ROW8 / (8 PFS) groups each (several a group where the
   heads are few) */
#define PF_GROUPS ((HGC / 2) * (KTC / 4) * (ROW8 / (8 * PFS)))
#define PFL (PF_GROUPS > 0 ? (KTC * LPR + PF_GROUPS - 1) / PF_GROUPS : 1)
#ifndef HGC
#define HGC 16
#endif
#ifndef KTC
#define KTC 8
#endif
#define ROW8 (ROW / 8 * 8)
#define HGV ((HGC + 7) / 8 * 8) /* heads padded to whole float8 vectors for the softmax */

#ifdef SPARSE
/* The CPU kernels' tile of entries j0 .. j0 + nk - 1 of a token's list: kpos[kk] the position entry
   kk reads, its own where it is a key, else the tile's first key's (past nk too); *first that
   first key's position. Returns the entries that are keys as bits (0: none, the tile is skipped). */
inline uint sparse_tile(__global const int *list, const int j0, const int nk, const int ctx, int *kpos, int *first)
{
    uint live = 0u;
    *first = -1;
    for (int kk = 0; kk < nk; kk++) {
        const int pos = list[j0 + kk];
        kpos[kk] = pos;
        if (pos >= 0 && pos < ctx) {
            live |= 1u << kk;
            if (*first < 0)
                *first = pos;
        }
    }
    for (int kk = 0; kk < KTC; kk++)
        if (!(live >> kk & 1u))
            kpos[kk] = *first;
    return live;
}
#endif
#define RKV8 (RKV / 8 * 8)

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void attn_latent_rows(__global const float *q_latent, const int q_latent_offset, const int q_latent_token_stride,
                      const int q_latent_head_stride,
                      __global const float *q_rope, const int q_rope_offset, const int q_rope_token_stride,
                      const int q_rope_head_stride,
                      __global const CACHE_T *cache,
                      __global const int *block_table, const int max_blocks_per_seq, const int block_tokens,
                      __global const int *token_seq, __global const int *token_ctx_len,
                      const int num_heads, const int num_splits, const int split_tokens, const float scale,
                      __global float *out, const int out_offset, __global float *lse, const int lse_offset
#ifdef SPARSE
                      , __global const int *indices, const int indices_offset, const int topk
#endif
#ifdef MASK
                      , __global const half *mask, const int mask_offset, const int mask_stride
#endif
                      , const ulong cache_offset /* the rows start this many CACHE_T units into `cache` */
                      )
{
    cache += cache_offset;
    const int h0 = get_global_id(0) * HGC;
    const int split = get_global_id(1);
    const int t = get_global_id(2);
    const int ctx = token_ctx_len[t];
    /* keys (SPARSE: entries of the token's index list) k_begin .. k_end-1 */
    const int k_begin = split * split_tokens, k_end = LATENT_KEYS_END(ctx, k_begin);
#ifdef SPARSE
    __global const int *list = LATENT_LIST(t);
#endif
    __global const int *table = block_table + (size_t)token_seq[t] * max_blocks_per_seq;
    const int heads = min(HGC, num_heads - h0);

    float q[HGC][ROW];   /* the group's queries [q~ ; q^R], pre-scaled by `scale` * log2(e) */
    float acc[HGC][RKV];
#ifdef CACHE_CONVERTS
    float tile[KTC][ROW]; /* the tile's rows converted to float, in the first score passes */
    __global const CACHE_T *hrow[KTC];
#define TROW(kk) (tile[kk])
#else
    __global const float *trow[KTC]; /* f32: the tile's rows are read in place */
#define TROW(kk) (trow[kk])
#endif
    float p[KTC][HGV]; /* the tile's scores, then weights, key-major: the softmax runs across heads */
    float run_max[HGV], run_sum[HGV], alpha[HGV];

    for (int h = 0; h < HGC; h++) {
        const int head = h0 + (h < heads ? h : 0);
        for (int d = 0; d < ROW; d++)
            q[h][d] = scale * M_LOG2E_F * (d < RKV ? q_latent[q_latent_offset + (size_t)t * q_latent_token_stride + (size_t)head * q_latent_head_stride + d]
                                       : q_rope[q_rope_offset + (size_t)t * q_rope_token_stride + (size_t)head * q_rope_head_stride + (d - RKV)]);
        for (int d = 0; d < RKV; d++)
            acc[h][d] = 0.0f;
    }
    for (int h = 0; h < HGV; h++) { /* padding heads see scores 0: finite, never stored */
        run_max[h] = -INFINITY;
        run_sum[h] = 0.0f;
        for (int kk = 0; kk < KTC; kk++)
            p[kk][h] = 0.0f;
    }

    for (int j0 = k_begin; j0 < k_end; j0 += KTC) {
        const int nk = min(KTC, k_end - j0);
#ifdef SPARSE
        /* the tile's positions: an entry that is no key, and a place past the end, take the row of
           the tile's first key (weight 0 below); a tile without keys adds nothing and is skipped */
        int kpos[KTC], first;
        const uint live = sparse_tile(list, j0, nk, ctx, kpos, &first); /* bit kk: entry kk is a key */
        if (!live)
            continue;
#endif
#ifdef CACHE_CONVERTS
        for (int kk = 0; kk < KTC; kk++) {
#ifdef SPARSE
            const int j = kpos[kk];
#else
            const int j = j0 + min(kk, nk - 1); /* past the end: repeat the last row, masked below */
#endif
            hrow[kk] = cache + ((size_t)table[j / block_tokens] * block_tokens + j % block_tokens) * CACHE_ROW_UNITS;
            for (int d = ROW8; d < ROW; d++)
                tile[kk][d] = CACHE_LOAD(hrow[kk], d);
        }
#else
        for (int kk = 0; kk < KTC; kk++) {
#ifdef SPARSE
            const int j = kpos[kk];
#else
            const int j = j0 + min(kk, nk - 1); /* past the end: repeat the last row, masked below */
#endif
            trow[kk] = cache + ((size_t)table[j / block_tokens] * block_tokens + j % block_tokens) * CACHE_ROW_UNITS;
        }
#endif
#ifdef CLMLA_PREFETCH
        __global const char *pf_rows[KTC]; /* the next tile's rows (past the end: the last row) */
        for (int kk = 0; kk < KTC; kk++) {
#ifdef SPARSE
            const int pp = list[min(j0 + KTC + kk, k_end - 1)];
            const int jp = pp >= 0 && pp < ctx ? pp : first;
#else
            const int jp = min(j0 + KTC + kk, k_end - 1);
#endif
            pf_rows[kk] = (__global const char *)(cache + ((size_t)table[jp / block_tokens] * block_tokens + jp % block_tokens) * CACHE_ROW_UNITS);
        }
        int pf_line = 0;
#endif
        /* scores, 2 heads x 4 keys per pass */
        for (int h = 0; h < HGC; h += 2) {
            for (int kk = 0; kk < KTC; kk += 4) {
                float8 s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
#ifdef CACHE_CONVERTS
                /* the first pass (h == 0) converts the tile as it goes; the others read it */
#define SCORE_STEP_CONVERT(d)                                                                       \
    do {                                                                                            \
        const float8 a = vload8(0, &q[h][d]), b = vload8(0, &q[h + 1][d]);                          \
        const float8 c0 = CACHE_LOAD8(hrow[kk], (d) / 8), c1 = CACHE_LOAD8(hrow[kk + 1], (d) / 8);  \
        const float8 c2 = CACHE_LOAD8(hrow[kk + 2], (d) / 8), c3 = CACHE_LOAD8(hrow[kk + 3], (d) / 8); \
        vstore8(c0, 0, &tile[kk][d]); vstore8(c1, 0, &tile[kk + 1][d]);                             \
        vstore8(c2, 0, &tile[kk + 2][d]); vstore8(c3, 0, &tile[kk + 3][d]);                         \
        s00 = fma(a, c0, s00); s01 = fma(a, c1, s01); s02 = fma(a, c2, s02); s03 = fma(a, c3, s03); \
        s10 = fma(b, c0, s10); s11 = fma(b, c1, s11); s12 = fma(b, c2, s12); s13 = fma(b, c3, s13); \
    } while (0)
#endif
#define SCORE_STEP(d)                                                                               \
    do {                                                                                            \
        const float8 a = vload8(0, &q[h][d]), b = vload8(0, &q[h + 1][d]);                          \
        const float8 c0 = vload8(0, TROW(kk) + (d)), c1 = vload8(0, TROW(kk + 1) + (d));            \
        const float8 c2 = vload8(0, TROW(kk + 2) + (d)), c3 = vload8(0, TROW(kk + 3) + (d));        \
        s00 = fma(a, c0, s00); s01 = fma(a, c1, s01); s02 = fma(a, c2, s02); s03 = fma(a, c3, s03); \
        s10 = fma(b, c0, s10); s11 = fma(b, c1, s11); s12 = fma(b, c2, s12); s13 = fma(b, c3, s13); \
    } while (0)
#ifdef CLMLA_PREFETCH
#define PREFETCH_LINE()                                                                             \
    for (int pl = 0; pl < PFL && pf_line < KTC * LPR; pl++, pf_line++)                              \
        __builtin_prefetch(pf_rows[pf_line / LPR] + pf_line % LPR * 64, 0, 3);
#else
#define PREFETCH_LINE()
#endif
                /* groups of PFS steps, one prefetched line per group; then the steps left over */
#define SCORE_PASS(STEP)                                                                            \
    do {                                                                                            \
        int d = 0;                                                                                  \
        for (; d + 8 * PFS <= ROW8; d += 8 * PFS) {                                                 \
            PREFETCH_LINE()                                                                         \
            _Pragma("unroll") for (int u = 0; u < PFS; u++) STEP(d + 8 * u);                        \
        }                                                                                           \
        for (; d < ROW8; d += 8)                                                                    \
            STEP(d);                                                                                \
    } while (0)
#ifdef CACHE_CONVERTS
                if (h == 0)
                    SCORE_PASS(SCORE_STEP_CONVERT);
                else
                    SCORE_PASS(SCORE_STEP);
#undef SCORE_STEP_CONVERT
#else
                SCORE_PASS(SCORE_STEP);
#endif
#undef SCORE_PASS
#undef PREFETCH_LINE
#undef SCORE_STEP
#ifdef CLMLA_HSUM8
                /* the eight horizontal sums together: halves, then even + odd lanes twice (3.7%
                   faster on PoCL than eight separate sums; oclgrind's uninitialised-value checker
                   crashes on these vector concatenations, so the portable form below is default) */
                const float8 u0 = (float8)(s00.lo + s00.hi, s01.lo + s01.hi), u1 = (float8)(s02.lo + s02.hi, s03.lo + s03.hi);
                const float8 u2 = (float8)(s10.lo + s10.hi, s11.lo + s11.hi), u3 = (float8)(s12.lo + s12.hi, s13.lo + s13.hi);
                const float8 v0 = (float8)(u0.even, u1.even) + (float8)(u0.odd, u1.odd);
                const float8 v1 = (float8)(u2.even, u3.even) + (float8)(u2.odd, u3.odd);
                const float4 r0 = v0.even + v0.odd, r1 = v1.even + v1.odd;
                float r00 = r0.s0, r01 = r0.s1, r02 = r0.s2, r03 = r0.s3;
                float r10 = r1.s0, r11 = r1.s1, r12 = r1.s2, r13 = r1.s3;
#else
#define HSUM(v) ((v).s0 + (v).s1 + (v).s2 + (v).s3 + (v).s4 + (v).s5 + (v).s6 + (v).s7)
                float r00 = HSUM(s00), r01 = HSUM(s01), r02 = HSUM(s02), r03 = HSUM(s03);
                float r10 = HSUM(s10), r11 = HSUM(s11), r12 = HSUM(s12), r13 = HSUM(s13);
#undef HSUM
#endif
                for (int d = ROW8; d < ROW; d++) {
                    r00 = fma(q[h][d], TROW(kk)[d], r00); r01 = fma(q[h][d], TROW(kk + 1)[d], r01);
                    r02 = fma(q[h][d], TROW(kk + 2)[d], r02); r03 = fma(q[h][d], TROW(kk + 3)[d], r03);
                    r10 = fma(q[h + 1][d], TROW(kk)[d], r10); r11 = fma(q[h + 1][d], TROW(kk + 1)[d], r11);
                    r12 = fma(q[h + 1][d], TROW(kk + 2)[d], r12); r13 = fma(q[h + 1][d], TROW(kk + 3)[d], r13);
                }
                p[kk][h] = r00; p[kk + 1][h] = r01; p[kk + 2][h] = r02; p[kk + 3][h] = r03;
                p[kk][h + 1] = r10; p[kk + 1][h + 1] = r11; p[kk + 2][h + 1] = r12; p[kk + 3][h + 1] = r13;
            }
        }
#ifdef MASK
        /* the caller's additive mask of the token's keys, the same for every head (base 2, as the
           scores); -inf makes a key no key */
        for (int kk = 0; kk < nk; kk++) {
            const float mb = vload_half(0, mask + mask_offset + (size_t)t * mask_stride + j0 + kk) * M_LOG2E_F;
            for (int h = 0; h < HGV; h++)
                p[kk][h] += mb;
        }
#endif
        /* online softmax, eight heads per vector; alpha rescales the accumulators when the
           maximum moves. Keys past the end (kk >= nk) get weight 0. */
        for (int v = 0; v < HGV / 8; v++) {
            const float8 m_old = vload8(v, run_max);
            float8 m = m_old;
            for (int kk = 0; kk < nk; kk++) {
#ifdef SPARSE
                if (!(live >> kk & 1u))
                    continue;
#endif
                const float8 x = vload8(v, p[kk]);
                m = select(m, x, x > m);
            }
#ifdef MASK
            /* every key so far masked: m is -inf, and the exponents below take -FLT_MAX instead,
               so that the weights and alpha are 0, not exp2(-inf + inf) */
            const float8 mx = fmax(m, (float8)(-FLT_MAX));
#else
            const float8 mx = m;
#endif
            const float8 a = exp2(m_old - mx); /* 0 on the first tile (m_old = -inf) */
            float8 sum = vload8(v, run_sum) * a;
            for (int kk = 0; kk < KTC; kk++) {
#ifdef SPARSE
                const float8 w = live >> kk & 1u ? exp2(vload8(v, p[kk]) - mx) : (float8)(0.0f);
#else
                const float8 w = kk < nk ? exp2(vload8(v, p[kk]) - mx) : (float8)(0.0f);
#endif
                vstore8(w, v, p[kk]);
                sum += w;
            }
            vstore8(m, v, run_max);
            vstore8(sum, v, run_sum);
            vstore8(a, v, alpha);
        }
        /* acc[h] = alpha[h] * acc[h] + sum_k p[h][k] * c_k: blocks of 4 heads x 16 values held in
           8 float8 registers over the tile's keys, so that each tile load feeds 4 fma */
        int h = 0;
        for (; h + 4 <= HGC; h += 4) {
            const float a0 = alpha[h], a1 = alpha[h + 1], a2 = alpha[h + 2], a3 = alpha[h + 3];
            int d = 0;
            for (; d + 16 <= RKV; d += 16) {
                float8 x00 = vload8(0, &acc[h][d]) * a0, x01 = vload8(0, &acc[h][d + 8]) * a0;
                float8 x10 = vload8(0, &acc[h + 1][d]) * a1, x11 = vload8(0, &acc[h + 1][d + 8]) * a1;
                float8 x20 = vload8(0, &acc[h + 2][d]) * a2, x21 = vload8(0, &acc[h + 2][d + 8]) * a2;
                float8 x30 = vload8(0, &acc[h + 3][d]) * a3, x31 = vload8(0, &acc[h + 3][d + 8]) * a3;
                #pragma unroll
                for (int kk = 0; kk < KTC; kk++) {
                    const float8 c0 = vload8(0, TROW(kk) + d), c1 = vload8(0, TROW(kk) + d + 8);
                    const float8 w0 = (float8)(p[kk][h]), w1 = (float8)(p[kk][h + 1]);
                    const float8 w2 = (float8)(p[kk][h + 2]), w3 = (float8)(p[kk][h + 3]);
                    x00 = fma(w0, c0, x00); x01 = fma(w0, c1, x01);
                    x10 = fma(w1, c0, x10); x11 = fma(w1, c1, x11);
                    x20 = fma(w2, c0, x20); x21 = fma(w2, c1, x21);
                    x30 = fma(w3, c0, x30); x31 = fma(w3, c1, x31);
                }
                vstore8(x00, 0, &acc[h][d]); vstore8(x01, 0, &acc[h][d + 8]);
                vstore8(x10, 0, &acc[h + 1][d]); vstore8(x11, 0, &acc[h + 1][d + 8]);
                vstore8(x20, 0, &acc[h + 2][d]); vstore8(x21, 0, &acc[h + 2][d + 8]);
                vstore8(x30, 0, &acc[h + 3][d]); vstore8(x31, 0, &acc[h + 3][d + 8]);
            }
            for (; d < RKV; d++) {
                float x0 = acc[h][d] * a0, x1 = acc[h + 1][d] * a1, x2 = acc[h + 2][d] * a2, x3 = acc[h + 3][d] * a3;
                for (int kk = 0; kk < KTC; kk++) {
                    const float c = TROW(kk)[d];
                    x0 = fma(p[kk][h], c, x0); x1 = fma(p[kk][h + 1], c, x1);
                    x2 = fma(p[kk][h + 2], c, x2); x3 = fma(p[kk][h + 3], c, x3);
                }
                acc[h][d] = x0; acc[h + 1][d] = x1; acc[h + 2][d] = x2; acc[h + 3][d] = x3;
            }
        }
        for (; h < HGC; h += 2) { /* HGC % 4 == 2: the last two heads, 2 heads x 16 values a block */
            const float a0 = alpha[h], a1 = alpha[h + 1];
            int d = 0;
            for (; d + 16 <= RKV; d += 16) {
                float8 x00 = vload8(0, &acc[h][d]) * a0, x01 = vload8(0, &acc[h][d + 8]) * a0;
                float8 x10 = vload8(0, &acc[h + 1][d]) * a1, x11 = vload8(0, &acc[h + 1][d + 8]) * a1;
                #pragma unroll
                for (int kk = 0; kk < KTC; kk++) {
                    const float8 c0 = vload8(0, TROW(kk) + d), c1 = vload8(0, TROW(kk) + d + 8);
                    const float8 w0 = (float8)(p[kk][h]), w1 = (float8)(p[kk][h + 1]);
                    x00 = fma(w0, c0, x00); x01 = fma(w0, c1, x01);
                    x10 = fma(w1, c0, x10); x11 = fma(w1, c1, x11);
                }
                vstore8(x00, 0, &acc[h][d]); vstore8(x01, 0, &acc[h][d + 8]);
                vstore8(x10, 0, &acc[h + 1][d]); vstore8(x11, 0, &acc[h + 1][d + 8]);
            }
            for (; d < RKV; d++) {
                float x0 = acc[h][d] * a0, x1 = acc[h + 1][d] * a1;
                for (int kk = 0; kk < KTC; kk++) {
                    x0 = fma(p[kk][h], TROW(kk)[d], x0);
                    x1 = fma(p[kk][h + 1], TROW(kk)[d], x1);
                }
                acc[h][d] = x0;
                acc[h + 1][d] = x1;
            }
        }
    }

    const size_t row0 = (size_t)t * num_splits + split;
    for (int h = 0; h < heads; h++) {
        const int head = h0 + h;
        const float l = run_sum[h];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int d = 0; d < RKV; d++)
            out[out_offset + (row0 * num_heads + head) * RKV + d] = acc[h][d] * inv;
        lse[lse_offset + row0 * num_heads + head] = l > 0.0f ? (run_max[h] + log2(l)) * M_LN2_F : -INFINITY;
    }
}

#ifdef ROWS_LANES
/* attn_latent_lanes: attn_latent_rows' work (one work-item per group of LHI = 16 x LHV heads, split
 * and token, keys in tiles of KTC, the same outputs) with the heads in the lanes of LHV float16s,
 * for CPUs with 16-lane vectors (the latent tuning's rows_lanes: LHV 1 or 2). The queries are held
 * transposed, q[d] the value d of 16 heads, and so are the accumulators, acc[d]: a score step takes
 * LHV query vectors and, for each key of the tile, one cache value broadcast to 16 lanes, LHV FMAs
 * per key into its own sums s[kk] (KTC x LHV independent chains); a value step takes 8 accumulator
 * vectors (LACC values of d by LHV) and, for each key, its LHV weight vectors and LACC broadcast
 * values. Every FMA is 16 lanes wide, a broadcast is a scalar load the FMA can take from memory (or,
 * with LHV 2, one register for two FMAs), the softmax is vertical, and nothing is summed across
 * lanes. Heads past the last of a group repeat the group's first head; they are computed
 * and never stored. f32 rows are read in place; other caches' tiles are converted into private
 * memory first. With CLMLA_PREFETCH the next tile's rows are prefetched a line every LPF score
 * steps, so its misses overlap this tile's arithmetic.
 * With -D LFOLD (LHV 2, never with SPARSE; multi-token decode with 16 to 31 heads) the two vectors
 * are the same 16 heads of two consecutive tokens of one sequence (token_first and query_len as
 * attn_latent's FOLD: the item on the second token of a pair stops at once), so each cache value
 * feeds both tokens' FMAs; each vector keeps its own token's keys, and in a tile past the shorter
 * token's last key a weight of 0 adds nothing (not 0 times a value that may not be finite). */
#define LH 16 /* heads per vector: the lanes of a float16 */
#ifndef LHV
#define LHV 1 /* vectors of heads per item: each broadcast value feeds LHV FMAs */
#endif
#define LHI (LH * LHV) /* heads per item (with LFOLD: lanes per item, LH heads of 2 tokens) */
#if defined(LFOLD) && (LHV != 2 || defined(SPARSE))
#error "LFOLD takes two vectors and no SPARSE"
#endif
#define LPF 2 /* score steps per group, each group prefetching LPFN lines */
#define LPFN ((KTC * LPR + ROW / LPF - 1) / (ROW / LPF)) /* the next tile's lines over the groups */
#ifndef LACC
#define LACC (8 / LHV) /* values of d per block of the value step: LACC x LHV independent chains */
#endif
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void attn_latent_lanes(__global const float *q_latent, const int q_latent_offset, const int q_latent_token_stride,
                       const int q_latent_head_stride,
                       __global const float *q_rope, const int q_rope_offset, const int q_rope_token_stride,
                       const int q_rope_head_stride,
                       __global const CACHE_T *cache,
                       __global const int *block_table, const int max_blocks_per_seq, const int block_tokens,
                       __global const int *token_seq, __global const int *token_ctx_len,
                       const int num_heads, const int num_splits, const int split_tokens, const float scale,
                       __global float *out, const int out_offset, __global float *lse, const int lse_offset
#ifdef SPARSE
                       , __global const int *indices, const int indices_offset, const int topk
#endif
#ifdef LFOLD
                       , __global const int *token_first, const int query_len
#endif
                       , const ulong cache_offset /* the rows start this many CACHE_T units into `cache` */
                       )
{
    cache += cache_offset;
#ifdef LFOLD
    /* tokens t and, where it is of the same group, t + 1 (nq of them); LTOK(v): vector v's token.
       The grid is (head group, token, split), so that the items that stop at once (a pair's second
       token) alternate with working ones in any contiguous range of the grid */
    const int t = get_global_id(1);
    const int split = get_global_id(2);
    const int h0 = get_global_id(0) * LH;
    const int first = LATENT_RUN_FIRST(t);
    if ((t - first) % 2)
        return;
    const int nq = t + 1 < (int)get_global_size(1) && LATENT_RUN_FIRST(t + 1) == first ? 2 : 1;
    const int ctxv[2] = {token_ctx_len[t], nq > 1 ? token_ctx_len[t + 1] : 0};
    const int ctx = max(ctxv[0], ctxv[1]), ctx_min = nq > 1 ? min(ctxv[0], ctxv[1]) : ctxv[0];
#define LTOK(v) (t + ((v) < nq ? (v) : 0))
    const int heads = min(LH, num_heads - h0);
#else
    const int split = get_global_id(1);
    const int t = get_global_id(2);
    const int h0 = get_global_id(0) * LHI;
    const int ctx = token_ctx_len[t];
#define LTOK(v) t
#endif
    /* keys (SPARSE: entries of the token's index list) k_begin .. k_end-1 */
    const int k_begin = split * split_tokens, k_end = LATENT_KEYS_END(ctx, k_begin);
#ifdef SPARSE
    __global const int *list = LATENT_LIST(t);
#endif
    __global const int *table = block_table + (size_t)token_seq[t] * max_blocks_per_seq;
#ifndef LFOLD
    const int heads = min(LHI, num_heads - h0);
#endif

    float16 q[ROW * LHV];   /* q[d * LHV + v]: value d of heads 16v.. of [q~ ; q^R], pre-scaled by `scale` * log2(e) */
    float16 acc[RKV * LHV]; /* acc[d * LHV + v]: value d of those heads' outputs, unnormalised */
#ifdef CACHE_CONVERTS
    float tile[KTC][ROW];
    __global const CACHE_T *hrow[KTC];
#define LROW(kk) (tile[kk])
#else
    __global const float *trow[KTC];
#define LROW(kk) (trow[kk])
#endif
    float16 run_max[LHV], run_sum[LHV];
#pragma unroll
    for (int v = 0; v < LHV; v++) {
        run_max[v] = (float16)(-INFINITY);
        run_sum[v] = (float16)(0.0f);
    }

    {
        float *qs = (float *)q;
        for (int h = 0; h < LHI; h++) {
#ifdef LFOLD
            const int tq = LTOK(h / LH), hh = h % LH;
#else
            const int tq = t, hh = h;
#endif
            const int head = h0 + (hh < heads ? hh : 0);
            __global const float *ql = q_latent + q_latent_offset + (size_t)tq * q_latent_token_stride + (size_t)head * q_latent_head_stride;
            __global const float *qr = q_rope + q_rope_offset + (size_t)tq * q_rope_token_stride + (size_t)head * q_rope_head_stride;
            for (int d = 0; d < ROW; d++)
                qs[d * LHI + h] = scale * M_LOG2E_F * (d < RKV ? ql[d] : qr[d - RKV]);
        }
        for (int d = 0; d < RKV * LHV; d++)
            acc[d] = (float16)(0.0f);
    }

    for (int j0 = k_begin; j0 < k_end; j0 += KTC) {
        const int nk = min(KTC, k_end - j0);
#ifdef SPARSE
        int kpos[KTC], first;
        const uint live = sparse_tile(list, j0, nk, ctx, kpos, &first); /* bit kk: entry kk is a key */
        if (!live)
            continue;
#define LKEY(kk) kpos[kk]
#define LLIVE(kk) (live >> (kk) & 1u)
#else
#define LKEY(kk) (j0 + min((kk), nk - 1)) /* past the end: repeat the last row, weight 0 below */
#define LLIVE(kk) ((kk) < nk)
#endif
#ifdef LFOLD
#define LLIVEV(kk, v) (LLIVE(kk) && j0 + (kk) < ctxv[v]) /* key kk of the tile, for vector v's token */
#else
#define LLIVEV(kk, v) LLIVE(kk)
#endif
        for (int kk = 0; kk < KTC; kk++) {
            const int j = LKEY(kk);
            __global const CACHE_T *r = cache + ((size_t)table[j / block_tokens] * block_tokens + j % block_tokens) * CACHE_ROW_UNITS;
#ifdef CACHE_CONVERTS
            hrow[kk] = r;
#else
            trow[kk] = r;
#endif
        }
#ifdef CACHE_CONVERTS
        for (int kk = 0; kk < KTC; kk++) {
#if defined(CACHE_FP8) && defined(CLMLA_FP8_HALF)
            /* c^KV 16 codes at a time (RKV is whole blocks of 128), then k^R as below */
            for (int d16 = 0; d16 < RKV / 16; d16++) {
                float16 v;
                dt_e4m3x16h(vload16(d16, hrow[kk]), &v);
                v *= DT_E4M3_UNIT * FP8_SCALES(hrow[kk])[d16 / 8];
                V16_STORE(v, d16, tile[kk]);
            }
            for (int d8 = RKV / 8; d8 < ROW / 8; d8++)
#else
            for (int d8 = 0; d8 < ROW / 8; d8++)
#endif
                vstore8(CACHE_LOAD8(hrow[kk], d8), d8, tile[kk]);
            for (int d = ROW8; d < ROW; d++)
                tile[kk][d] = CACHE_LOAD(hrow[kk], d);
        }
#endif
#ifdef CLMLA_PREFETCH
        __global const char *pf_rows[KTC]; /* the next tile's rows (past the end: the last row) */
        for (int kk = 0; kk < KTC; kk++) {
#ifdef SPARSE
            const int pp = list[min(j0 + KTC + kk, k_end - 1)];
            const int jp = pp >= 0 && pp < ctx ? pp : first;
#else
            const int jp = min(j0 + KTC + kk, k_end - 1);
#endif
            pf_rows[kk] = (__global const char *)(cache + ((size_t)table[jp / block_tokens] * block_tokens + jp % block_tokens) * CACHE_ROW_UNITS);
        }
        int pf_line = 0;
#define LANES_PREFETCH()                                                                            \
    _Pragma("unroll") for (int pfi = 0; pfi < LPFN; pfi++) {                                        \
        if (pf_line < KTC * LPR) {                                                                  \
            __builtin_prefetch(pf_rows[pf_line / LPR] + pf_line % LPR * 64, 0, 3);                  \
            pf_line++;                                                                              \
        }                                                                                           \
    }
#else
#define LANES_PREFETCH()
#endif
        /* scores of the 16 heads against the tile's keys, one chain per key */
        float16 s[KTC * LHV]; /* s[kk * LHV + v] */
#pragma unroll
        for (int kk = 0; kk < KTC * LHV; kk++)
            s[kk] = (float16)(0.0f);
        int d = 0;
        for (; d + LPF <= ROW; d += LPF) {
            LANES_PREFETCH()
#pragma unroll
            for (int u = 0; u < LPF; u++) {
#pragma unroll
                for (int kk = 0; kk < KTC; kk++) {
                    const float16 c = (float16)(LROW(kk)[d + u]);
#pragma unroll
                    for (int v = 0; v < LHV; v++)
                        s[kk * LHV + v] = V16_FMA(q[(d + u) * LHV + v], c, s[kk * LHV + v]);
                }
            }
        }
        for (; d < ROW; d++) {
#pragma unroll
            for (int kk = 0; kk < KTC; kk++) {
                const float16 c = (float16)(LROW(kk)[d]);
#pragma unroll
                for (int v = 0; v < LHV; v++)
                    s[kk * LHV + v] = V16_FMA(q[d * LHV + v], c, s[kk * LHV + v]);
            }
        }
#undef LANES_PREFETCH
        /* online softmax across the tile, the 16 heads at once */
        float16 a[LHV];
#pragma unroll
        for (int v = 0; v < LHV; v++) {
            float16 m = run_max[v];
#pragma unroll
            for (int kk = 0; kk < KTC; kk++)
                if (LLIVEV(kk, v))
                    m = V16_SELECT(m, s[kk * LHV + v], s[kk * LHV + v] > m);
            a[v] = V16_EXP2(run_max[v] - m); /* 0 on the first tile (run_max = -inf) */
#ifdef LFOLD
            /* no key of this token yet (a split, or tiles, past its last key): nothing to rescale */
            a[v] = V16_SELECT(a[v], (float16)(1.0f), m == (float16)(-INFINITY));
#endif
            float16 sum = run_sum[v] * a[v];
#pragma unroll
            for (int kk = 0; kk < KTC; kk++) {
                s[kk * LHV + v] = LLIVEV(kk, v) ? V16_EXP2(s[kk * LHV + v] - m) : (float16)(0.0f);
                sum += s[kk * LHV + v];
            }
            run_max[v] = m;
            run_sum[v] = sum;
        }
        /* acc[d] = a * acc[d] + sum_kk p[kk] * c_kk[d], LACC values of d at a time; LVALUES(ADD) with
           ADD(kk, v, c, x) the update of x by key kk's value c for vector v */
#define LVALUES(ADD)                                                                                \
    {                                                                                               \
        d = 0;                                                                                      \
        for (; d + LACC <= RKV; d += LACC) {                                                        \
            float16 x[LACC * LHV]; /* x[i * LHV + v] */                                             \
            _Pragma("unroll") for (int i = 0; i < LACC * LHV; i++) x[i] = acc[d * LHV + i] * a[i % LHV]; \
            _Pragma("unroll") for (int kk = 0; kk < KTC; kk++) {                                    \
                _Pragma("unroll") for (int i = 0; i < LACC; i++) {                                  \
                    const float16 c = (float16)(LROW(kk)[d + i]);                                   \
                    _Pragma("unroll") for (int v = 0; v < LHV; v++) x[i * LHV + v] = ADD(kk, v, c, x[i * LHV + v]); \
                }                                                                                   \
            }                                                                                       \
            _Pragma("unroll") for (int i = 0; i < LACC * LHV; i++) acc[d * LHV + i] = x[i];         \
        }                                                                                           \
        for (; d < RKV; d++) {                                                                      \
            _Pragma("unroll") for (int v = 0; v < LHV; v++) {                                       \
                float16 x = acc[d * LHV + v] * a[v];                                                \
                _Pragma("unroll") for (int kk = 0; kk < KTC; kk++) x = ADD(kk, v, (float16)(LROW(kk)[d]), x); \
                acc[d * LHV + v] = x;                                                               \
            }                                                                                       \
        }                                                                                           \
    }
#define LADD(kk, v, c, x) V16_FMA(s[(kk) * LHV + (v)], (c), (x))
#ifdef LFOLD
#define LADD_GUARDED(kk, v, c, x) (LLIVEV(kk, v) ? V16_FMA(s[(kk) * LHV + (v)], (c), (x)) : (x))
        if (j0 + nk > ctx_min) /* keys that one of the tokens does not see */
            LVALUES(LADD_GUARDED)
        else
#endif
            LVALUES(LADD)
#undef LVALUES
#undef LADD
#undef LADD_GUARDED
#undef LKEY
#undef LLIVE
#undef LLIVEV
    }

    const float *accs = (const float *)acc, *sums = (const float *)run_sum, *maxs = (const float *)run_max;
    for (int h = 0; h < LHI; h++) {
#ifdef LFOLD
        if (h / LH >= nq || h % LH >= heads)
            continue;
        const size_t row0 = (size_t)(t + h / LH) * num_splits + split;
        const int head = h0 + h % LH;
#else
        if (h >= heads)
            break;
        const size_t row0 = (size_t)t * num_splits + split;
        const int head = h0 + h;
#endif
        const float l = sums[h];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int d = 0; d < RKV; d++)
            out[out_offset + (row0 * num_heads + head) * RKV + d] = accs[d * LHI + h] * inv;
        lse[lse_offset + row0 * num_heads + head] = l > 0.0f ? (maxs[h] + log2(l)) * M_LN2_F : -INFINITY;
    }
}
#undef LROW
#undef LTOK
#undef LH
#undef LHV
#undef LHI
#undef LPF
#undef LPFN
#undef LACC
#endif
