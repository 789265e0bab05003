/* clmla-bench: shared declarations of the benchmark program (a client of the public API, plus
   its own baseline and peak kernels and direct CLBlast calls). */
#ifndef CLMLA_BENCH_H
#define CLMLA_BENCH_H

#include "clmla.h"

#include <stddef.h>

/* ---- the device under test ------------------------------------------------------------------ */

typedef struct bench_device {
    clmla_context *ctx;
    cl_context cl_ctx;
    cl_command_queue queue;
    cl_device_id device;
    clmla_device_info info;
    int profiling;          /* the queue has CL_QUEUE_PROFILING_ENABLE */
    int profiling_warned;   /* bench_time has said once that the events gave implausible spans */
    size_t memory_budget;   /* bytes a row may allocate before it is skipped */
    cl_mem flush_buffer;    /* written or read before every timed call unless --warm-cache (NULL then) */
    size_t flush_bytes;
    cl_kernel flush_kernel; /* --flush read: read_bandwidth over flush_buffer (NULL: --flush write) */
    cl_mem flush_sink;      /* its one float per work-item */
    size_t flush_global, flush_local;
} bench_device;

/* Sets up the flush of dev->flush_bytes before every timed call: `read` 1, a kernel that reads
   the buffer on every compute unit; 0, a fill of it from the queue. Returns nonzero on failure,
   with a message on stderr. bench_flush_release frees what it made. */
int bench_flush_setup(bench_device *dev, int read);
void bench_flush_release(bench_device *dev);

/* Compiles (once per source and options, then from a small in-process cache) one of the bench's
   own kernels: "mha_decode" or "bench_util" (bench/kernels/NAME.cl). On failure prints the
   build log to stderr and returns NULL. */
cl_kernel bench_kernel(bench_device *dev, const char *file, const char *options, const char *kernel);
void bench_kernels_release(void);

/* dst[0..n) = scale * uniform[-1, 1) on the device; half = 1 stores f16 (vstore_half). */
int bench_fill(bench_device *dev, cl_mem dst, size_t n, int half, unsigned seed, float scale);
/* A device buffer, or NULL with a message on stderr. */
cl_mem bench_buffer(bench_device *dev, size_t bytes, const char *what);
void bench_release(cl_mem *buffer);

/* ---- the model shape ----------------------------------------------------------------------- */

typedef struct bench_shape {
    char preset[32];            /* "v2-lite", ..., or "custom" */
    clmla_layer_config config;
    int D, H, rq, rkv, dn, dr, dv, dq, row; /* row = rkv + dr: values per latent cache token */
    float scale;                /* softmax scale tau (docs/MLA.md section 4) */
} bench_shape;

void bench_shape_from_config(bench_shape *s, const char *preset, const clmla_layer_config *config);

/* ---- weights in a dtype (bench/encode.c) --------------------------------------------------- */

/* A weight as clmla_linear_create takes it: tensor.data is the caller's float32 array (F32) or
   codes of the dtype (with tensor.scale for FP8) owned here. */
typedef struct bench_encoded {
    clmla_tensor tensor;
    void *codes;
    float *scale;
} bench_encoded;

/* Encodes W [n, k] (float32, row-major) in `dtype` by include/clmla.h's rules (f16 and bf16 round
   to nearest even; FP8: per 128 x 128 block the scale max|W| / 448 and e4m3 codes), and overwrites
   w with the values the encoding denotes, so that a float64 check uses the weights the library
   multiplies by. Returns 0, or 1 when out of host memory (or for an unknown dtype). */
int bench_encode_weight(float *w, size_t n, size_t k, clmla_dtype dtype, bench_encoded *out);
void bench_encoded_free(bench_encoded *e);
/* Bytes of W [n, k] stored in `dtype`, FP8's block scales included. */
size_t bench_weight_stored_bytes(clmla_dtype dtype, size_t n, size_t k);

/* ---- random layer weights (bench/layer.c) -------------------------------------------------- */

/* A layer's weights as `clmla demo` makes them (uniform, scaled by 1/sqrt(fan-in); norms near 1),
   float32 on the host, with the configuration that keeps them in `weights` on the device. */
