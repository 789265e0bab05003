/* Shared pieces of the layer tests: a fast fixed-seed PRNG, random weights for any configuration
   (float arrays with clmla and reference views of them), the clmla -> reference configuration
   converter, comparison checks that name the worst element, and the main of a test made of named
   parts. */
#ifndef CLMLA_TEST_UTIL_H
#define CLMLA_TEST_UTIL_H

#include "clmla.h"
#include "free_all.h"
#include "mla_ref.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- random numbers ----------------------------------------------------------------------- */

typedef struct tu_rng {
    uint64_t state;
} tu_rng;

tu_rng tu_rng_seed(uint64_t seed);
uint64_t tu_rng_next(tu_rng *rng);       /* splitmix64 */
float tu_rng_uniform(tu_rng *rng);       /* [-1, 1) */
int tu_rng_below(tu_rng *rng, int n);    /* [0, n) for n > 0 */
/* a[i] = center + amplitude * uniform[-1, 1) for i < n. */
void tu_fill_uniform(float *a, size_t n, float center, float amplitude, tu_rng *rng);
/* FNV-1a over n bytes, continuing from h (TU_HASH_START to begin): a key for results kept across
   a test's repetitions. */
#define TU_HASH_START 14695981039346656037ull
uint64_t tu_hash_bytes(uint64_t h, const void *data, size_t n);
/* Random permutation of 0 .. n-1. */
void tu_shuffle_ints(int *a, int n, tu_rng *rng);

/* Hidden states x [T, D] with unit variance (uniform in +-sqrt(3)), fixed by seed. NULL on OOM. */
float *tu_random_inputs(int tokens, int hidden, uint64_t seed);

/* ---- configurations ----------------------------------------------------------------------- */

/* The reference's configuration for a clmla one: clmla's 0-means-default fields resolved
   (rms_norm_eps 1e-6, rope_theta 1e4, L 4096, beta_fast 32, beta_slow 1) and YaRN off (factor 1)
   when yarn_factor <= 1. */
void tu_ref_config(const clmla_layer_config *config, mla_ref_config *ref);

/* A small configuration with every size given, everything else default (YaRN off, interleaved). */
clmla_layer_config tu_small_config(int hidden, int heads, int q_lora_rank, int kv_lora_rank, int nope_dim,
                                   int rope_dim, int v_dim);

/* "D=37 H=3 rq=0 rkv=40 dn/dr/dv=13/8/11 interleaved yarn=40" */
void tu_config_describe(const clmla_layer_config *config, char *buf, size_t size);

/* ---- random weights ------------------------------------------------------------------------ */

/* The 8 tensors of docs/MLA.md section 1 for one configuration. Projections are uniform with variance
   1/fan_in (so every activation stays O(1)), norm weights are 1 +- 0.1. The tensors absent for
   the configuration (q_a/q_b when rq == 0, q_proj otherwise) are NULL in every view. */
typedef struct tu_weights {
    clmla_layer_config config;
    float *q_a_proj;           /* [rq, D] */
    float *q_a_layernorm;      /* [rq] */
    float *q_b_proj;           /* [H*(dn+dr), rq] */
    float *q_proj;             /* [H*(dn+dr), D] */
    float *kv_a_proj_with_mqa; /* [rkv+dr, D] */
    float *kv_a_layernorm;     /* [rkv] */
    float *kv_b_proj;          /* [H*(dn+dv), rkv] */
    float *o_proj;             /* [D, H*dv] */
    clmla_layer_weights layer; /* views for clmla_layer_create */
    mla_ref_weights ref;       /* views for mla_ref_forward */
    mla_ref_config ref_config;
} tu_weights;

/* Returns 0, or -1 when memory ran out (then nothing stays allocated). */
int tu_weights_make(tu_weights *w, const clmla_layer_config *config, uint64_t seed);

