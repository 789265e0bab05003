/* The steady state creates nothing: once every size a workload needs has been seen, its steps
 * allocate no host memory and create no OpenCL buffer, program or kernel (docs/DESIGN.md, "Step
 * buffers"). Each part but the first runs a schedule of 200 steps twice, from the same starting
 * state: the first pass is the warm-up (kept buffers grow, kernels are built on first use), the
 * second is watched and must create nothing. Both passes are checked against the float64 reference.
 *
 *   staged                    the kept step tables alone (scratch.h): writes split at wide gaps and
 *                             merged across narrow ones, sub-buffers read back, before and after
 *                             growth.
 *   layer-rows, layer-group   clmla_layer_forward and clmla_layer_forward_cl (runs of 8 steps
 *                             enqueued without waiting, some with an event) on mixed batches: 1 to 4
 *                             of 6 sequences, decode entries, chunks of 2-16 tokens, a 260-token
 *                             prefill, sequences ending and new ones starting, each step on the
 *                             absorbed, decompressed or AUTO path; with the row-walking (CPU) and
 *                             the work-group (GPU) attention kernels.
 *   latent-rows, latent-group clmla_cache_append_cl and clmla_attention_latent as an engine runs
 *                             them: 1-3 tokens of 1-3 of 3 sequences per step, contexts of up to
 *                             340 keys (split-KV and attn_combine), with and without lse.
 *   dsa-rows, dsa-group       the layer schedule through a layer with DSA's indexer (top-k 24), so
 *                             that most steps write index keys, score and select; after
 *                             clmla_layer_warmup the first pass compiles nothing, and the watched
 *                             second pass must give the first pass's outputs bit for bit.
 *   sparse-rows, sparse-group the same schedule through clmla_attention_latent_sparse, each token's
 *                             list naming every position of its context (in reverse, then an
 *                             out-of-range entry and -1 padding to topk 340), so the outputs are the
 *                             dense ones.
 *
 * Two counters watch the second pass, and each must stay at zero:
 *   - the library's own (host/runtime/clcall.h, clmla_cl_counts): every buffer, program, build and
 *     kernel it creates, and the host allocations of its step path, go through its wrappers;
 *   - a witness in this program that does not rely on the wrappers: the OpenCL entry points that
 *     create buffers, sub-buffers, programs and kernels are interposed (the static library and
 *     CLBlast call these), each call attributed by its return address to CLBlast or to the
 *     rest; and the link wraps malloc, calloc, realloc, posix_memalign, aligned_alloc and strdup
 *     (tests/CMakeLists.txt), which counts every direct call of the library's code (statically
 *     linked here). It does not see allocations inside libc functions, CLBlast or the OpenCL
 *     runtime (a driver allocates for every command it queues; that is not the library's doing).
 * CLBlast, where a product reaches it (here: absorbed runs of more than 8 rows), makes a kernel
 * object of its own per call, four for its indirect GEMM; the witness reports them and holds them
 * to that bound, and holds CLBlast to no buffer (its temporary buffer is the context's scratch).
 * The library's events (one per step for its step tables, see layer.c) are counted too: every one
 * made in the pass must be released by the end of it, but one per layer and cache.
 * `test_steady PART...` runs the named parts. */
#define _GNU_SOURCE
#include "attention.h"
#include "check.h"
#include "clcall.h"
#include "clmla.h"
#include "internal.h"
#include "mla_ref.h"
#include "scratch.h"
#include "test_util.h"
#include "tolerance.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static clmla_context *ctx;

/* ---- the witness ------------------------------------------------------------------------------ */

enum { BY_CLMLA, BY_CLBLAST, CALLERS };
enum { MADE_BUFFERS, MADE_PROGRAMS, MADE_BUILDS, MADE_KERNELS, MADE_KINDS };
static const char *const made_names[MADE_KINDS] = {"buffers", "programs", "builds", "kernels"};
static long made[CALLERS][MADE_KINDS];
static long host_allocs;
static int watching;

static int caller_of(const void *return_address)
{
    Dl_info info;
    if (dladdr(return_address, &info) && info.dli_fname && strstr(info.dli_fname, "clblast"))
        return BY_CLBLAST;
    return BY_CLMLA; /* the library, statically linked into this program, or the program itself */
}

#define WITNESS(kind)                                                                                    \
    do {                                                                                                 \
        if (watching)                                                                                    \
            made[caller_of(__builtin_return_address(0))][kind]++;                                        \
    } while (0)

