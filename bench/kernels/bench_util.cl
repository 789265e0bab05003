/* clmla-bench's utility and peak kernels (not part of the library).
 *
 * fill_uniform / fill_uniform_half: dst[i] = scale * u(i, seed), u uniform in [-1, 1) from an
 *   integer hash, so multi-GiB inputs are made on the device and never cross the bus.
 * read_bandwidth: streams src once. Work-group g (NT items) owns the contiguous chunk of
 *   NT * per_item float4 starting at g * NT * per_item. Inside it, item lid reads
 *     lid, lid+NT, lid+2NT, ...                   (default: coalesced, what GPUs want)
 *     lid*per_item, lid*per_item+1, ...           (-D CONTIGUOUS: one stream per item, what CPU
 *                                                  drivers that run an item's loop in turn want)
 *   With -D STREAMS=S (CPU devices) a work-group is one item, which reads its chunk as S
 *   sequential streams, one over each S-th of it, 16 floats a load: how clmla's CPU products
 *   read their weights (cl/gemm_rows.cl, gemm_packed_rows). PoCL runs the two orders above
 *   vectorised across the items of a work-group, and they read about a quarter slower than this
 *   on an Intel Xeon (docs/perf-log.md, 2026-11-27).
 *   One float per item is written so that the loads cannot be removed.
 * fma_throughput: 8 independent fma chains of VEC-wide vectors per work-item, iterations deep,
 *   all in registers: 2 * 8 * VEC * iterations FLOPs per item. a = a*m + c with m < 1 converges,
 *   so the values stay normal. */
static float hash_uniform(uint i, uint seed)
{
    uint x = i * 0x9E3779B1u ^ seed;
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

__kernel void fill_uniform(__global float *dst, const uint n, const uint seed, const float scale)
{
    for (uint i = get_global_id(0); i < n; i += get_global_size(0))
        dst[i] = scale * hash_uniform(i, seed);
}

__kernel void fill_uniform_half(__global half *dst, const uint n, const uint seed, const float scale)
{
    for (uint i = get_global_id(0); i < n; i += get_global_size(0))
        vstore_half(scale * hash_uniform(i, seed), i, dst);
}

#ifdef STREAMS
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void read_bandwidth(__global const float4 *src, const int per_item, __global float *out)
{
    const int len = per_item / STREAMS; /* float4 per stream, a multiple of 4 */
    __global const float *p = (__global const float *)(src + (size_t)get_global_id(0) * per_item);
    float16 acc[STREAMS];
#pragma unroll
    for (int s = 0; s < STREAMS; s++)
        acc[s] = (float16)(0.0f);
    for (int i = 0; i < 4 * len; i += 16) {
#pragma unroll
        for (int s = 0; s < STREAMS; s++)
            acc[s] += vload16(0, p + (size_t)s * 4 * len + i);
    }
    float16 t = acc[0];
#pragma unroll
    for (int s = 1; s < STREAMS; s++)
        t += acc[s];
    const float8 h = t.lo + t.hi;
    const float4 q = h.lo + h.hi;
    out[get_global_id(0)] = q.x + q.y + q.z + q.w;
}
#else
__kernel void read_bandwidth(__global const float4 *src, const int per_item, __global float *out)
{
    const int lid = get_local_id(0), nt = get_local_size(0);
#ifdef CONTIGUOUS
    __global const float4 *p = src + ((size_t)get_group_id(0) * nt + lid) * per_item;
    const int step = 1;
#else
    __global const float4 *p = src + (size_t)get_group_id(0) * nt * per_item + lid;
    const int step = nt;
#endif
    float4 acc0 = (float4)(0.0f), acc1 = (float4)(0.0f);
    for (int i = 0; i < per_item; i += 2) {
        acc0 += p[(size_t)i * step];
        acc1 += p[(size_t)(i + 1) * step];
    }
    const float4 acc = acc0 + acc1;
    out[get_global_id(0)] = acc.x + acc.y + acc.z + acc.w;
}
#endif

/* VEC = 1, 4, 8 or 16: the width of each chain's vector type (GPUs run scalars best, CPU drivers
   that do not vectorise across work-items need the vectors, AVX-512 cores 16 of them). */
#ifndef VEC
#define VEC 1
#endif
#define HSUM4(v) ((v).x + (v).y + (v).z + (v).w)
#if VEC == 1
#define VTYPE float
#define HSUM(v) (v)
#elif VEC == 4
#define VTYPE float4
#define HSUM(v) HSUM4(v)
#elif VEC == 8
#define VTYPE float8
#define HSUM(v) (HSUM4((v).lo) + HSUM4((v).hi))
#elif VEC == 16
#define VTYPE float16
#define HSUM(v) (HSUM4((v).lo.lo) + HSUM4((v).lo.hi) + HSUM4((v).hi.lo) + HSUM4((v).hi.hi))
#endif

__kernel void fma_throughput(__global float *out, const int iterations, const float m, const float c)
{
    const VTYPE x = (VTYPE)((float)(get_global_id(0) & 255) * 1e-3f);
    VTYPE a0 = x, a1 = x + 1.0f, a2 = x + 2.0f, a3 = x + 3.0f, a4 = x + 4.0f, a5 = x + 5.0f, a6 = x + 6.0f,
          a7 = x + 7.0f;
    for (int i = 0; i < iterations; i++) {
        a0 = fma(a0, m, c);
        a1 = fma(a1, m, c);
        a2 = fma(a2, m, c);
        a3 = fma(a3, m, c);
        a4 = fma(a4, m, c);
        a5 = fma(a5, m, c);
        a6 = fma(a6, m, c);
        a7 = fma(a7, m, c);
    }
    out[get_global_id(0)] = HSUM(((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)));
}
