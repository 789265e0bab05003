/* attn_latent_mma: the latent attention of cl/attn_latent.cl (same arguments, outputs and splits;
 * dense, or with -D SPARSE over each token's index list, or with -D FOLD=F the rows of up to F
 * query tokens of a sequence in one work-group, as attn_latent defines them: an entry that is no
 * key, or a key past a folded token's own context, scores -inf and weighs 0) over a cache of any
 * dtype (bfloat16, fp8, float16, float32), its two products on NVIDIA's tensor cores: warp-wide
 * mma.sync with float32 accumulators, issued as inline PTX (CLMLA_PTX_MMA, set by the host on NVIDIA
 * devices of compute capability 8.0 and later).
 * Elsewhere (CPU devices, for the tests) each mma is computed by the warp's 32 items through local
 * memory, in the same fragment layouts, so that everything but the instruction itself runs and is
 * checked on any device. Experimental: the latent tuning's group_mma.
 *
 * Precision. bf16 cache (m16n8k16, bf16 operands): the cache's values are bf16 already, so only the
 * scaled queries and the softmax weights need rounding; each is split into two bf16 terms, hi =
 * bf16(x) and lo = bf16(x - hi), one mma per term: x - hi - lo is within 2^-16 |x|, about 16
 * significant bits where FlashMLA keeps bf16's 8. fp8 cache (FlashMLA's rows, cl/prelude.cl): the
 * same products, every e4m3 code being a bf16 value exactly (dt_e4m3_bf16), the scales applied
 * outside them: to each block of 128 values' scores, summed apart, and to the weights before they
 * are split. f16 cache (m16n8k16, f16 operands): as bf16, the terms in f16 (about 22 bits kept),
 * each query row first scaled by a power of two into f16's range (below, OP16). f32 cache
 * (m16n8k8, tf32 operands): every operand in two terms, three products each (below, "a float32
 * cache").
 *
 * Work-group: NT = 128 items, four warps of 32 (lane = lid % 32, warp = lid / 32; a lane's group
 * g = lane / 4 and place t = lane % 4 in it, as PTX's fragment layouts name them); HG <= 16 rows
 * of the m16 products (heads; with FOLD, HT heads of each of FOLD tokens; rows past HG zero),
 * keys [split*split_tokens, ..) in tiles of TK = 64.
 *   A. scores S[16 heads][64 keys]: warp w takes keys 16w .. 16w+15, two products of 8 keys (their
 *      n8), over the whole row: lane (g, t) loads its values of each step of keys 16w + g and
 *      16w + 8 + g, one 16-byte load each (bf16: values 8t .. 8t+7 of 32, a warp reading eight
 *      64-byte runs a key set), the B operands; the A operands, the queries, come from local memory
 *      in the same order, each read serving both key sets (the queries' reads from local memory,
 *      36 KiB a warp and tile, set the pace where tiles are short). The k dimension of a product is
 *      a sum, so any order of it serves as long as A and B agree: bf16's fragment k 2t, 2t+1, 2t+8,
 *      2t+9 of the first product are values 8t .. 8t+3 of the step, of the second 8t+4 .. 8t+7.
 *      QU steps' loads are in flight together.
 *   B. online softmax as in attn_latent, 8 items per head (lid / 8 the head, 8 keys each).
 *   C. values: warp w owns RKV/4 value columns. bf16: in blocks of 64 of which lane (g, t) loads
 *      the 8 values 8g .. 8g+7 (one 16-byte load; fp8, 8 bytes) of the 4 keys 4t .. 4t+3 of each
 *      16-key step; value e of the 8 is column g of the block's n-tile e, so that two keys' values
 *      of a column pair up into one B register by a shift and a mask, and a lane's accumulators hold
 *      columns 16t + e and 16t + 8 + e (e < 8) of heads g and g + 8: two 8-float runs of each
 *      output row.
 * Needs RKV a multiple of 256 and RKV + DR a multiple of 32 (every preset of docs/MODELS.md); the
 * host runs attn_latent elsewhere. Local memory (host/mla/attention.c, mma_local_bytes): 45.9 KiB
 * at RKV 512, DR 64 over bf16 (f16: 128 bytes more), 42.1 over fp8, 41.1 over f32 (3 KiB more
 * for the emulation's exchange; SPARSE 256 bytes more), within the 48 KiB NVIDIA's OpenCL gives a
 * work-group. */
#ifndef HG
#define HG 16
#endif
/* FOLD and HT (multi-token decode, as in attn_latent): their defaults are cl/prelude.cl's */
/* the host builds it for caches of these shapes only; other options leave the file empty */
#if RKV % 256 == 0 && (RKV + DR) % 32 == 0 && HG <= 16
#if defined(CACHE_BF16) || defined(CACHE_FP8) || defined(CACHE_F16)
#define MMA16 /* 16-bit operands: bf16 (the cache's values, or fp8 codes decoded to bf16 exactly), or
                 f16 over an f16 cache */
#endif
#if defined(CACHE_BF16) || defined(CACHE_F16)
#define ROW16 /* the cache's values are the B operands as stored, 2 bytes each */
#endif
#define ROW_AT(slot) (cache + (size_t)(slot) * CACHE_ROW_UNITS) /* a cache row (fp8: its bytes) */
#define NT 128
#define ROW (RKV + DR)
#define TK 64
#define KB (TK / 8)                                 /* keys per item in the softmax step */
#ifndef QU
#define QU 3                                        /* score steps whose loads are in flight together */
#endif
/* row h of the products: token tok + VTOK(h), head VHEAD(h) (with FOLD, rows i*HT .. i*HT + HT-1
   are token tok + i's heads); LIVE: a row whose results are stored */