#define BENCH_LAYER_ARRAYS 8
typedef struct bench_layer_weights {
    clmla_layer_config config;
    clmla_layer_weights weights; /* points into arrays */
    float *arrays[BENCH_LAYER_ARRAYS];
} bench_layer_weights;

/* Returns 0, or 1 when out of host memory (with a message on stderr). */
int bench_layer_weights_make(const bench_shape *s, unsigned seed, clmla_dtype weights, bench_layer_weights *bw);
void bench_layer_weights_free(bench_layer_weights *bw);

/* ---- timing -------------------------------------------------------------------------------- */

/* One call of the operation under test: enqueue it on dev->queue without waiting. *last
   receives the event of its last command (or stays NULL when there is none). */
typedef int (*bench_enqueue_fn)(void *user, cl_event *last);
/* Called before each sample, untimed, to restore the state the calls consume (the context of a
   decode step, the empty sequences of a prefill). May be NULL. */
typedef int (*bench_reset_fn)(void *user);

typedef struct bench_op {
    bench_enqueue_fn enqueue;
    bench_reset_fn reset;
    void *user;
    int max_calls_per_sample; /* 0 = 64 */
} bench_op;

typedef struct bench_timing_options {
    int min_samples;          /* at least this many (3 when one call takes over half a second) */
    int max_samples;
    double min_seconds;       /* keep sampling at least this long... */
    double max_seconds;       /* ...and stop after this long even if not stable */
    double sample_ms;         /* a sample repeats the call back to back until it lasts about this */
    double stable_fraction;   /* stable: the median of the first half of the samples is within
                                 this fraction of the median of all of them */
} bench_timing_options;

typedef struct bench_timing {
    double first_ms;          /* the very first call, with kernel compiles, wall time */
    double median_ms, min_ms, max_ms; /* per call, over samples, with the timer below */
    double wall_median_ms;    /* the same by wall clock around clFinish, for reference */
    int samples, calls_per_sample, stable;
    const char *timer;        /* "profiling" (OpenCL events) or "wall" */
} bench_timing;

void bench_timing_defaults(bench_timing_options *o, int quick);
int bench_time(bench_device *dev, const bench_op *op, const bench_timing_options *o, bench_timing *t);
double bench_now(void);
/* Whether a profiled time of a call (ms) can stand beside the wall clock's for the same call:
   positive, at most the wall time (1% and 5 us allowed between the clocks), and at least 1% of
   it. Mesa 22.3's rusticl gave spans of 1 ns for calls of 0.4 s: taken as they were, every rate
   of a row would be absurd. */
int bench_span_plausible(double span_ms, double wall_ms);

/* ---- what one row of results holds ---------------------------------------------------------- */

typedef struct bench_row {
    char phase[16];           /* decode, layer, prefill, peak */
    char path[24];            /* absorbed, decompressed, mha; peak: read-bandwidth, fp32-fma, sgemm */
    char weights_dtype[8];    /* f32, f16, bf16, fp8 as the weights are held; "" for rows without
                                 weights (peak, decode absorbed and mha) */
    char cache_dtype[8];      /* f32, f16, bf16, fp8; "" for rows without a cache (peak, products) */
    int batch, ctx;
    int q_len;                /* decode: query tokens per sequence (--q-len); 0 = not a decode row */
    int topk;                 /* decode sparse: index entries per query token (--topk); 0 = not sparse */
    int prefix;               /* prefill: tokens each sequence held before the chunk of ctx (--prefix) */
    bench_timing t;
    double tokens;            /* tokens per call: batch (decode, layer), batch * ctx (prefill) */
    double bytes, flops;      /* per call, as docs/BENCHMARKS.md defines them */
    double weight_bytes;      /* the weights' part of bytes, as stored; 0 for rows without weights */
    double cache_bytes;       /* the KV memory this row's attention reads (MLA latent, or MHA K/V) */
    double mha_cache_bytes;   /* a standard MHA cache for the same model, batch and ctx */
    double check_error;       /* max relative error against a float64 host result; < 0 = not checked */
    char note[160];
    /* phase cold: the medians of each part over the samples (their sum is near t.median_ms, which
       is the median of the whole), and the programs built from source or loaded from the disk
       cache in a sample (the last one) */
    double cold_context_ms, cold_layer_ms, cold_warmup_ms, cold_first_step_ms;
    int cold_built, cold_loaded;
} bench_row;