/* Frees the 8 tensors (w may be NULL) and zeroes *w. Here rather than in test_util.c because the
   checkpoint tests (checkpoint_writer.h's ckpt_weights) use it without linking test_util.c. */
static inline void tu_weights_free(tu_weights *w)
{
    if (!w)
        return;
    float *const tensors[] = {w->q_a_proj,         w->q_a_layernorm, w->q_b_proj, w->q_proj,
                              w->kv_a_proj_with_mqa, w->kv_a_layernorm, w->kv_b_proj, w->o_proj};
    for (size_t i = 0; i < sizeof(tensors) / sizeof(tensors[0]); i++)
        free(tensors[i]);
    memset(w, 0, sizeof(*w));
}

/* ---- the reference, run once per sequence --------------------------------------------------- */

/* Everything the layer tests compare with, for one sequence of T tokens at positions 0..T-1. */
typedef struct tu_ref_run {
    int tokens;
    double *out; /* [T, D] */
    double *ckv; /* [T, rkv] c^KV after RMSNorm */
    double *kr;  /* [T, dr] k^R after RoPE */
} tu_ref_run;

/* Returns 0, or -1 (allocation or reference failure). */
int tu_ref_run_make(tu_ref_run *run, const tu_weights *w, int tokens, const float *x /* [T, D] */, int path);
void tu_ref_run_free(tu_ref_run *run);

/* float -> double copy (to compare two float arrays with mla_ref_max_rel_err). NULL on OOM. */
double *tu_to_double(const float *a, size_t n);

/* IEEE half bits -> float, for reading an f16 cache buffer directly. */
float tu_half_to_float(uint16_t h);

/* Monotonic seconds. */
double tu_seconds(void);

/* The function name of kernel k into name[size], "" for NULL or where OpenCL does not say. */
void tu_kernel_name(cl_kernel k, char *name, size_t size);

/* CLMLA_TEST_SWEEPS=short: a test that runs its cases again for each of a list of tuning parameter
   sets runs only the sets that take host paths of their own, and names the ones it leaves out
   (those change only the kernels' build options). ci/sanitize.sh sets it: under ASan it is the
   host code that is checked, and the ctest stage has run every set. Unset or "full": every set.
   Any other value: the test exits 2 after naming it. */
int tu_sweeps_short(void);

/* How many of a[0 .. n) outside [offset, offset + len) differ from sentinel: what a call wrote
   beyond the part of a buffer it was given. */
int tu_count_outside(const float *a, size_t n, size_t offset, size_t len, float sentinel);

/* Appends nseq sequences' rows to layer 0 of `cache` round robin, each append 1 .. 2 x block_tokens
   tokens (drawn from rng), so that every sequence's blocks are scattered: sequence s gets rows
   [start, start + lens[s]) of the device buffers ckv [total, rkv] and kr [total, dr], start being
   the sum of the lengths before it. Returns the first failing status (its message in
   clmla_last_error), or CLMLA_SUCCESS once every row is in. */
clmla_status tu_cache_fill_round_robin(clmla_cache *cache, const int32_t *ids, const int *lens, int nseq, int rkv,
                                       int dr, int block_tokens, cl_mem ckv, cl_mem kr, tu_rng *rng);

/* Creates the default context into *ctx: 0, or 1 after printing "skipped: no OpenCL device (...)"
   (main then returns 77). */
int tu_context_or_skip(clmla_context **ctx);

/* A context of its own on the default device that traces (CLMLA_TRACE, host/runtime/trace.h) into
   the file "NAME_PID.tsv", whose name goes to path[size] (an old one is removed first); NULL, after
   printing why, where it cannot be created. */
clmla_context *tu_traced_context(const char *name, char *path, size_t size);
/* Destroys `traced`, which writes its trace out, and checks the file: each kernel ran in one
   work-group shape on all of its lines, a shape the library gave ("global/local", never "/-": the
   driver's choice), so that a driver that compiles a kernel per shape (PoCL) compiles it once
   whatever the calls' token counts. Prints each kernel that breaks it, or the kernel lines read,
   and removes the file. Returns how many kernels broke it, -1 where the file could not be read or
   held no kernel line. */