#if FOLD > 1
#define VTOK(h) ((h) / HT)
#define VHEAD(h) (h0 + (h) % HT)
#define LIVE(h) ((h) < HG && (h) / HT < nq && h0 + (h) % HT < num_heads)
#else
#define VTOK(h) 0
#define VHEAD(h) (h0 + (h))
#define LIVE(h) ((h) < HG && h0 + (h) < num_heads)
#endif
#define OUT_ROW(h) (((size_t)(tok + VTOK(h)) * num_splits + split) * num_heads + VHEAD(h))
/* the queries' addresses of row h of this group */
#define Q_LATENT(h)                                                                                 \
    (q_latent + q_latent_offset + (size_t)(tok + VTOK(h)) * q_latent_token_stride +                 \
     (size_t)VHEAD(h) * q_latent_head_stride)
#define Q_ROPE(h)                                                                                   \
    (q_rope + q_rope_offset + (size_t)(tok + VTOK(h)) * q_rope_token_stride + (size_t)VHEAD(h) * q_rope_head_stride)

#ifdef MMA16
#define QP (ROW / 2)                                /* bf16 pairs of a query row, a multiple of 16 */
/* uint4 j of query row h in local memory: rows of QP / 4 uint4s, those of odd rows swapped by
   halves of 8 where a row is a multiple of 32 uints, so that the 8 lanes of rows g and g + 1 that
   one 16-byte access serves (t, j = 4v + t) meet 8 distinct 4-bank groups either way */
#if QP % 32 == 0
#define QIDX(h, j) ((h) * (QP / 4) + ((j) ^ 4 * ((h) & 1)))
#else
#define QIDX(h, j) ((h) * (QP / 4) + (j))
#endif
#define PS 40                                       /* stride of a row of weights' pairs, in uints */
#define NB (RKV / 256)                              /* blocks of 64 value columns per warp */
#ifdef CACHE_FP8
#define NSB (RKV / 128)                             /* a row's scales */
#define SCS (TK + 4)                                /* stride of a row of scores, then weights */
/* 8 e4m3 codes (the first in the low byte of c.x) as 4 pairs of bf16 bits of their values (the
   first of each pair in the low half), the layout of 8 values loaded from a bf16 row */
inline uint4 e4m3x8_bf16(const uint2 c)
{
    return (uint4)(dt_e4m3_bf16(c.x) | dt_e4m3_bf16(c.x >> 8) << 16, dt_e4m3_bf16(c.x >> 16) | dt_e4m3_bf16(c.x >> 24) << 16,
                   dt_e4m3_bf16(c.y) | dt_e4m3_bf16(c.y >> 8) << 16, dt_e4m3_bf16(c.y >> 16) | dt_e4m3_bf16(c.y >> 24) << 16);
}
#else
#define SCS (TK + 1)                                /* stride of a row of scores */
#endif

/* OP16(x): float x rounded to the operands' 16-bit type (its bits); OP16_VALUE(b): those bits'
   value */
#ifdef CACHE_F16
inline ushort f16_bits(const float x)
{
    ushort b;
    vstore_half_rte(x, 0, (__private half *)&b);
    return b;
}
inline float f16_value(const ushort b)
{
    return vload_half(0, (const __private half *)&b);
}
#define OP16(x) f16_bits(x)
#define OP16_VALUE(b) f16_value(b)
/* Over f16, whose range is short (largest 65504, normal down to 2^-14), each query row is scaled
   by a power of two that puts its largest magnitude in [2^14, 2^15) (its scores scaled back once
   computed), so that no term overflows. The softmax weights (at most 1) are split as they are:
   a lo term below 2^-14 is subnormal, 2^-25 absolute at worst a weight (measured: the outputs of
   16384 keys within 8e-7 of float64 either way, docs/DESIGN.md) */
#else
#define OP16(x) dt_to_bf16(x)
#define OP16_VALUE(b) dt_bf16(b)
#endif
/* float to hi and lo terms of the operands' type, as the low and high halves of pairs */
inline uint pair16(const float x0, const float x1, const int lo)
{
    ushort a = OP16(x0), b = OP16(x1);
    if (lo) {
        a = OP16(x0 - OP16_VALUE(a));
        b = OP16(x1 - OP16_VALUE(b));
    }
    return (uint)a | (uint)b << 16;
}

#define NACC (NB * 8)                               /* the accumulators' n-tiles */
#define SCORE_T uint4                               /* a lane's load of a score step of a key */
#define SCORE_STEPS (ROW / 32)
#define MMA_P 2                                     /* operands a 32-bit register holds */
#define MMA_K 16

#ifdef CACHE_F16
#define MMA_TYPES "f16.f16"
#else
#define MMA_TYPES "bf16.bf16"
#endif
#ifdef CLMLA_PTX_MMA
/* d (4 floats) += A (16 x 16 bf16 or f16, 4 registers) B (16 x 8, 2 registers) over the warp */
#define MMA(d, a0, a1, a2, a3, b0, b1)                                                              \
    __asm__ __volatile__("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPES ".f32 "                \
                         "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"        \
                         : "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3])                   \
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
#else
#define MMA(d, a0, a1, a2, a3, b0, b1) mma_emulated((d), (a0), (a1), (a2), (a3), (b0), (b1), mx, lane)
#endif

