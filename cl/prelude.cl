/* Definitions every kernel file shares. The library compiles this file in front of each kernel
 * file (host/runtime/program.c), so they are defined before the file's own code.
 *
 * The latent cache's element type, chosen by the build option CACHE_F16:
 *   CACHE_T               the element type in memory: float, or half (storage only: loaded and
 *                         stored with vload_half / vstore_half, which every OpenCL 1.2 device has)
 *   CACHE_LOAD(p, i)      element i of p, as float
 *   CACHE_LOAD4(p, i)     elements 4i .. 4i+3 of p, as float4 (no alignment beyond the element's)
 *   CACHE_STORE(v, i, p)  float v stored as element i of p, rounded to nearest even for half
 */
#ifdef CACHE_F16
#define CACHE_T half
#define CACHE_LOAD(p, i) vload_half((i), (p))
#define CACHE_LOAD4(p, i) vload_half4((i), (p))
#define CACHE_STORE(v, i, p) vstore_half_rte((v), (i), (p))
#else
#define CACHE_T float
#define CACHE_LOAD(p, i) ((p)[i])
#define CACHE_LOAD4(p, i) vload4((i), (p))
#define CACHE_STORE(v, i, p) ((p)[i] = (v))
#endif