int tu_traced_context_shapes(clmla_context *traced, const char *path);

/* 1 + the most blocks of block_tokens rows that one of the nseq sequences of lens[] takes (at least
   1): a block table's row length with one spare entry. */
int tu_max_blocks(const int *lens, int nseq, int block_tokens);

/* ---- named parts -------------------------------------------------------------------------- */

/* One part of a test: `test_x NAME...` runs the named parts, no argument runs them all. */
typedef struct tu_part {
    const char *name;
    void (*run)(void);
} tu_part;

/* Zero-initialised (or NULL): every part runs when none is named, names padded to the longest + 1. */
typedef struct tu_parts_options {
    int name_width;         /* of the name column in the "# part" lines; 0: the longest name + 1 */
    const char *on_request; /* a part that runs only when named, or NULL; it makes "all" (every
                               part) a valid argument too: test_layer's full-size presets */
} tu_parts_options;

typedef enum tu_parts_result {
    TU_PARTS_RAN = 0,       /* the selected parts ran; main returns check_summary() */
    TU_PARTS_NO_DEVICE = 1, /* no context: "no OpenCL device (...)" printed, nothing ran */
    TU_PARTS_UNKNOWN = 2    /* an argument names no part: the parts listed, nothing ran; main returns 2 */
} tu_parts_result;

/* The main of a test made of parts: checks every argument names a part (else prints "unknown part
   'ARG'; the parts are: ..." and returns TU_PARTS_UNKNOWN), creates the default context into *ctx
   (the test's file-level global, which the parts use), runs the selected parts in table order,
   each followed by "# part NAME  X.X s, N failed" where N is how much *check_failed grew (check.h's
   counters are the test's own, so the test passes &check_failed), then destroys *ctx and sets it
   to NULL. The failure CHECK for a missing device and check_summary() stay in the test. */
tu_parts_result tu_run_parts(int argc, char **argv, const tu_part *parts, int n, const tu_parts_options *options,
                             clmla_context **ctx, const int *check_failed);

/* ---- checks (need check.h, included by the test before this header) ----------------------- */

#ifdef CLMLA_TEST_CHECK_H
/* One CHECK: max|got - want| / max|want| over n values <= tol. On failure it prints the error,
   the worst element as [index / cols, index % cols] with both values, and the description
   (printf format and arguments after tol). */
#define CHECK_CLOSE(got, want, n, cols, tol, ...)                                                          \
    do {                                                                                                   \
        char what_[320];                                                                                   \
        snprintf(what_, sizeof(what_), __VA_ARGS__);                                                       \
        size_t n_ = (size_t)(n), cols_ = (size_t)(cols) > 0 ? (size_t)(cols) : 1, worst_ = 0;              \
        double err_ = mla_ref_max_rel_err((got), (want), n_, &worst_), tol_ = (tol);                      \
        CHECK(err_ <= tol_, "%s: max rel err %.3g > %.3g, worst at [%zu, %zu]: got %.8g, want %.8g", what_,  \
              err_, tol_, worst_ / cols_, worst_ % cols_, n_ ? (double)(got)[worst_] : 0.0,                  \
              n_ ? (double)(want)[worst_] : 0.0);                                                          \
    } while (0)

/* main's exit code after tu_run_parts: 2 for an unknown part, 77 (skipped) without a device
   (tu_run_parts said why), else check_summary(). */
static inline int tu_parts_exit(tu_parts_result ran)
{
    if (ran == TU_PARTS_UNKNOWN)
        return 2;
    if (ran == TU_PARTS_NO_DEVICE)
        return 77;
    return check_summary();
}

/* One CHECK: a read-write buffer of `bytes` (4 when 0) in ctx's OpenCL context, a copy of host
   when host is not NULL. */