#else /* ---- a float32 cache: the products in tf32, each operand split in two ---------------- */
/* The cache's values are float32, so they are split too: x = hi + lo with hi = x's top 19 bits (a
   tf32 value exactly) and lo = x - hi, which the instruction reads to its own top 19 bits (about
   2^-21 |x| lost); a product a b is ah bh + al bh + ah bl, three mma.sync.m16n8k8 (tf32, float32
   sums), al bl (about 2^-20 of it) left out, as CUTLASS's 3xTF32 does. Layouts (PTX ISA, and
   CuTe's SM80 16x8x8 tf32 atom): A register r of lane (g, t) is row g + 8 (r & 1), column
   t + 4 (r >> 1); B register r is row t + 4r, column g; D as above. */
#define QIDX(h, j) ((h) * (ROW / 4) + ((j) ^ 4 * ((h) & 1))) /* float4 j of query row h (ROW / 4 a multiple of 8) */
#define SCS (TK + 4)                                         /* stride of a row of scores, then weights */
#define NC (RKV / 128)                                       /* groups of 32 value columns per warp */
#define NACC (NC * 4)                                        /* the accumulators' n-tiles */
#define SCORE_T float4                                       /* a lane's load of a score step of a key */
#define SCORE_STEPS (ROW / 16)
#define MMA_P 1
#define MMA_K 8
#define TF_HI(x) as_float(as_uint(x) & 0xFFFFE000u)