typedef struct bench_peaks {
    double read_gbs, fma_gflops, sgemm_gflops; /* 0 = not measured; sgemm: the better of the paths */
    char sgemm_path[16];                       /* which path that was: "CLBlast" or "clmla" */
    char source[16];                           /* where they come from: "peak" (--peak or --phase peak),
                                                  "brief" (the default roof measurement), "file"
                                                  (--peaks FILE); "" = none */
} bench_peaks;

/* Peak rows: read-bandwidth, fp32-fma, sgemm (CLBlast), sgemm-clmla (the library's dispatch). */
#define BENCH_PEAK_ROWS 5

/* ---- byte and FLOP counts (docs/BENCHMARKS.md, "Definitions") ---------------------------------- */

/* All weights of one layer in float32 (an upper bound for the memory a row needs). */
double bench_weight_bytes(const bench_shape *s);
/* Per token: the projections around the attention (q, kv_a, o_proj), and for the absorbed form
   also W^UK into the query and W^UV after the weighted sum. */
double bench_projection_flops(const bench_shape *s, int absorbed);
/* Per (query, key) pair over all heads: 2*H*(2*rkv + dr) absorbed, 2*H*(dq + dv) otherwise. */
double bench_pair_flops(const bench_shape *s, int absorbed);
/* Per key per step for the decompressed path: k^C and v^C of every head from c^KV. */
double bench_upproject_flops(const bench_shape *s);
double bench_mla_cache_bytes(const bench_shape *s, int batch, int ctx, clmla_cache_dtype dtype);
double bench_mha_cache_bytes(const bench_shape *s, int batch, int ctx, size_t elem);

/* ---- phases: each fills *row and returns 0, 1 on a failure, or -1 when skipped (row->note) -- */

typedef struct bench_case {
    bench_device *dev;
    const bench_shape *shape;
    const bench_timing_options *timing;
    const char *phase, *path;  /* path: absorbed | sparse | decompressed | mha | auto */
    int batch, ctx;
    clmla_cache_dtype dtype;
    int block_tokens;
    int check;                 /* compare the bench's own kernels with a float64 host result */
    unsigned seed;
    clmla_dtype weights;       /* layer, prefill, products: the dtype the weights are held in */
    int q_len;                 /* decode, absorbed: new tokens per sequence (1 = one-token decode) */
    int topk;                  /* decode, sparse: index entries per query token */
    int prefix;                /* prefill: tokens each sequence holds before its ctx new ones */
} bench_case;

int bench_decode(const bench_case *c, bench_row *row);
int bench_layer(const bench_case *c, bench_row *row);   /* phases layer and prefill */
int bench_products(const bench_case *c, bench_row *row); /* phase products (bench/products.c) */
/* phase cold (bench/cold.c): a fresh context, layer and warm-up, then the first step; path "build"
   (no disk cache: every kernel compiled) or "cache" (the disk cache filled beforehand) */
int bench_cold(const bench_case *c, const char *device_spec, bench_row *row);
/* The four peak rows; peaks receives the measured values. quick = smaller sizes. */
int bench_peak(bench_device *dev, const bench_timing_options *timing, int quick, bench_row rows[BENCH_PEAK_ROWS],
               bench_peaks *peaks);
/* Only the two peaks a row's bound needs (read bandwidth, fp32 FMA), at --quick's sizes and one
   trial, without rows: what a run without --peak or --peaks measures (about 2 s on a 2-core CPU). */
int bench_peak_roof(bench_device *dev, const bench_timing_options *timing, bench_peaks *peaks);

/* ---- output -------------------------------------------------------------------------------- */

typedef struct bench_report bench_report;
bench_report *bench_report_open(const bench_device *dev, const bench_shape *shape, const char *json_path);
void bench_report_peaks(bench_report *r, const bench_peaks *peaks);
/* Prints the row to stdout and, with --json, rewrites the file with every row so far. */
int bench_report_row(bench_report *r, const bench_row *row);
void bench_report_skip(bench_report *r, const bench_row *row);
int bench_report_close(bench_report *r);

#endif