static inline cl_mem tu_buffer(clmla_context *ctx, size_t bytes, const void *host)
{
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(clmla_context_cl_context(ctx), CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0),
                              bytes ? bytes : 4, (void *)host, &err);
    CHECK(err == CL_SUCCESS && m, "clCreateBuffer(%zu): %d", bytes, err);
    return m;
}

/* Fills ckv [total, rkv] and kr [total, dr] (total: the sum of lens) with values uniform in
   +-sqrt(3) (rms 1, as c^KV after its RMSNorm) from rng, adds nseq sequences to layer 0 of cache
   (one CHECK_STATUS each, their ids into ids[]) and then, unless check_failed has grown past
   failed_before, appends the rows to them with tu_cache_fill_round_robin (one CHECK_STATUS):
   sequence s gets its lens[s] rows in chunks of 1 .. 2 x block_tokens, its blocks scattered. */
static inline void tu_cache_fill_random(clmla_context *ctx, clmla_cache *cache, int32_t *ids, const int *lens,
                                        int nseq, int rkv, int dr, int block_tokens, float *ckv, float *kr,
                                        tu_rng *rng, int failed_before)
{
    size_t total = 0;
    for (int s = 0; s < nseq; s++)
        total += (size_t)lens[s];
    tu_fill_uniform(ckv, total * rkv, 0.0f, 1.7320508f, rng);
    tu_fill_uniform(kr, total * dr, 0.0f, 1.7320508f, rng);
    cl_mem ckv_buf = tu_buffer(ctx, total * rkv * sizeof(float), ckv);
    cl_mem kr_buf = tu_buffer(ctx, total * dr * sizeof(float), kr);
    for (int s = 0; s < nseq; s++)
        CHECK_STATUS(clmla_cache_seq_add(cache, &ids[s]), CLMLA_SUCCESS, ctx);
    if (check_failed == failed_before)
        CHECK_STATUS(tu_cache_fill_round_robin(cache, ids, lens, nseq, rkv, dr, block_tokens, ckv_buf, kr_buf, rng),
                     CLMLA_SUCCESS, ctx);
    clFinish(clmla_context_queue(ctx));
    clReleaseMemObject(ckv_buf);
    clReleaseMemObject(kr_buf);
}

/* Sequence id's n rows of layer 0 as cache holds them, as float64 into *ckv [n, rkv] and *kr [n, dr]
   (malloc'ed), and its block table into row[max_blocks], the entries past its own blocks other
   valid block ids (below num_blocks): two CHECK_STATUS. */
static inline void tu_cache_seq_snapshot(clmla_context *ctx, clmla_cache *cache, int32_t id, int n, int rkv, int dr,
                                         double **ckv, double **kr, int32_t *row, int max_blocks, int num_blocks)
{
    float *c = malloc(((size_t)n * rkv + 1) * sizeof(float)), *r = malloc(((size_t)n * dr + 1) * sizeof(float));
    CHECK_STATUS(clmla_cache_read(cache, 0, id, 0, n, c, r), CLMLA_SUCCESS, ctx);
    *ckv = tu_to_double(c, (size_t)n * rkv);
    *kr = tu_to_double(r, (size_t)n * dr);
    free(c);
    free(r);
    int nb = 0;
    CHECK_STATUS(clmla_cache_seq_blocks(cache, id, row, max_blocks, &nb), CLMLA_SUCCESS, ctx);
    for (int k = nb; k < max_blocks; k++)
        row[k] = (row[0] + 1 + k) % num_blocks;
}

/* One CHECK: a blocking read of the first `bytes` of m into host on ctx's queue. */
static inline void tu_read_buffer(clmla_context *ctx, cl_mem m, size_t bytes, void *host)
{
    cl_int err = clEnqueueReadBuffer(clmla_context_queue(ctx), m, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
    CHECK(err == CL_SUCCESS, "clEnqueueReadBuffer: %d", err);
}
#endif

#endif