#ifdef CLMLA_PTX_MMA
#define MMA_TF32(d, a0, a1, a2, a3, b0, b1)                                                         \
    __asm__ __volatile__("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "                     \
                         "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"        \
                         : "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3])                   \
                         : "r"(as_uint(a0)), "r"(as_uint(a1)), "r"(as_uint(a2)), "r"(as_uint(a3)),  \
                           "r"(as_uint(b0)), "r"(as_uint(b1)))
#else
#define MMA_TF32(d, a0, a1, a2, a3, b0, b1)                                                         \
    mma_emulated((d), as_uint(a0), as_uint(a1), as_uint(a2), as_uint(a3), as_uint(b0), as_uint(b1), mx, lane)
#endif
/* d += a b in three products: a (4 values, A's registers) and b (2, B's) with their hi parts ah, bh */
#define MMA3(d, a0, a1, a2, a3, b0, b1)                                                             \
    {                                                                                               \
        const float h0_ = TF_HI(a0), h1_ = TF_HI(a1), h2_ = TF_HI(a2), h3_ = TF_HI(a3);             \
        const float bh0_ = TF_HI(b0), bh1_ = TF_HI(b1);                                             \
        MMA_TF32(d, h0_, h1_, h2_, h3_, bh0_, bh1_);                                                \
        MMA_TF32(d, (a0) - h0_, (a1) - h1_, (a2) - h2_, (a3) - h3_, bh0_, bh1_);                    \
        MMA_TF32(d, h0_, h1_, h2_, h3_, (b0) - bh0_, (b1) - bh1_);                                  \
    }
#endif /* MMA16 */

#ifdef CLMLA_PTX_MMA
#define MMA_SCRATCH
#define MMA_UNROLL _Pragma("unroll")
#else
/* An mma by the warp's items through local memory (x: this warp's 32 x 6 uints), in PTX's layouts
   of m16n8k16 with bf16 operands (MMA_P 2 a register) or of m16n8k8 with tf32 ones (MMA_P 1, read
   to their top 19 bits as the instruction does): with kh = MMA_K / 2, A register r of lane (g, t)
   holds row g + 8 (r & 1), columns MMA_P t + kh (r >> 1) and on (the low half first); B register r
   holds rows MMA_P t + kh r and on of column g; D element i is row g + 8 (i >> 1), column
   2t + (i & 1). Every item of the work-group calls it alike. Loops of products stay loops
   (MMA_UNROLL): each copy of a product is two more barriers for the compiler to split the
   work-group's code at (PoCL took minutes to build the unrolled kernel). */
#define MMA_SCRATCH __local uint mx_all[NT * 6];
#define MMA_UNROLL _Pragma("unroll 1")
inline float mma_operand(const uint x, const int sub)
{
#ifdef MMA16
    return OP16_VALUE((ushort)(x >> 16 * sub));
#else
    return as_float(x & 0xFFFFE000u);
#endif
}
/* s += the products of a register of A and one of B, value by value (sub 0 first) */
#if defined(MMA16) && !defined(CACHE_F16)
/* bf16: the low half's value is the register shifted up, the high half's the register with its low
   half cleared (dt_bf16's conversion, written out) */
#define MMA_TERMS(s, a, b)                                                                          \
    do {                                                                                            \
        s = fma(as_float((a) << 16), as_float((b) << 16), s);                                       \
        s = fma(as_float((a) & 0xFFFF0000u), as_float((b) & 0xFFFF0000u), s);                       \
    } while (0)
#elif defined(MMA16)
#define MMA_TERMS(s, a, b)                                                                          \
    do {                                                                                            \
        s = fma(mma_operand(a, 0), mma_operand(b, 0), s);                                           \
        s = fma(mma_operand(a, 1), mma_operand(b, 1), s);                                           \
    } while (0)
#else
#define MMA_TERMS(s, a, b) s = fma(as_float((a) & 0xFFFFE000u), as_float((b) & 0xFFFFE000u), s)
#endif
inline void mma_emulated(float *d, const uint a0, const uint a1, const uint a2, const uint a3, const uint b0,
                         const uint b1, __local uint *x, const int lane)
{
    x[lane * 6] = a0;
    x[lane * 6 + 1] = a1;
    x[lane * 6 + 2] = a2;
    x[lane * 6 + 3] = a3;
    x[lane * 6 + 4] = b0;
    x[lane * 6 + 5] = b1;
    barrier(CLK_LOCAL_MEM_FENCE);
    /* k = hi * kh + owner * MMA_P + sub in order: A's row r and B's column c are held by the 4
       lanes 4 (r % 8) .. + 3 and 4 c .. + 3 (the owners), MMA_P values a register */
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int r = g + 8 * (i >> 1), c = 2 * t + (i & 1);
        __local const uint *ar = x + (r % 8) * 24 + (r >= 8), *bc = x + c * 24 + 4;
        float s = d[i];
        for (int hi = 0; hi < 2; hi++)
            for (int owner = 0; owner < MMA_K / 2 / MMA_P; owner++) {
                const uint a = ar[owner * 6 + 2 * hi], b = bc[owner * 6 + hi];
                MMA_TERMS(s, a, b);
            }
        d[i] = s;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#endif

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void attn_latent_mma(__global const float *q_latent, const int q_latent_offset, const int q_latent_token_stride,
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
#if FOLD > 1
                     , __global const int *token_first, const int query_len
#endif
                     , const ulong cache_offset /* the rows start this many CACHE_T units into `cache` */
                     )
{
    cache += cache_offset;
#ifdef MMA16
    __local uint4 qh4[16 * QP / 4], ql4[16 * QP / 4]; /* the scaled queries' hi and lo terms, bf16 pairs (QIDX) */
#endif
#ifdef CACHE_F16
    __local float qsc_l[16], qinv_l[16];                /* each query row's power of two, its inverse */
#endif
#ifdef ROW16
    __local uint2 ph2[16 * PS / 2], pl2[16 * PS / 2];  /* the weights' terms, pairs [head][key / 2] */
    __local uint *ph = (__local uint *)ph2, *pl = (__local uint *)pl2;
#elif defined(CACHE_FP8)
    __local float scale_l[TK * NSB];                    /* the tile's rows' scales [key][block] */
#else
    __local float4 q4[16 * ROW / 4]; /* the scaled queries (QIDX) */
#endif
    __local float sc[16 * SCS];      /* the tile's scores [head][key] (f32: then its weights) */
    __local float red[8 * 16];       /* [part][head]: maxima, at the end sums */
    __local float alpha_l[16], lsum_l[16];
    __local int slot_l[TK];
#ifdef SPARSE
    __local int live_l[TK];          /* the tile's entry is a key (a position in [0, ctx)) */
#endif
    MMA_SCRATCH

    const int lid = get_local_id(0), lane = lid % 32, warp = lid / 32, g = lane / 4, t = lane % 4;
#ifndef CLMLA_PTX_MMA
    __local uint *mx = mx_all + warp * 32 * 6;
#endif
    const int split = get_global_id(1), tok = get_global_id(2);
#if FOLD > 1
    /* the group's tokens tok .. tok+nq-1 of one sequence (attn_latent's rule): the group on a token
       that does not begin a run of FOLD stops at once, the same for all its items */
    const int h0 = get_group_id(0) * HT;
    const int first = LATENT_RUN_FIRST(tok);
    if ((tok - first) % FOLD)
        return;
    const int tokens = get_global_size(2);
    int nq = 1, ctx = token_ctx_len[tok]; /* ctx: the most keys of the group's tokens */
    while (nq < FOLD && tok + nq < tokens && LATENT_RUN_FIRST(tok + nq) == first)
        ctx = max(ctx, token_ctx_len[tok + nq++]);
    /* rows g and g + 8's own keys (causal among the new tokens; 0 for rows not stored) */
    const int lim_g = LIVE(g) ? token_ctx_len[tok + VTOK(g)] : 0;
    const int lim_g8 = LIVE(g + 8) ? token_ctx_len[tok + VTOK(g + 8)] : 0;
#else
    const int h0 = get_group_id(0) * HG, ctx = token_ctx_len[tok];
#endif
    /* keys (SPARSE: entries of the token's index list) k_begin .. k_end-1 */
    const int k_begin = split * split_tokens, k_end = LATENT_KEYS_END(ctx, k_begin);
#ifdef SPARSE
    __global const int *list = LATENT_LIST(tok);
#endif
    __global const int *table = block_table + (size_t)token_seq[tok] * max_blocks_per_seq;
    if (k_end <= k_begin) { /* no keys: out 0, lse -inf (as attn_latent) */
        for (int h = 0; h < HG; h++) {
            if (!LIVE(h))
                continue;
            for (int d = lid; d < RKV; d += NT)
                out[out_offset + OUT_ROW(h) * RKV + d] = 0.0f;
            if (lid == 0)
                lse[lse_offset + OUT_ROW(h)] = -INFINITY;
        }
        return;
    }

#ifdef CACHE_F16
    /* f16: each query row's largest magnitude (8 items a row), then the power of two 2^k that puts
       it in [2^14, 2^15) (k within +-120: a float's normal range either way) */
    {
        const int h = lid / 8, part = lid % 8;
        float most = 0.0f;
        if (LIVE(h)) {
            __global const float *qlat = Q_LATENT(h), *qr = Q_ROPE(h);
            for (int d = part; d < ROW; d += 8) {
                const float x = scale * (d < RKV ? qlat[d] : qr[d - RKV]);
                most = fmax(most, fmax(x, -x));
            }
        }
        red[part * 16 + h] = most;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (part == 0) {
            for (int i = 1; i < 8; i++)
                most = fmax(most, red[i * 16 + h]);
            /* most = f 2^e with f in [0.5, 1) for a normal float: e from its exponent bits */
            const int e = most > 0.0f && most <= FLT_MAX ? (int)((as_uint(most) >> 23) & 0xFF) - 126 : 0;
            const int k = clamp(15 - e, -120, 120);
            qsc_l[h] = as_float((uint)(127 + k) << 23);
            qinv_l[h] = as_float((uint)(127 - k) << 23);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#define Q16_SCALE(h) qsc_l[h]
#else
#define Q16_SCALE(h) 1.0f
#endif
    /* the queries, scaled (16-bit operands: as hi and lo pairs; f16: times their row's power of
       two); zero for rows past the group's heads */
#ifdef MMA16
    for (int i = lid; i < 16 * QP; i += NT) {
        const int h = i / QP, p = i % QP, d = 2 * p;
        float x0 = 0.0f, x1 = 0.0f;
        if (LIVE(h)) {
            __global const float *qlat = Q_LATENT(h), *qr = Q_ROPE(h);
            const float sh = scale * Q16_SCALE(h);
            x0 = sh * (d < RKV ? qlat[d] : qr[d - RKV]); /* RKV even: a pair never straddles */
            x1 = sh * (d < RKV ? qlat[d + 1] : qr[d + 1 - RKV]);
        }
        const int at = 4 * QIDX(h, p / 4) + p % 4;
        ((__local uint *)qh4)[at] = pair16(x0, x1, 0);
        ((__local uint *)ql4)[at] = pair16(x0, x1, 1);
    }
#else
    for (int i = lid; i < 4 * ROW; i += NT) {
        const int h = i / (ROW / 4), j = i % (ROW / 4), d = 4 * j;
        float4 x = 0.0f;
        if (LIVE(h)) {
            __global const float *qlat = Q_LATENT(h), *qr = Q_ROPE(h);
            x = d < RKV ? (float4)(qlat[d], qlat[d + 1], qlat[d + 2], qlat[d + 3]) /* RKV % 4 == 0 */
                        : (float4)(qr[d - RKV], qr[d + 1 - RKV], qr[d + 2 - RKV], qr[d + 3 - RKV]);
        }
        q4[QIDX(h, j)] = x * scale;
    }
#endif

    const int hb = lid / 8, pi = lid % 8; /* step B: head, its keys KB pi .. KB pi + KB - 1 */
    float m_run = -INFINITY, l_run = 0.0f; /* head hb: running maximum (the same in its 8 items), own sum */
    float o[NACC][4];
    #pragma unroll
    for (int j = 0; j < NACC; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    /* whether key k of the tile scores for row g (r8 0) or g + 8 (1) */
#ifdef SPARSE
#define KEY_OK(k, r8) live_l[k]
#elif FOLD > 1
#define KEY_OK(k, r8) ((k) < nk && j0 + (k) < ((r8) ? lim_g8 : lim_g))
#else
#define KEY_OK(k, r8) ((k) < nk)
#endif
    for (int j0 = k_begin; j0 < k_end; j0 += TK) {
        const int nk = min(TK, k_end - j0);
        if (lid < TK) { /* the tile's rows; past its end, its first key's (weight 0) */
#ifdef SPARSE
            /* an entry that is no key: position 0's row (ctx >= 1), its score dropped */
            const int pos = lid < nk ? list[j0 + lid] : -1, live = pos >= 0 && pos < ctx, j = live ? pos : 0;
            live_l[lid] = live;
#else
            const int j = j0 + (lid < nk ? lid : 0);
#endif
            const int slot = table[j / block_tokens] * block_tokens + j % block_tokens;
            slot_l[lid] = slot;
#ifdef CACHE_FP8
            __global const float *sp = (__global const float *)(ROW_AT(slot) + RKV);
            for (int b = 0; b < NSB; b++)
                scale_l[lid * NSB + b] = sp[b];
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* slot_l (scale_l), and the queries before the first tile */

#ifdef MMA16
        /* A. scores: step v (values 32v .. 32v+31) with b, b8, the lane's 8 of them of each key
           as bf16 pairs, into d, d8: two products a key, each by the queries' two terms */
#define SCORE_STEP(d, d8, v, b, b8)                                                                 \
    {                                                                                               \
        const int qa = QIDX(g, 4 * (v) + t), qa8 = QIDX(g + 8, 4 * (v) + t);                         \
        const uint4 a = qh4[qa], a8 = qh4[qa8], c = ql4[qa], c8 = ql4[qa8];                         \
        MMA(d, a.x, a8.x, a.y, a8.y, (b).x, (b).y);                                                \
        MMA(d, c.x, c8.x, c.y, c8.y, (b).x, (b).y);                                                \
        MMA(d, a.z, a8.z, a.w, a8.w, (b).z, (b).w);                                                \
        MMA(d, c.z, c8.z, c.w, c8.w, (b).z, (b).w);                                                \
        MMA(d8, a.x, a8.x, a.y, a8.y, (b8).x, (b8).y);                                             \
        MMA(d8, c.x, c8.x, c.y, c8.y, (b8).x, (b8).y);                                             \
        MMA(d8, a.z, a8.z, a.w, a8.w, (b8).z, (b8).w);                                             \
        MMA(d8, c.z, c8.z, c.w, c8.w, (b8).z, (b8).w);                                             \
    }
#else
        /* A. scores, 16 values a step: lane (g, t) takes values 4t .. 4t+3 of the step (one float4
           a key and a query row), the first two as fragment k t and t + 4 of one product, the last
           two of another */
#define SCORE_STEP(d, d8, v, b, b8)                                                                 \
    {                                                                                               \
        const float4 a = q4[QIDX(g, 4 * (v) + t)], a8 = q4[QIDX(g + 8, 4 * (v) + t)];               \
        MMA3(d, a.x, a8.x, a.y, a8.y, (b).x, (b).y);                                               \
        MMA3(d, a.z, a8.z, a.w, a8.w, (b).z, (b).w);                                               \
        MMA3(d8, a.x, a8.x, a.y, a8.y, (b8).x, (b8).y);                                            \
        MMA3(d8, a.z, a8.z, a.w, a8.w, (b8).z, (b8).w);                                            \
    }
#endif
        {
            /* keys 16 warp + g and 16 warp + 8 + g (B's column g of two products): QU steps' loads
               in flight before their products; the scores into sc, -inf past the tile's keys (D
               element i: head g + 8 (i >> 1), key 2t + (i & 1) of the product's 8) */
            float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s8[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#ifdef CACHE_FP8
            /* fp8: c^KV in blocks of 128 values (4 steps; a lane's 8 codes a step and key, an
               8-byte load), each block's products summed apart and multiplied into the scores by
               its keys' scales (D element i is key 2t + (i & 1) of the product's 8); then k^R,
               bf16 after the codes and scales, 8-byte aligned (two loads a step and key) */
            __global const uchar *row = ROW_AT(slot_l[16 * warp + g]), *row8 = ROW_AT(slot_l[16 * warp + 8 + g]);
            __global const uint2 *lat = (__global const uint2 *)row, *lat8 = (__global const uint2 *)row8;
            #pragma unroll 1 /* unrolled, the blocks' loads are hoisted together: 255 registers and spills */
            for (int bb = 0; bb < NSB; bb++) {
                uint2 b[4], b8[4];
                #pragma unroll
                for (int u = 0; u < 4; u++) {
                    b[u] = lat[4 * (4 * bb + u) + t];
                    b8[u] = lat8[4 * (4 * bb + u) + t];
                }
                float sb[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sb8[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                MMA_UNROLL
                for (int u = 0; u < 4; u++)
                    SCORE_STEP(sb, sb8, 4 * bb + u, e4m3x8_bf16(b[u]), e4m3x8_bf16(b8[u]))
                #pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int k = 16 * warp + 2 * t + (i & 1);
                    s[i] = fma(sb[i], scale_l[k * NSB + bb], s[i]);
                    s8[i] = fma(sb8[i], scale_l[(k + 8) * NSB + bb], s8[i]);
                }
            }
            __global const uint2 *rope = (__global const uint2 *)(row + RKV + 4 * NSB);
            __global const uint2 *rope8 = (__global const uint2 *)(row8 + RKV + 4 * NSB);
            MMA_UNROLL
            for (int v = 0; v < DR / 32; v++) {
                const uint2 x = rope[8 * v + 2 * t], y = rope[8 * v + 2 * t + 1];
                const uint2 x8 = rope8[8 * v + 2 * t], y8 = rope8[8 * v + 2 * t + 1];
                /* element by element: a uint4 made of two uint2s crashes oclgrind 21.10's
                   uninitialised-value checker (a memcpy in Uninitialized::instructionExecuted) */
                SCORE_STEP(s, s8, RKV / 32 + v, (uint4)(x.x, x.y, y.x, y.y), (uint4)(x8.x, x8.y, y8.x, y8.y))
            }
#else
            __global const SCORE_T *row = (__global const SCORE_T *)ROW_AT(slot_l[16 * warp + g]);
            __global const SCORE_T *row8 = (__global const SCORE_T *)ROW_AT(slot_l[16 * warp + 8 + g]);
            int v = 0;
            for (; v + QU <= SCORE_STEPS; v += QU) {
                SCORE_T b[QU], b8[QU];
                #pragma unroll
                for (int u = 0; u < QU; u++) {
                    b[u] = row[4 * (v + u) + t];
                    b8[u] = row8[4 * (v + u) + t];
                }
                MMA_UNROLL
                for (int u = 0; u < QU; u++)
                    SCORE_STEP(s, s8, v + u, b[u], b8[u])
            }
            for (; v < SCORE_STEPS; v++)
                SCORE_STEP(s, s8, v, row[4 * v + t], row8[4 * v + t])
#endif
            #pragma unroll
            for (int i = 0; i < 4; i++) {
                const int h = g + 8 * (i >> 1), k = 16 * warp + 2 * t + (i & 1);
#ifdef CACHE_F16
                const float back = qinv_l[h]; /* the row's queries' power of two, undone */
#else
                const float back = 1.0f;
#endif
                sc[h * SCS + k] = KEY_OK(k, i >> 1) ? s[i] * back : -INFINITY;
                sc[h * SCS + k + 8] = KEY_OK(k + 8, i >> 1) ? s8[i] * back : -INFINITY;
            }
        }
#undef SCORE_STEP
        barrier(CLK_LOCAL_MEM_FENCE);

        /* B. the tile's maximum per head over its 8 items, then weights exp(score - maximum) and
           sums: bf16, as hi and lo pairs apart; fp8 and f32, in place of the scores once every item
           has read its own (fp8's terms are made in step C, after each block's scale) */
        float w[KB], mx8 = -INFINITY;
        #pragma unroll
        for (int k = 0; k < KB; k++) {
            w[k] = sc[hb * SCS + KB * pi + k];
            mx8 = fmax(mx8, w[k]);
        }
        red[pi * 16 + hb] = mx8;
        barrier(CLK_LOCAL_MEM_FENCE);
        float m_new = m_run;
        for (int i = 0; i < 8; i++)
            m_new = fmax(m_new, red[i * 16 + hb]);
        const float al = m_new == -INFINITY ? 1.0f : exp(m_run - m_new);
        float sum = 0.0f;
        #pragma unroll
        for (int k = 0; k < KB; k++) {
            w[k] = w[k] == -INFINITY ? 0.0f : exp(w[k] - m_new);
            sum += w[k];
        }
        l_run = l_run * al + sum;
        m_run = m_new;
        if (pi == 0)
            alpha_l[hb] = al;
#ifdef ROW16
        #pragma unroll
        for (int k = 0; k < KB / 2; k++) {
            ph[hb * PS + KB / 2 * pi + k] = pair16(w[2 * k], w[2 * k + 1], 0);
            pl[hb * PS + KB / 2 * pi + k] = pair16(w[2 * k], w[2 * k + 1], 1);
        }
#else
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int k = 0; k < KB; k++)
            sc[hb * SCS + KB * pi + k] = w[k];
#endif
        barrier(CLK_LOCAL_MEM_FENCE);

        /* C. o = alpha o + P V over the tile: rows g and g + 8 of the accumulators */
        const float ag = alpha_l[g], ag8 = alpha_l[g + 8];
        #pragma unroll
        for (int j = 0; j < NACC; j++) {
            o[j][0] *= ag;
            o[j][1] *= ag;
            o[j][2] *= ag8;
            o[j][3] *= ag8;
        }
#ifdef MMA16
        MMA_UNROLL
        for (int ks = 0; ks < TK / 16; ks++) {
            /* weights of keys k0 .. k0 + 3: fragment k 2t, 2t+1 | 2t+8, 2t+9 */
            const int k0 = 16 * ks + 4 * t;
            __global const CACHE_T *r0 = ROW_AT(slot_l[k0]), *r1 = ROW_AT(slot_l[k0 + 1]);
            __global const CACHE_T *r2 = ROW_AT(slot_l[k0 + 2]), *r3 = ROW_AT(slot_l[k0 + 3]);
#ifdef ROW16
            const int pq = g * (PS / 2) + 4 * ks + t, pq8 = pq + 8 * (PS / 2);
            const uint2 pa = ph2[pq], pa8 = ph2[pq8], pb = pl2[pq], pb8 = pl2[pq8];
#else
            __local const float *pg = sc + g * SCS + k0, *p8 = pg + 8 * SCS;
            const float4 wg = (float4)(pg[0], pg[1], pg[2], pg[3]), w8 = (float4)(p8[0], p8[1], p8[2], p8[3]);
            uint2 pa, pa8, pb, pb8;
#endif
            MMA_UNROLL
            for (int b = 0; b < NB; b++) {
                const int col = warp * (RKV / 4) + 64 * b + 8 * g; /* this lane's 8 columns */
#ifdef ROW16
                const uint4 v0 = *(__global const uint4 *)(r0 + col), v1 = *(__global const uint4 *)(r1 + col);
                const uint4 v2 = *(__global const uint4 *)(r2 + col), v3 = *(__global const uint4 *)(r3 + col);
#else
                /* fp8: the weights times the keys' scales of the block these 64 columns lie in,
                   then their two terms, made again only where a block begins (at RKV 512 a warp's
                   two 64-column steps share one: warp * 128 leaves the test constant); the codes
                   decoded to bf16 (8 bytes a key) */
                if (b == 0 || ((warp * (RKV / 4) + 64 * b) & 127) == 0) {
                    const int blk = (warp * (RKV / 4) + 64 * b) / 128;
                    const float4 sk = (float4)(scale_l[k0 * NSB + blk], scale_l[(k0 + 1) * NSB + blk],
                                               scale_l[(k0 + 2) * NSB + blk], scale_l[(k0 + 3) * NSB + blk]);
                    const float4 xg = wg * sk, x8 = w8 * sk;
                    pa = (uint2)(pair16(xg.x, xg.y, 0), pair16(xg.z, xg.w, 0));
                    pa8 = (uint2)(pair16(x8.x, x8.y, 0), pair16(x8.z, x8.w, 0));
                    pb = (uint2)(pair16(xg.x, xg.y, 1), pair16(xg.z, xg.w, 1));
                    pb8 = (uint2)(pair16(x8.x, x8.y, 1), pair16(x8.z, x8.w, 1));
                }
                const uint4 v0 = e4m3x8_bf16(*(__global const uint2 *)(r0 + col));
                const uint4 v1 = e4m3x8_bf16(*(__global const uint2 *)(r1 + col));
                const uint4 v2 = e4m3x8_bf16(*(__global const uint2 *)(r2 + col));
                const uint4 v3 = e4m3x8_bf16(*(__global const uint2 *)(r3 + col));
#endif
                const uint e0[4] = {v0.x, v0.y, v0.z, v0.w}, e1[4] = {v1.x, v1.y, v1.z, v1.w};
                const uint e2[4] = {v2.x, v2.y, v2.z, v2.w}, e3[4] = {v3.x, v3.y, v3.z, v3.w};
                MMA_UNROLL
                for (int e = 0; e < 8; e++) {
                    /* value e of keys 4t, 4t+1 and 4t+2, 4t+3, paired low half first */
                    const uint x0 = e0[e / 2], x1 = e1[e / 2], x2 = e2[e / 2], x3 = e3[e / 2];
                    const uint b0 = e & 1 ? (x0 >> 16) | (x1 & 0xFFFF0000u) : (x0 & 0xFFFFu) | (x1 << 16);
                    const uint b1 = e & 1 ? (x2 >> 16) | (x3 & 0xFFFF0000u) : (x2 & 0xFFFFu) | (x3 << 16);
                    MMA(o[8 * b + e], pa.x, pa8.x, pa.y, pa8.y, b0, b1);
                    MMA(o[8 * b + e], pb.x, pb8.x, pb.y, pb8.y, b0, b1);
                }
            }
        }
#else
        /* f32: 8 keys a product (fragment k t and t + 4: keys 8ks + t and 8ks + t + 4), warp w's
           RKV / 4 columns in groups of 32 of which lane (g, t) loads the 4 columns 4g .. 4g+3 of
           both its keys (a float4 each); value e of the 4 is column g of the group's n-tile e */
        MMA_UNROLL
        for (int ks = 0; ks < TK / 8; ks++) {
            const float p0 = sc[g * SCS + 8 * ks + t], p1 = sc[(g + 8) * SCS + 8 * ks + t];
            const float p2 = sc[g * SCS + 8 * ks + t + 4], p3 = sc[(g + 8) * SCS + 8 * ks + t + 4];
            __global const float *ra = ROW_AT(slot_l[8 * ks + t]), *rb = ROW_AT(slot_l[8 * ks + t + 4]);
            MMA_UNROLL
            for (int c = 0; c < NC; c++) {
                const int col = warp * (RKV / 4) + 32 * c + 4 * g;
                const float4 va = *(__global const float4 *)(ra + col), vb = *(__global const float4 *)(rb + col);
                MMA3(o[4 * c], p0, p1, p2, p3, va.x, vb.x);
                MMA3(o[4 * c + 1], p0, p1, p2, p3, va.y, vb.y);
                MMA3(o[4 * c + 2], p0, p1, p2, p3, va.z, vb.z);
                MMA3(o[4 * c + 3], p0, p1, p2, p3, va.w, vb.w);
            }
        }
#endif
        /* the next tile writes sc, red, alpha_l and slot_l only after every warp has read them here */
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    /* each head's sum over its 8 items, and its lse */
    red[pi * 16 + hb] = l_run;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (pi == 0) {
        float l = 0.0f;
        for (int i = 0; i < 8; i++)
            l += red[i * 16 + hb];
        lsum_l[hb] = l;
        if (LIVE(hb))
            lse[lse_offset + OUT_ROW(hb)] = l > 0.0f ? m_run + log(l) : -INFINITY;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const float l0 = lsum_l[g], l8 = lsum_l[g + 8];
    const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i8 = l8 > 0.0f ? 1.0f / l8 : 0.0f;
#ifdef MMA16
    #pragma unroll
    for (int b = 0; b < NB; b++) {
        const int col = warp * (RKV / 4) + 64 * b + 16 * t;
        float8 r0, r1, r8, r9;
        r0 = (float8)(o[8 * b][0], o[8 * b + 1][0], o[8 * b + 2][0], o[8 * b + 3][0], o[8 * b + 4][0],
                      o[8 * b + 5][0], o[8 * b + 6][0], o[8 * b + 7][0]);
        r1 = (float8)(o[8 * b][1], o[8 * b + 1][1], o[8 * b + 2][1], o[8 * b + 3][1], o[8 * b + 4][1],
                      o[8 * b + 5][1], o[8 * b + 6][1], o[8 * b + 7][1]);
        r8 = (float8)(o[8 * b][2], o[8 * b + 1][2], o[8 * b + 2][2], o[8 * b + 3][2], o[8 * b + 4][2],
                      o[8 * b + 5][2], o[8 * b + 6][2], o[8 * b + 7][2]);
        r9 = (float8)(o[8 * b][3], o[8 * b + 1][3], o[8 * b + 2][3], o[8 * b + 3][3], o[8 * b + 4][3],
                      o[8 * b + 5][3], o[8 * b + 6][3], o[8 * b + 7][3]);
        if (LIVE(g)) {
            __global float *dst = out + out_offset + OUT_ROW(g) * RKV + col;
            vstore8(r0 * i0, 0, dst);
            vstore8(r1 * i0, 0, dst + 8);
        }
        if (LIVE(g + 8)) {
            __global float *dst = out + out_offset + OUT_ROW(g + 8) * RKV + col;
            vstore8(r8 * i8, 0, dst);
            vstore8(r9 * i8, 0, dst + 8);
        }
    }
#else
    /* a lane's accumulators: columns 32c + 8t + e (e < 4, D element 0 of n-tile e) and 32c + 8t +
       4 + e (element 1) of head g, the same with elements 2 and 3 of head g + 8 */
    #pragma unroll
    for (int c = 0; c < NC; c++) {
        const int col = warp * (RKV / 4) + 32 * c + 8 * t;
        const float8 r0 = (float8)(o[4 * c][0], o[4 * c + 1][0], o[4 * c + 2][0], o[4 * c + 3][0], o[4 * c][1],
                                   o[4 * c + 1][1], o[4 * c + 2][1], o[4 * c + 3][1]);
        const float8 r8 = (float8)(o[4 * c][2], o[4 * c + 1][2], o[4 * c + 2][2], o[4 * c + 3][2], o[4 * c][3],
                                   o[4 * c + 1][3], o[4 * c + 2][3], o[4 * c + 3][3]);
        if (LIVE(g))
            vstore8(r0 * i0, 0, out + out_offset + OUT_ROW(g) * RKV + col);
        if (LIVE(g + 8))
            vstore8(r8 * i8, 0, out + out_offset + OUT_ROW(g + 8) * RKV + col);
    }
#endif
}
#endif