/* The next definition of `name` after this program's: the OpenCL loader's. */
static void *next_symbol(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

CL_API_ENTRY cl_mem CL_API_CALL clCreateBuffer(cl_context context, cl_mem_flags flags, size_t size, void *host_ptr,
                                               cl_int *errcode_ret)
{
    static cl_mem(CL_API_CALL * real)(cl_context, cl_mem_flags, size_t, void *, cl_int *);
    WITNESS(MADE_BUFFERS);
    if (!real)
        *(void **)&real = next_symbol("clCreateBuffer");
    return real(context, flags, size, host_ptr, errcode_ret);
}

CL_API_ENTRY cl_mem CL_API_CALL clCreateSubBuffer(cl_mem buffer, cl_mem_flags flags, cl_buffer_create_type type,
                                                  const void *info, cl_int *errcode_ret)
{
    static cl_mem(CL_API_CALL * real)(cl_mem, cl_mem_flags, cl_buffer_create_type, const void *, cl_int *);
    WITNESS(MADE_BUFFERS);
    if (!real)
        *(void **)&real = next_symbol("clCreateSubBuffer");
    return real(buffer, flags, type, info, errcode_ret);
}

CL_API_ENTRY cl_program CL_API_CALL clCreateProgramWithSource(cl_context context, cl_uint count, const char **strings,
                                                              const size_t *lengths, cl_int *errcode_ret)
{
    static cl_program(CL_API_CALL * real)(cl_context, cl_uint, const char **, const size_t *, cl_int *);
    WITNESS(MADE_PROGRAMS);
    if (!real)
        *(void **)&real = next_symbol("clCreateProgramWithSource");
    return real(context, count, strings, lengths, errcode_ret);
}

CL_API_ENTRY cl_program CL_API_CALL clCreateProgramWithBinary(cl_context context, cl_uint num_devices,
                                                              const cl_device_id *devices, const size_t *lengths,
                                                              const unsigned char **binaries, cl_int *binary_status,
                                                              cl_int *errcode_ret)
{
    static cl_program(CL_API_CALL * real)(cl_context, cl_uint, const cl_device_id *, const size_t *,
                                          const unsigned char **, cl_int *, cl_int *);
    WITNESS(MADE_PROGRAMS);
    if (!real)
        *(void **)&real = next_symbol("clCreateProgramWithBinary");
    return real(context, num_devices, devices, lengths, binaries, binary_status, errcode_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clBuildProgram(cl_program program, cl_uint num_devices, const cl_device_id *devices,
                                               const char *options, void(CL_CALLBACK *notify)(cl_program, void *),
                                               void *user_data)
{
    static cl_int(CL_API_CALL * real)(cl_program, cl_uint, const cl_device_id *, const char *,
                                      void(CL_CALLBACK *)(cl_program, void *), void *);
    WITNESS(MADE_BUILDS);
    if (!real)
        *(void **)&real = next_symbol("clBuildProgram");
    return real(program, num_devices, devices, options, notify, user_data);
}

CL_API_ENTRY cl_kernel CL_API_CALL clCreateKernel(cl_program program, const char *kernel_name, cl_int *errcode_ret)
{
    static cl_kernel(CL_API_CALL * real)(cl_program, const char *, cl_int *);
    WITNESS(MADE_KERNELS);
    if (!real)
        *(void **)&real = next_symbol("clCreateKernel");
    return real(program, kernel_name, errcode_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clCreateKernelsInProgram(cl_program program, cl_uint num_kernels, cl_kernel *kernels,
                                                         cl_uint *num_kernels_ret)
{
    static cl_int(CL_API_CALL * real)(cl_program, cl_uint, cl_kernel *, cl_uint *);
    WITNESS(MADE_KERNELS);
    if (!real)
        *(void **)&real = next_symbol("clCreateKernelsInProgram");
    return real(program, num_kernels, kernels, num_kernels_ret);
}

/* The allocators, wrapped at link time (-Wl,--wrap=NAME: calls of NAME in this program's objects
   and the static library's come here, __real_NAME is libc's): each counts the call while watching,
   then calls libc's. */
#define WRAP_ALLOC(ret, name, params, args) \
    ret __real_##name params;               \
    ret __wrap_##name params;               \
    ret __wrap_##name params                \
    {                                       \
        host_allocs += watching;            \
        return __real_##name args;          \
    }
WRAP_ALLOC(void *, malloc, (size_t size), (size))
WRAP_ALLOC(void *, calloc, (size_t count, size_t size), (count, size))
WRAP_ALLOC(void *, realloc, (void *ptr, size_t size), (ptr, size))
WRAP_ALLOC(int, posix_memalign, (void **ptr, size_t alignment, size_t size), (ptr, alignment, size))
WRAP_ALLOC(void *, aligned_alloc, (size_t alignment, size_t size), (alignment, size))
WRAP_ALLOC(char *, strdup, (const char *s), (s))

/* What one watched pass made. */
typedef struct watch {
    clmla_cl_counts lib;                 /* the library's counters at the start */
    long made[CALLERS][MADE_KINDS];      /* the witness's at the start */
    long host_allocs;
} watch;

static void watch_start(watch *w)
{
    w->lib = clmla_cl_counts_get(ctx);
    memcpy(w->made, made, sizeof(made));
    w->host_allocs = host_allocs;
    watching = 1;
}

/* Stops watching and checks the pass: nothing made but CLBlast's kernels (at most 4 per call) and
   events released but at most `kept_events`. After clmla_layer_warmup (compiles_only) the first
   pass may still grow its tables, but nothing may be compiled: no program, build or kernel. */
static int compiles_only;
static void watch_check(const watch *w, int kept_events, const char *what)
{
    watching = 0;
    const clmla_cl_counts now = clmla_cl_counts_get(ctx);
    const long lib[] = {now.buffers - w->lib.buffers, now.programs - w->lib.programs, now.builds - w->lib.builds,
                        now.kernels - w->lib.kernels};
    for (int k = compiles_only ? MADE_PROGRAMS : 0; k < MADE_KINDS; k++) {
        CHECK(lib[k] == 0, "%s: the library counted %ld %s created in the steady state", what, lib[k], made_names[k]);
        const long by_clmla = made[BY_CLMLA][k] - w->made[BY_CLMLA][k];
        CHECK(by_clmla == 0, "%s: the witness saw %ld %s created outside CLBlast in the steady state", what, by_clmla,
              made_names[k]);
    }
    const long clblast_calls = now.clblast_calls - w->lib.clblast_calls;
    const long clblast_kernels = made[BY_CLBLAST][MADE_KERNELS] - w->made[BY_CLBLAST][MADE_KERNELS];
    for (int k = 0; k < MADE_KINDS; k++)
        if (k != MADE_KERNELS) {
            const long n = made[BY_CLBLAST][k] - w->made[BY_CLBLAST][k];
            CHECK(n == 0, "%s: CLBlast created %ld %s in the steady state", what, n, made_names[k]);
        }
    CHECK(clblast_kernels <= 4 * clblast_calls, "%s: CLBlast created %ld kernels in %ld calls", what, clblast_kernels,
          clblast_calls);
    const long lib_allocs = now.host_allocs - w->lib.host_allocs, allocs = host_allocs - w->host_allocs;
    CHECK(compiles_only || lib_allocs == 0, "%s: the library counted %ld host allocations in the steady state", what,
          lib_allocs);
    CHECK(compiles_only || allocs == 0, "%s: the witness saw %ld host allocations in the steady state", what, allocs);
    const long events = now.events - w->lib.events;
    const long outstanding = (now.events - now.events_released) - (w->lib.events - w->lib.events_released);
    CHECK(outstanding <= kept_events && now.events - now.events_released <= kept_events,
          "%s: %ld of the library's events made in the pass are not released", what, outstanding);
    printf("  %s: library: %ld buffers, %ld programs, %ld builds, %ld kernels, %ld host allocations; witness: %ld buffers, "
           "%ld kernels outside CLBlast, %ld host allocations; %ld events made and released; CLBlast: %ld calls, %ld "
           "kernel objects of its own\n",
           what, lib[MADE_BUFFERS], lib[MADE_PROGRAMS], lib[MADE_BUILDS], lib[MADE_KERNELS], lib_allocs,
           made[BY_CLMLA][MADE_BUFFERS] - w->made[BY_CLMLA][MADE_BUFFERS],
           made[BY_CLMLA][MADE_KERNELS] - w->made[BY_CLMLA][MADE_KERNELS], allocs, events, clblast_calls, clblast_kernels);
}

/* ---- the layer's schedule ------------------------------------------------------------------------ */

enum { SEQS = 6, STEPS = 200, MAX_ENTRIES = 4, LONG_PREFILL = 260, LONG_LIFE = 300, RUN = 8 };

/* One sequence from its first token to its last: inputs and the reference's outputs. */
typedef struct life {
    int tokens;
    float *x;       /* [tokens, D] */
    tu_ref_run ref; /* out [tokens, D] */
} life;

typedef struct layer_step {
    int entries;
    int slot[MAX_ENTRIES], tokens[MAX_ENTRIES], life[MAX_ENTRIES], pos[MAX_ENTRIES];
    clmla_attention_path path;
    int on_device;  /* clmla_layer_forward_cl, not waited for */
    int want_event; /* ... asking for its event */
    int rows;
    size_t row0;    /* its first row in the pass's x and out */
    int ends[SEQS]; /* the slot's sequence has ended after this step: a new one starts in its place */
} layer_step;

typedef struct schedule {
    clmla_layer_config config;
    tu_weights w;
    layer_step steps[STEPS];
    life *lives;
    int num_lives;
    size_t rows;
    float *x; /* [rows, D], each step's inputs at its row0 */
} schedule;

static void schedule_free(schedule *s)
{
    for (int i = 0; i < s->num_lives; i++) {
        free(s->lives[i].x);
        tu_ref_run_free(&s->lives[i].ref);
    }
    free(s->lives);
    free(s->x);
    tu_weights_free(&s->w);
}

/* A new life of slot `slot`: the long one for slot 0, 8 to 80 tokens for the others. */
static int new_life(schedule *s, int slot, tu_rng *rng)
{
    const int tokens = slot == 0 ? LONG_LIFE : 8 + tu_rng_below(rng, 73);
    life *grown = realloc(s->lives, (size_t)(s->num_lives + 1) * sizeof(*grown));
    if (!grown)
        return -1;
    s->lives = grown;
    life *l = &s->lives[s->num_lives];
    memset(l, 0, sizeof(*l));
    l->tokens = tokens;
    l->x = tu_random_inputs(tokens, s->config.hidden_size, 7000 + (uint64_t)s->num_lives);
    if (!l->x || tu_ref_run_make(&l->ref, &s->w, tokens, l->x, MLA_REF_DECOMPRESSED) != 0) {
        free(l->x);
        return -1;
    }
    return s->num_lives++;
}

static int schedule_make(schedule *s)
{
    memset(s, 0, sizeof(*s));
    s->config = tu_small_config(48, 5, 24, 32, 16, 8, 16);
    if (tu_weights_make(&s->w, &s->config, 91) != 0)
        return -1;
    tu_rng rng = tu_rng_seed(92);
    int life_of[SEQS], pos[SEQS];
    for (int k = 0; k < SEQS; k++) {
        life_of[k] = new_life(s, k, &rng);
        pos[k] = 0;
        if (life_of[k] < 0)
            return -1;
    }
    static const clmla_attention_path paths[3] = {CLMLA_PATH_ABSORBED, CLMLA_PATH_DECOMPRESSED, CLMLA_PATH_AUTO};
    for (int i = 0; i < STEPS; i++) {
        layer_step *st = &s->steps[i];
        int order[SEQS];
        for (int k = 0; k < SEQS; k++)
            order[k] = k;
        tu_shuffle_ints(order, SEQS, &rng);
        st->entries = 1 + tu_rng_below(&rng, MAX_ENTRIES);
        st->path = paths[tu_rng_below(&rng, 3)];
        st->on_device = (i / RUN) % 2 == 1;
        st->want_event = i % 3 == 0;
        st->row0 = s->rows;
        for (int e = 0; e < st->entries; e++) {
            const int k = order[e], left = s->lives[life_of[k]].tokens - pos[k], r = tu_rng_below(&rng, 100);
            int n = k == 0 && pos[k] == 0 ? LONG_PREFILL : r < 60 ? 1 : r < 85 ? 2 + tu_rng_below(&rng, 7)
                                                                             : 9 + tu_rng_below(&rng, 8);
            n = n < left ? n : left;
            st->slot[e] = k;
            st->tokens[e] = n;
            st->life[e] = life_of[k];
            st->pos[e] = pos[k];
            st->rows += n;
            pos[k] += n;
            if (pos[k] == s->lives[life_of[k]].tokens) {
                st->ends[k] = 1;
                life_of[k] = new_life(s, k, &rng);
                pos[k] = 0;
                if (life_of[k] < 0)
                    return -1;
            }
        }
        s->rows += (size_t)st->rows;
    }
    const size_t D = (size_t)s->config.hidden_size;
    s->x = malloc(s->rows * D * sizeof(float));
    if (!s->x)
        return -1;
    for (int i = 0; i < STEPS; i++) {
        const layer_step *st = &s->steps[i];
        size_t row = st->row0;
        for (int e = 0; e < st->entries; row += (size_t)st->tokens[e], e++)
            memcpy(s->x + row * D, s->lives[st->life[e]].x + (size_t)st->pos[e] * D,
                   (size_t)st->tokens[e] * D * sizeof(float));
    }
    return 0;
}

/* One pass of the schedule from an empty cache: SEQS new sequences, then every step; the outputs in
   out [rows, D] (the device steps' read back after the pass). Returns 0 when every call succeeded. */
static int run_layer_pass(const schedule *s, clmla_layer *layer, clmla_cache *cache, cl_mem xb, cl_mem ob, float *out,
                          watch *w, const char *what)
{
    const size_t D = (size_t)s->config.hidden_size;
    int32_t id[SEQS];
    int ok = 1;
    if (w)
        watch_start(w);
    for (int k = 0; k < SEQS; k++)
        ok &= clmla_cache_seq_add(cache, &id[k]) == CLMLA_SUCCESS;
    for (int i = 0; i < STEPS && ok; i++) {
        const layer_step *st = &s->steps[i];
        clmla_batch_entry entries[MAX_ENTRIES];
        for (int e = 0; e < st->entries; e++) {
            entries[e].seq_id = id[st->slot[e]];
            entries[e].num_tokens = st->tokens[e];
        }
        clmla_forward_args a;
        memset(&a, 0, sizeof(a));
        a.entries = entries;
        a.num_entries = st->entries;
        a.path = st->path;
        clmla_status status;
        if (st->on_device) {
            cl_event ev = NULL;
            status = clmla_layer_forward_cl(layer, cache, &a, xb, st->row0 * D, ob, st->row0 * D,
                                            st->want_event ? &ev : NULL);
            if (ev)
                clReleaseEvent(ev);
        } else {
            status = clmla_layer_forward(layer, cache, &a, s->x + st->row0 * D, out + st->row0 * D);
        }
        CHECK(status == CLMLA_SUCCESS, "%s step %d (%d entries, %d rows, %s): %s: %s", what, i, st->entries, st->rows,
              st->on_device ? "forward_cl" : "forward", clmla_status_string(status), clmla_last_error(ctx));
        ok &= status == CLMLA_SUCCESS;
        for (int k = 0; k < SEQS && ok; k++)
            if (st->ends[k]) {
                int32_t again = -1;
                ok &= clmla_cache_seq_free(cache, id[k]) == CLMLA_SUCCESS;
                ok &= clmla_cache_seq_add(cache, &again) == CLMLA_SUCCESS;
                id[k] = again;
            }
    }
    for (int k = 0; k < SEQS; k++)
        clmla_cache_seq_free(cache, id[k]);
    if (w)
        watch_check(w, 1, what);
    CHECK(ok, "%s: a call failed", what);
    /* the device steps' outputs */
    float *dev = malloc(s->rows * D * sizeof(float));
    if (!dev || clEnqueueReadBuffer(clmla_context_queue(ctx), ob, CL_TRUE, 0, s->rows * D * sizeof(float), dev, 0, NULL,
                                    NULL) != CL_SUCCESS) {
        free(dev);
        return 0;
    }
    for (int i = 0; i < STEPS; i++)
        if (s->steps[i].on_device)
            memcpy(out + s->steps[i].row0 * D, dev + s->steps[i].row0 * D, (size_t)s->steps[i].rows * D * sizeof(float));
    free(dev);
    return ok;
}

/* Every step's output rows against the reference's rows of the same tokens. */
static void check_layer_pass(const schedule *s, const float *out, const char *what)
{
    const size_t D = (size_t)s->config.hidden_size;
    for (int i = 0; i < STEPS; i++) {
        const layer_step *st = &s->steps[i];
        size_t row = st->row0;
        for (int e = 0; e < st->entries; row += (size_t)st->tokens[e], e++) {
            const life *l = &s->lives[st->life[e]];
            CHECK_CLOSE(out + row * D, l->ref.out + (size_t)st->pos[e] * D, (size_t)st->tokens[e] * D, D, TOL_F32_CACHE,
                        "%s step %d entry %d (tokens %d..%d of a sequence of %d) vs reference [token, i]", what, i, e,
                        st->pos[e], st->pos[e] + st->tokens[e] - 1, l->tokens);
        }
    }
}

/* What a layer part runs on: the layer, its cache and the schedule's input and output buffers. */
typedef struct rig {
    clmla_layer *layer;
    clmla_cache *cache;
    cl_mem xb, ob;
} rig;

/* A rig for schedule s with the given layer and cache (blocks of 8, 96 of them); every member NULL
   where its creation failed (a CHECK says so). The attention variant is set for the part. */
static void rig_open(rig *r, const schedule *s, int variant, const clmla_layer_config *config,
                     const clmla_layer_weights *weights, int index_dim, clmla_cache_dtype index_dtype, const char *name)
{
    memset(r, 0, sizeof(*r));
    const size_t bytes = s->rows * (size_t)s->config.hidden_size * sizeof(float);
    clmla_attention_set_variant(ctx, variant);
    const clmla_cache_config cc = {1, s->config.kv_lora_rank, s->config.qk_rope_head_dim, 8, 96, CLMLA_CACHE_F32,
                                   index_dim, index_dtype};
    CHECK_STATUS(clmla_layer_create(ctx, config, weights, &r->layer), CLMLA_SUCCESS, ctx);
    CHECK_STATUS(clmla_cache_create(ctx, &cc, &r->cache), CLMLA_SUCCESS, ctx);
    cl_int err = CL_SUCCESS;
    r->xb = clCreateBuffer(clmla_context_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, s->x, &err);
    r->ob = clCreateBuffer(clmla_context_cl_context(ctx), CL_MEM_READ_WRITE, bytes, NULL, &err);
    CHECK(r->xb && r->ob, "%s: clCreateBuffer: %d", name, err);
}

static int rig_ok(const rig *r)
{
    return r->layer && r->cache && r->xb && r->ob;
}

static void rig_close(rig *r)
{
    if (r->xb)
        clReleaseMemObject(r->xb);
    if (r->ob)
        clReleaseMemObject(r->ob);
    clmla_cache_destroy(r->cache);
    clmla_layer_destroy(r->layer);
    clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
}

static void layer_part(int variant, const char *name, int warmup)
{
    schedule s;
    const int made_ok = schedule_make(&s) == 0;
    CHECK(made_ok, "%s: setting up the schedule failed", name);
    const size_t D = (size_t)s.config.hidden_size;
    rig r;
    memset(&r, 0, sizeof(r));
    float *out = made_ok ? calloc(s.rows * D, sizeof(float)) : NULL;
    if (made_ok && out)
        rig_open(&r, &s, variant, &s.config, &s.w.layer, 0, CLMLA_CACHE_F32, name);
    clmla_layer *layer = r.layer;
    clmla_cache *cache = r.cache;
    cl_mem xb = r.xb, ob = r.ob;
    if (rig_ok(&r) && warmup) {
        /* clmla_layer_warmup, then the schedule's first pass compiles nothing */
        char what[96];
        CHECK_STATUS(clmla_layer_warmup(layer, cache, 0), CLMLA_SUCCESS, ctx);
        clmla_cache_info ci;
        clmla_cache_get_info(cache, &ci);
        CHECK(ci.sequences == 0 && ci.blocks_used == 0, "%s: the warm-up left %d sequences, %d blocks", name,
              ci.sequences, ci.blocks_used);
        watch w;
        snprintf(what, sizeof(what), "%s first pass after clmla_layer_warmup", name);
        compiles_only = 1;
        if (run_layer_pass(&s, layer, cache, xb, ob, out, &w, what))
            check_layer_pass(&s, out, what);
        compiles_only = 0;
    } else if (rig_ok(&r)) {
        char what[96];
        snprintf(what, sizeof(what), "%s warm-up", name);
        if (run_layer_pass(&s, layer, cache, xb, ob, out, NULL, what))
            check_layer_pass(&s, out, what);
        memset(out, 0, s.rows * D * sizeof(float));
        watch w;
        snprintf(what, sizeof(what), "%s steady", name);
        if (run_layer_pass(&s, layer, cache, xb, ob, out, &w, what))
            check_layer_pass(&s, out, what);
    }
    rig_close(&r);
    free(out);
    schedule_free(&s);
}

/* A sparse-attention layer (an indexer, top-k 24 of H_I 4 heads of d_I 16) on the same schedule:
   most steps select (the 260-token prefill and every context past 24 keys), all of them write
   index keys. Its second pass must create nothing and give the first pass's outputs bit for bit
   (the selection is deterministic); test_dsa_layer holds the outputs to the float64 reference. */
static void dsa_part(int variant, const char *name)
{
    schedule s;
    const int made_ok = schedule_make(&s) == 0;
    CHECK(made_ok, "%s: setting up the schedule failed", name);
    const size_t D = (size_t)s.config.hidden_size, HI = 4, dI = 16, rq = (size_t)s.config.q_lora_rank;
    clmla_layer_config c = s.config;
    c.index_n_heads = (int)HI;
    c.index_head_dim = (int)dI;
    c.index_topk = 24;
    c.index_rope_pairing = CLMLA_ROPE_HALF_SPLIT;
    float *wq = malloc(HI * dI * rq * sizeof(float)), *wk = malloc(dI * D * sizeof(float));
    float *kn = malloc(dI * sizeof(float)), *kb = malloc(dI * sizeof(float)), *ww = malloc(HI * D * sizeof(float));
    float *first = made_ok ? calloc(s.rows * D, sizeof(float)) : NULL;
    float *second = made_ok ? calloc(s.rows * D, sizeof(float)) : NULL;
    rig r;
    memset(&r, 0, sizeof(r));
    if (made_ok && wq && wk && kn && kb && ww && first && second) {
        tu_rng rng = tu_rng_seed(93);
        tu_fill_uniform(wq, HI * dI * rq, 0.0f, 0.3f, &rng);
        tu_fill_uniform(wk, dI * D, 0.0f, 0.25f, &rng);
        tu_fill_uniform(kn, dI, 1.0f, 0.2f, &rng);
        tu_fill_uniform(kb, dI, 0.0f, 0.2f, &rng);
        tu_fill_uniform(ww, HI * D, 0.0f, 0.25f, &rng);
        clmla_layer_weights w = s.w.layer;
        w.indexer_wq_b = clmla_tensor_2d(wq, (int64_t)(HI * dI), (int64_t)rq);
        w.indexer_wk = clmla_tensor_2d(wk, (int64_t)dI, (int64_t)D);
        w.indexer_k_norm = clmla_tensor_1d(kn, (int64_t)dI);
        w.indexer_k_norm_bias = clmla_tensor_1d(kb, (int64_t)dI);
        w.indexer_weights_proj = clmla_tensor_2d(ww, (int64_t)HI, (int64_t)D);
        rig_open(&r, &s, variant, &c, &w, (int)dI, CLMLA_CACHE_BF16, name);
    }
    clmla_layer *layer = r.layer;
    clmla_cache *cache = r.cache;
    cl_mem xb = r.xb, ob = r.ob;
    if (rig_ok(&r)) {
        char what[96];
        /* clmla_layer_warmup builds the indexer's and the sparse kernels too: the first pass then
           compiles nothing */
        CHECK_STATUS(clmla_layer_warmup(layer, cache, 0), CLMLA_SUCCESS, ctx);
        snprintf(what, sizeof(what), "%s first pass after clmla_layer_warmup", name);
        watch w0;
        compiles_only = 1;
        const int ran = run_layer_pass(&s, layer, cache, xb, ob, first, &w0, what);
        compiles_only = 0;
        watch w;
        snprintf(what, sizeof(what), "%s steady", name);
        if (ran && run_layer_pass(&s, layer, cache, xb, ob, second, &w, what)) {
            size_t differ = 0;
            for (size_t i = 0; i < s.rows * D; i++)
                differ += memcmp(&first[i], &second[i], sizeof(float)) != 0;
            CHECK(differ == 0, "%s: %zu output values differ between the two passes", name, differ);
        }
    }
    rig_close(&r);
    free(wq), free(wk), free(kn), free(kb), free(ww), free(first), free(second);
    schedule_free(&s);
}

static void test_dsa_rows(void)
{
    dsa_part(CLMLA_LATENT_ROWS, "dsa-rows");
}

static void test_dsa_group(void)
{
    dsa_part(CLMLA_LATENT_GROUP, "dsa-group");
}

static void test_layer_rows(void)
{
    layer_part(CLMLA_LATENT_ROWS, "layer-rows", 0);
}

static void test_layer_group(void)
{
    layer_part(CLMLA_LATENT_GROUP, "layer-group", 0);
}

/* clmla_layer_warmup builds what the schedule's steps select (both kernel variants): nothing is
   compiled in its first pass. A cache too small for the warm-up is refused before anything runs. */
static void test_warmup(void)
{
    layer_part(CLMLA_LATENT_ROWS, "warmup-rows", 1);
    layer_part(CLMLA_LATENT_GROUP, "warmup-group", 1);
    schedule s;
    if (schedule_make(&s) != 0)
        return;
    clmla_layer *layer = NULL;
    clmla_cache *cache = NULL;
    const clmla_cache_config small = {1, s.config.kv_lora_rank, s.config.qk_rope_head_dim, 8, 30, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
    CHECK_STATUS(clmla_layer_create(ctx, &s.config, &s.w.layer, &layer), CLMLA_SUCCESS, ctx);
    CHECK_STATUS(clmla_cache_create(ctx, &small, &cache), CLMLA_SUCCESS, ctx);
    if (layer && cache) {
        CHECK_STATUS(clmla_layer_warmup(layer, cache, 0), CLMLA_ERROR_CACHE_FULL, ctx);
        char want[64];
        snprintf(want, sizeof(want), "needs %d free blocks of the cache (%d tokens)", (CLMLA_WARMUP_TOKENS + 7) / 8,
                 CLMLA_WARMUP_TOKENS);
        CHECK(strstr(clmla_last_error(ctx), want) != NULL, "small cache: %s (want \"%s\")", clmla_last_error(ctx), want);
        clmla_cache_info ci;
        clmla_cache_get_info(cache, &ci);
        CHECK(ci.sequences == 0 && ci.blocks_used == 0, "refused warm-up left %d sequences", ci.sequences);
    }
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    schedule_free(&s);
}

/* ---- latent attention alone ------------------------------------------------------------------------ */

/* 3 sequences of up to 340 keys in blocks of 8, 5 heads, rkv 32 and dr 8; at most 3 tokens of each
   sequence in a step */
enum { LSEQS = 3, MAX_KEYS = 340, BT = 8, MAX_BLOCKS = MAX_KEYS / BT + 1, RKV = 32, DR = 8, HEADS = 5 };
enum { MAX_STEP_TOKENS = 3 * LSEQS };
static const int first_length[LSEQS] = {40, 270, 5};

typedef struct latent_step {
    int entries, slot[LSEQS], tokens[LSEQS], pos[LSEQS]; /* pos: the sequence's length before the step */
    int restart[LSEQS]; /* the slot's sequence is freed and begins again (first_length) before the step */
    int T, row0, max_ctx, with_lse;
} latent_step;

typedef struct latent_data {
    latent_step steps[STEPS];
    int rows;
    float *ckv, *kr;        /* [LSEQS, MAX_KEYS, RKV], [.., DR]: the rows appended at each position */
    float *q_lat, *q_rope;  /* [rows, HEADS, RKV], [rows, HEADS, DR] */
    int *token_seq, *token_ctx; /* [rows] */
    cl_mem ckv_b, kr_b, q_lat_b, q_rope_b, out_b, lse_b, table_b, seq_b, ctx_b;
    cl_mem idx_b; /* [rows, MAX_KEYS] int32: each row's index list for the sparse parts */
} latent_data;

static void latent_free(latent_data *d)
{
    RELEASE_MEMS(d->ckv_b, d->kr_b, d->q_lat_b, d->q_rope_b, d->out_b, d->lse_b, d->table_b, d->seq_b, d->ctx_b,
                 d->idx_b);
    FREE_ALL(d->ckv, d->kr, d->q_lat, d->q_rope, d->token_seq, d->token_ctx);
}

static cl_mem device_copy(const void *host, size_t bytes)
{
    return tu_buffer(ctx, bytes, host);
}

static int latent_make(latent_data *d)
{
    memset(d, 0, sizeof(*d));
    tu_rng rng = tu_rng_seed(93);
    int length[LSEQS];
    for (int k = 0; k < LSEQS; k++)
        length[k] = first_length[k];
    for (int i = 0; i < STEPS; i++) {
        latent_step *st = &d->steps[i];
        int order[LSEQS] = {0, 1, 2};
        tu_shuffle_ints(order, LSEQS, &rng);
        st->entries = 1 + tu_rng_below(&rng, LSEQS);
        st->row0 = d->rows;
        st->with_lse = i % 2;
        for (int e = 0; e < st->entries; e++) {
            const int k = order[e], n = 1 + tu_rng_below(&rng, 3);
            if (length[k] + n > MAX_KEYS) {
                st->restart[k] = 1;
                length[k] = first_length[k];
            }
            st->slot[e] = k;
            st->tokens[e] = n;
            st->pos[e] = length[k];
            length[k] += n;
            st->T += n;
            if (length[k] > st->max_ctx)
                st->max_ctx = length[k];
        }
        d->rows += st->T;
    }
    const size_t rows = (size_t)d->rows, keys = (size_t)LSEQS * MAX_KEYS;
    d->ckv = malloc(keys * RKV * sizeof(float));
    d->kr = malloc(keys * DR * sizeof(float));
    d->q_lat = malloc(rows * HEADS * RKV * sizeof(float));
    d->q_rope = malloc(rows * HEADS * DR * sizeof(float));
    d->token_seq = malloc(rows * sizeof(int));
    d->token_ctx = malloc(rows * sizeof(int));
    if (!d->ckv || !d->kr || !d->q_lat || !d->q_rope || !d->token_seq || !d->token_ctx)
        return -1;
    tu_fill_uniform(d->ckv, keys * RKV, 0.0f, 1.0f, &rng);
    tu_fill_uniform(d->kr, keys * DR, 0.0f, 1.0f, &rng);
    tu_fill_uniform(d->q_lat, rows * HEADS * RKV, 0.0f, 0.5f, &rng);
    tu_fill_uniform(d->q_rope, rows * HEADS * DR, 0.0f, 0.5f, &rng);
    for (int i = 0; i < STEPS; i++) {
        const latent_step *st = &d->steps[i];
        int row = st->row0;
        for (int e = 0; e < st->entries; e++)
            for (int t = 0; t < st->tokens[e]; t++, row++) {
                d->token_seq[row] = st->slot[e];
                d->token_ctx[row] = st->pos[e] + t + 1;
            }
    }
    d->ckv_b = device_copy(d->ckv, keys * RKV * sizeof(float));
    d->kr_b = device_copy(d->kr, keys * DR * sizeof(float));
    d->q_lat_b = device_copy(d->q_lat, rows * HEADS * RKV * sizeof(float));
    d->q_rope_b = device_copy(d->q_rope, rows * HEADS * DR * sizeof(float));
    d->seq_b = device_copy(d->token_seq, rows * sizeof(int));
    d->ctx_b = device_copy(d->token_ctx, rows * sizeof(int));
    d->out_b = device_copy(NULL, rows * HEADS * RKV * sizeof(float));
    d->lse_b = device_copy(NULL, rows * HEADS * sizeof(float));
    d->table_b = device_copy(NULL, (size_t)LSEQS * MAX_BLOCKS * sizeof(int32_t));
    /* every position of the row's context, last first, then one past the end, then -1 */
    int32_t *idx = malloc(rows * MAX_KEYS * sizeof(int32_t));
    if (!idx)
        return -1;
    for (size_t r = 0; r < rows; r++)
        for (int i = 0; i < MAX_KEYS; i++) {
            const int n = d->token_ctx[r];
            idx[r * MAX_KEYS + (size_t)i] = i < n ? n - 1 - i : i == n ? n : -1;
        }
    d->idx_b = device_copy(idx, rows * MAX_KEYS * sizeof(int32_t));
    free(idx);
    return d->ckv_b && d->kr_b && d->q_lat_b && d->q_rope_b && d->seq_b && d->ctx_b && d->out_b && d->lse_b &&
                   d->table_b && d->idx_b
               ? 0
               : -1;
}

/* Appends positions [from, to) of slot k's rows to sequence id. */
static clmla_status append(const latent_data *d, clmla_cache *cache, int32_t id, int k, int from, int to)
{
    const size_t row = (size_t)k * MAX_KEYS + (size_t)from;
    return clmla_cache_append_cl(cache, 0, id, to - from, d->ckv_b, row * RKV, RKV, d->kr_b, row * DR, DR, NULL);
}

/* One pass of the latent schedule from an empty cache; the outputs stay in out_b and lse_b. The
   block tables, token_seq and token_ctx are the caller's (this program's), written before each
   call. Returns 0 when every call succeeded. With sparse, clmla_attention_latent_sparse over the
   rows' index lists (idx_b, topk MAX_KEYS). */
static int run_latent_pass(const latent_data *d, clmla_cache *cache, float scale, int sparse, watch *w,
                           const char *what)
{
    cl_command_queue queue = clmla_context_queue(ctx);
    int32_t id[LSEQS], tables[LSEQS * MAX_BLOCKS];
    int ok = 1;
    if (w)
        watch_start(w);
    for (int k = 0; k < LSEQS; k++) {
        ok &= clmla_cache_seq_add(cache, &id[k]) == CLMLA_SUCCESS;
        ok &= ok && append(d, cache, id[k], k, 0, first_length[k]) == CLMLA_SUCCESS;
    }
    for (int i = 0; i < STEPS && ok; i++) {
        const latent_step *st = &d->steps[i];
        for (int e = 0; e < st->entries && ok; e++) {
            const int k = st->slot[e];
            if (st->restart[k]) {
                ok &= clmla_cache_seq_free(cache, id[k]) == CLMLA_SUCCESS;
                ok &= clmla_cache_seq_add(cache, &id[k]) == CLMLA_SUCCESS;
                ok &= ok && append(d, cache, id[k], k, 0, first_length[k]) == CLMLA_SUCCESS;
            }
            ok &= ok && append(d, cache, id[k], k, st->pos[e], st->pos[e] + st->tokens[e]) == CLMLA_SUCCESS;
        }
        memset(tables, 0, sizeof(tables));
        for (int k = 0; k < LSEQS && ok; k++)
            ok &= clmla_cache_seq_blocks(cache, id[k], tables + k * MAX_BLOCKS, MAX_BLOCKS, NULL) == CLMLA_SUCCESS;
        CHECK(ok, "%s step %d: appending failed: %s", what, i, clmla_last_error(ctx));
        ok &= clEnqueueWriteBuffer(queue, d->table_b, CL_TRUE, 0, sizeof(tables), tables, 0, NULL, NULL) == CL_SUCCESS;
        ok &= clEnqueueWriteBuffer(queue, d->seq_b, CL_TRUE, 0, (size_t)st->T * sizeof(int), d->token_seq + st->row0, 0,
                                   NULL, NULL) == CL_SUCCESS;
        ok &= clEnqueueWriteBuffer(queue, d->ctx_b, CL_TRUE, 0, (size_t)st->T * sizeof(int), d->token_ctx + st->row0, 0,
                                   NULL, NULL) == CL_SUCCESS;
        if (!ok)
            break;
        clmla_latent_attention_args a = {.num_tokens = st->T, .num_heads = HEADS, .softmax_scale = scale,
                                         .q_latent = d->q_lat_b, .q_latent_offset = (size_t)st->row0 * HEADS * RKV,
                                         .q_rope = d->q_rope_b, .q_rope_offset = (size_t)st->row0 * HEADS * DR,
                                         .block_table = d->table_b, .max_blocks_per_seq = MAX_BLOCKS,
                                         .token_seq = d->seq_b, .token_ctx_len = d->ctx_b, .max_ctx_len = st->max_ctx,
                                         .out = d->out_b, .out_offset = (size_t)st->row0 * HEADS * RKV,
                                         .lse = st->with_lse ? d->lse_b : NULL, .lse_offset = (size_t)st->row0 * HEADS};
        const clmla_status status =
            sparse ? clmla_attention_latent_sparse(cache, 0, &a, d->idx_b, (size_t)st->row0 * MAX_KEYS, MAX_KEYS, NULL)
                   : clmla_attention_latent(cache, 0, &a, NULL);
        CHECK(status == CLMLA_SUCCESS, "%s step %d (%d tokens, %d keys): %s: %s", what, i, st->T, st->max_ctx,
              clmla_status_string(status), clmla_last_error(ctx));
        ok &= status == CLMLA_SUCCESS;
    }
    for (int k = 0; k < LSEQS; k++)
        clmla_cache_seq_free(cache, id[k]);
    if (w)
        watch_check(w, 1, what);
    CHECK(ok, "%s: a call failed", what);
    return ok;
}

/* Every row's o-bar (and lse where asked) against float64 sums over the rows appended. */
static void check_latent_pass(const latent_data *d, float scale, const char *what)
{
    const size_t rows = (size_t)d->rows;
    float *out = malloc(rows * HEADS * RKV * sizeof(float)), *lse = malloc(rows * HEADS * sizeof(float));
    double *want = malloc((size_t)MAX_STEP_TOKENS * HEADS * RKV * sizeof(double));
    double *want_lse = malloc((size_t)MAX_STEP_TOKENS * HEADS * sizeof(double));
    float *got_lse = malloc((size_t)MAX_STEP_TOKENS * HEADS * sizeof(float));
    double *p = malloc(MAX_KEYS * sizeof(double));
    cl_command_queue queue = clmla_context_queue(ctx);
    int ok = out && lse && want && want_lse && got_lse && p;
    ok = ok && clEnqueueReadBuffer(queue, d->out_b, CL_TRUE, 0, rows * HEADS * RKV * sizeof(float), out, 0, NULL,
                                   NULL) == CL_SUCCESS;
    ok = ok &&
         clEnqueueReadBuffer(queue, d->lse_b, CL_TRUE, 0, rows * HEADS * sizeof(float), lse, 0, NULL, NULL) == CL_SUCCESS;
    CHECK(ok, "%s: reading the outputs failed", what);
    for (int i = 0; i < STEPS && ok; i++) {
        const latent_step *st = &d->steps[i];
        for (int t = 0; t < st->T; t++) {
            const int row = st->row0 + t, k = d->token_seq[row], keys = d->token_ctx[row];
            for (int h = 0; h < HEADS; h++) {
                const float *ql = d->q_lat + ((size_t)row * HEADS + h) * RKV;
                const float *qr = d->q_rope + ((size_t)row * HEADS + h) * DR;
                double most = -INFINITY, sum = 0.0;
                for (int j = 0; j < keys; j++) {
                    const float *c = d->ckv + ((size_t)k * MAX_KEYS + j) * RKV;
                    const float *r = d->kr + ((size_t)k * MAX_KEYS + j) * DR;
                    double dot = 0.0;
                    for (int x = 0; x < RKV; x++)
                        dot += (double)ql[x] * c[x];
                    for (int x = 0; x < DR; x++)
                        dot += (double)qr[x] * r[x];
                    p[j] = dot * scale;
                    most = p[j] > most ? p[j] : most;
                }
                double *o = want + ((size_t)t * HEADS + h) * RKV;
                memset(o, 0, RKV * sizeof(double));
                for (int j = 0; j < keys; j++) {
                    const double e = exp(p[j] - most);
                    const float *c = d->ckv + ((size_t)k * MAX_KEYS + j) * RKV;
                    sum += e;
                    for (int x = 0; x < RKV; x++)
                        o[x] += e * c[x];
                }
                for (int x = 0; x < RKV; x++)
                    o[x] /= sum;
                want_lse[t * HEADS + h] = most + log(sum);
            }
        }
        const size_t n = (size_t)st->T * HEADS * RKV;
        CHECK_CLOSE(out + (size_t)st->row0 * HEADS * RKV, want, n, RKV, TOL_F32_CACHE,
                    "%s step %d (%d tokens, %d keys): o-bar [token * heads + head, i]", what, i, st->T, st->max_ctx);
        if (st->with_lse) {
            for (int x = 0; x < st->T * HEADS; x++)
                got_lse[x] = lse[(size_t)st->row0 * HEADS + x];
            CHECK_CLOSE(got_lse, want_lse, (size_t)st->T * HEADS, HEADS, TOL_F32_CACHE, "%s step %d: lse [token, head]",
                        what, i);
        }
    }
    free(out);
    free(lse);
    free(want);
    free(want_lse);
    free(got_lse);
    free(p);
}

static void latent_part(int variant, const char *name, int sparse)
{
    latent_data d;
    const int made_ok = latent_make(&d) == 0;
    CHECK(made_ok, "%s: setting up the schedule failed", name);
    const float scale = 0.15f;
    clmla_cache *cache = NULL;
    if (made_ok) {
        clmla_attention_set_variant(ctx, variant);
        const clmla_cache_config cc = {1, RKV, DR, BT, LSEQS * MAX_BLOCKS + 8, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
        CHECK_STATUS(clmla_cache_create(ctx, &cc, &cache), CLMLA_SUCCESS, ctx);
    }
    if (cache) {
        char what[96];
        snprintf(what, sizeof(what), "%s warm-up", name);
        if (run_latent_pass(&d, cache, scale, sparse, NULL, what))
            check_latent_pass(&d, scale, what);
        watch w;
        snprintf(what, sizeof(what), "%s steady", name);
        if (run_latent_pass(&d, cache, scale, sparse, &w, what))
            check_latent_pass(&d, scale, what);
    }
    clmla_cache_destroy(cache);
    clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
    latent_free(&d);
}

static void test_latent_rows(void)
{
    latent_part(CLMLA_LATENT_ROWS, "latent-rows", 0);
}

static void test_latent_group(void)
{
    latent_part(CLMLA_LATENT_GROUP, "latent-group", 0);
}

static void test_sparse_rows(void)
{
    latent_part(CLMLA_LATENT_ROWS, "sparse-rows", 1);
}

static void test_sparse_group(void)
{
    latent_part(CLMLA_LATENT_GROUP, "sparse-group", 1);
}

/* ---- the kept tables themselves ------------------------------------------------------------------ */

/* clmla_staged: tables far apart in the block go in writes of their own, close ones in one; every
   table's sub-buffer reads back what the host wrote, before and after a table grows. */
static void test_staged(void)
{
    enum { PARTS = 4 };
    clmla_staged s;
    memset(&s, 0, sizeof(s));
    cl_command_queue queue = clmla_context_queue(ctx);
    /* table 0 is large and nearly unused: table 1 starts past the gap that merits a write of its own */
    const size_t need[2][PARTS] = {{200000, 40, 0, 4000}, {200000, 9000, 0, 4000}};
    const size_t used[2][PARTS] = {{8, 40, 0, 4000}, {295000, 9000, 0, 12}};
    const long writes[2] = {2, 1}; /* [8 bytes], [tables 1 and 3]; then all in one */
    for (int round = 0; round < 2; round++) {
        CHECK_STATUS(clmla_staged_reserve(ctx, &s, PARTS, need[round]), CLMLA_SUCCESS, ctx);
        if (!s.device)
            break;
        CHECK(s.part[2] == NULL, "staged: a table of 0 bytes has a sub-buffer");
        for (int i = 0; i < PARTS; i++)
            for (size_t b = 0; b < used[round][i]; b++)
                ((unsigned char *)clmla_staged_host(&s, i))[b] = (unsigned char)(b * 7 + (size_t)i * 31 + (size_t)round);
        cl_event written = NULL;
        const long calls = clmla_fault_count(ctx); /* each write is a counted call (clcall.h) */
        CHECK_STATUS(clmla_staged_write(ctx, &s, used[round], &written), CLMLA_SUCCESS, ctx);
        CHECK(clmla_fault_count(ctx) - calls == writes[round], "staged round %d: %ld writes, expected %ld", round,
              clmla_fault_count(ctx) - calls, writes[round]);
        CHECK(written != NULL, "staged round %d: no event for the last write", round);
        clmla_cl_event_done(ctx, &written);
        for (int i = 0; i < PARTS; i++) {
            if (!used[round][i])
                continue;
            unsigned char *back = malloc(used[round][i]);
            CHECK(back && clEnqueueReadBuffer(queue, s.part[i], CL_TRUE, 0, used[round][i], back, 0, NULL, NULL) ==
                              CL_SUCCESS,
                  "staged round %d: reading table %d", round, i);
            size_t wrong = 0;
            for (size_t b = 0; back && b < used[round][i]; b++)
                wrong += back[b] != (unsigned char)(b * 7 + (size_t)i * 31 + (size_t)round);
            CHECK(wrong == 0, "staged round %d: table %d has %zu of %zu bytes wrong on the device", round, i, wrong,
                  used[round][i]);
            free(back);
        }
    }
    clmla_staged_release(&s);
}

static const tu_part parts[] = {
    {"staged", test_staged},
    {"layer-rows", test_layer_rows},
    {"layer-group", test_layer_group},
    {"warmup", test_warmup},
    {"latent-rows", test_latent_rows},
    {"latent-group", test_latent_group},
    {"sparse-rows", test_sparse_rows},
    {"sparse-group", test_sparse_group},
    {"dsa-rows", test_dsa_rows},
    {"dsa-group", test_dsa_group},
};

int main(int argc, char **argv)
{
    return tu_parts_exit(
        tu_run_parts(argc, argv, parts, (int)(sizeof(parts) / sizeof(parts[0])), NULL, &ctx, &check_failed));
}
