/* See test_util.h. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

tu_rng tu_rng_seed(uint64_t seed)
{
    tu_rng rng = {seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull};
    return rng;
}

uint64_t tu_rng_next(tu_rng *rng)
{
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float tu_rng_uniform(tu_rng *rng)
{
    /* 24 random bits: exact in float. */
    return (float)(tu_rng_next(rng) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

int tu_rng_below(tu_rng *rng, int n)
{
    return (int)(tu_rng_next(rng) % (uint64_t)n);
}

void tu_fill_uniform(float *a, size_t n, float center, float amplitude, tu_rng *rng)
{
    /* Two 24-bit draws per 64-bit step keep the full-size presets (~190M floats) quick. */
    const float unit = 2.0f / 16777216.0f;
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        uint64_t r = tu_rng_next(rng);
        a[i] = center + amplitude * ((float)(r >> 40) * unit - 1.0f);
        a[i + 1] = center + amplitude * ((float)(r & 0xFFFFFF) * unit - 1.0f);
    }
    for (; i < n; i++)
        a[i] = center + amplitude * tu_rng_uniform(rng);
}

uint64_t tu_hash_bytes(uint64_t h, const void *data, size_t n)
{
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

void tu_shuffle_ints(int *a, int n, tu_rng *rng)
{
    for (int i = 0; i < n; i++)
        a[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = tu_rng_below(rng, i + 1);
        int t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

float *tu_random_inputs(int tokens, int hidden, uint64_t seed)
{
    size_t n = (size_t)tokens * (size_t)hidden;
    float *x = malloc((n ? n : 1) * sizeof(float));
    if (!x)
        return NULL;
    tu_rng rng = tu_rng_seed(seed);
    tu_fill_uniform(x, n, 0.0f, 1.7320508f, &rng);
    return x;
}

void tu_ref_config(const clmla_layer_config *c, mla_ref_config *r)
{
    memset(r, 0, sizeof(*r));
    r->hidden = c->hidden_size;
    r->heads = c->num_heads;
    r->q_lora_rank = c->q_lora_rank;
    r->kv_lora_rank = c->kv_lora_rank;
    r->nope_dim = c->qk_nope_head_dim;
    r->rope_dim = c->qk_rope_head_dim;
    r->v_dim = c->v_head_dim;
    r->rms_eps = c->rms_norm_eps == 0.0 ? 1e-6 : c->rms_norm_eps;
    r->rope_theta = c->rope_theta == 0.0 ? 10000.0 : c->rope_theta;
    r->rope_half_split = c->rope_pairing == CLMLA_ROPE_HALF_SPLIT ? 1 : 0;
    r->yarn_original_max_pos = c->yarn_original_max_position == 0 ? 4096.0 : (double)c->yarn_original_max_position;
    r->yarn_beta_fast = c->yarn_beta_fast == 0.0 ? 32.0 : c->yarn_beta_fast;
    r->yarn_beta_slow = c->yarn_beta_slow == 0.0 ? 1.0 : c->yarn_beta_slow;
    if (c->yarn_factor > 1.0) {
        r->yarn_factor = c->yarn_factor;
        r->yarn_mscale = c->yarn_mscale;
        r->yarn_mscale_all_dim = c->yarn_mscale_all_dim;
    } else {
        r->yarn_factor = 1.0;
        r->yarn_mscale = 1.0;
        r->yarn_mscale_all_dim = 0.0;
    }
}

clmla_layer_config tu_small_config(int hidden, int heads, int q_lora_rank, int kv_lora_rank, int nope_dim,
                                   int rope_dim, int v_dim)
{
    clmla_layer_config c = {.hidden_size = hidden, .num_heads = heads, .q_lora_rank = q_lora_rank,
                            .kv_lora_rank = kv_lora_rank, .qk_nope_head_dim = nope_dim, .qk_rope_head_dim = rope_dim,
                            .v_head_dim = v_dim};
    return c;
}

void tu_config_describe(const clmla_layer_config *c, char *buf, size_t size)
{
    char yarn[64] = "off";
    if (c->yarn_factor > 1.0)
        snprintf(yarn, sizeof(yarn), "s=%g m=%g/%g", c->yarn_factor, c->yarn_mscale, c->yarn_mscale_all_dim);
    snprintf(buf, size, "D=%d H=%d rq=%d rkv=%d dn/dr/dv=%d/%d/%d theta=%g %s yarn %s", c->hidden_size,
             c->num_heads, c->q_lora_rank, c->kv_lora_rank, c->qk_nope_head_dim, c->qk_rope_head_dim,
             c->v_head_dim, c->rope_theta == 0.0 ? 10000.0 : c->rope_theta,
             c->rope_pairing == CLMLA_ROPE_HALF_SPLIT ? "half-split" : "interleaved", yarn);
}

static float *alloc_floats(size_t n)
{
    return malloc((n ? n : 1) * sizeof(float));
}

/* Uniform weights with variance 1/fan_in: amplitude sqrt(3 / fan_in). */
static void fill_projection(float *w, size_t rows, size_t fan_in, tu_rng *rng)
{
    tu_fill_uniform(w, rows * fan_in, 0.0f, (float)sqrt(3.0 / (double)fan_in), rng);
}

int tu_weights_make(tu_weights *w, const clmla_layer_config *config, uint64_t seed)
{
    memset(w, 0, sizeof(*w));
    w->config = *config;
    const size_t D = (size_t)config->hidden_size, H = (size_t)config->num_heads;
    const size_t rq = (size_t)config->q_lora_rank, rkv = (size_t)config->kv_lora_rank;
    const size_t dn = (size_t)config->qk_nope_head_dim, dr = (size_t)config->qk_rope_head_dim;
    const size_t dv = (size_t)config->v_head_dim, dq = dn + dr;
    tu_rng rng = tu_rng_seed(seed);

    if (rq > 0) {
        w->q_a_proj = alloc_floats(rq * D);
        w->q_a_layernorm = alloc_floats(rq);
        w->q_b_proj = alloc_floats(H * dq * rq);
        if (!w->q_a_proj || !w->q_a_layernorm || !w->q_b_proj)
            goto oom;
        fill_projection(w->q_a_proj, rq, D, &rng);
        tu_fill_uniform(w->q_a_layernorm, rq, 1.0f, 0.1f, &rng);
        fill_projection(w->q_b_proj, H * dq, rq, &rng);
        w->layer.q_a_proj = clmla_tensor_2d(w->q_a_proj, (int64_t)rq, (int64_t)D);
        w->layer.q_a_layernorm = clmla_tensor_1d(w->q_a_layernorm, (int64_t)rq);
        w->layer.q_b_proj = clmla_tensor_2d(w->q_b_proj, (int64_t)(H * dq), (int64_t)rq);
    } else {
        w->q_proj = alloc_floats(H * dq * D);
        if (!w->q_proj)
            goto oom;
        fill_projection(w->q_proj, H * dq, D, &rng);
        w->layer.q_proj = clmla_tensor_2d(w->q_proj, (int64_t)(H * dq), (int64_t)D);
    }
    w->kv_a_proj_with_mqa = alloc_floats((rkv + dr) * D);
    w->kv_a_layernorm = alloc_floats(rkv);
    w->kv_b_proj = alloc_floats(H * (dn + dv) * rkv);
    w->o_proj = alloc_floats(D * H * dv);
    if (!w->kv_a_proj_with_mqa || !w->kv_a_layernorm || !w->kv_b_proj || !w->o_proj)
        goto oom;
    fill_projection(w->kv_a_proj_with_mqa, rkv + dr, D, &rng);
    tu_fill_uniform(w->kv_a_layernorm, rkv, 1.0f, 0.1f, &rng);
    fill_projection(w->kv_b_proj, H * (dn + dv), rkv, &rng);
    fill_projection(w->o_proj, D, H * dv, &rng);
    w->layer.kv_a_proj_with_mqa = clmla_tensor_2d(w->kv_a_proj_with_mqa, (int64_t)(rkv + dr), (int64_t)D);
    w->layer.kv_a_layernorm = clmla_tensor_1d(w->kv_a_layernorm, (int64_t)rkv);
    w->layer.kv_b_proj = clmla_tensor_2d(w->kv_b_proj, (int64_t)(H * (dn + dv)), (int64_t)rkv);
    w->layer.o_proj = clmla_tensor_2d(w->o_proj, (int64_t)D, (int64_t)(H * dv));

    w->ref.q_a_proj = w->q_a_proj;
    w->ref.q_a_layernorm = w->q_a_layernorm;
    w->ref.q_b_proj = w->q_b_proj;
    w->ref.q_proj = w->q_proj;
    w->ref.kv_a_proj_with_mqa = w->kv_a_proj_with_mqa;
    w->ref.kv_a_layernorm = w->kv_a_layernorm;
    w->ref.kv_b_proj = w->kv_b_proj;
    w->ref.o_proj = w->o_proj;
    tu_ref_config(config, &w->ref_config);
    return 0;
oom:
    tu_weights_free(w);
    return -1;
}

int tu_ref_run_make(tu_ref_run *run, const tu_weights *w, int tokens, const float *x, int path)
{
    memset(run, 0, sizeof(*run));
    const size_t T = (size_t)tokens;
    run->tokens = tokens;
    run->out = malloc(T * (size_t)w->config.hidden_size * sizeof(double));
    run->ckv = malloc(T * (size_t)w->config.kv_lora_rank * sizeof(double));
    run->kr = malloc((T * (size_t)w->config.qk_rope_head_dim + 1) * sizeof(double));
    if (!run->out || !run->ckv || !run->kr ||
        mla_ref_forward(&w->ref_config, &w->ref, tokens, x, path, run->out, run->ckv, run->kr, NULL, NULL, NULL,
                        NULL) != 0) {
        tu_ref_run_free(run);
        return -1;
    }
    return 0;
}

void tu_ref_run_free(tu_ref_run *run)
{
    free(run->out);
    free(run->ckv);
    free(run->kr);
    memset(run, 0, sizeof(*run));
}

double *tu_to_double(const float *a, size_t n)
{
    double *d = malloc((n ? n : 1) * sizeof(double));
    if (d)
        for (size_t i = 0; i < n; i++)
            d[i] = a[i];
    return d;
}

float tu_half_to_float(uint16_t h)
{
    const int sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    double v;
    if (exponent == 0)
        v = ldexp((double)mantissa, -24);
    else if (exponent == 31)
        v = mantissa ? NAN : INFINITY;
    else
        v = ldexp((double)(mantissa | 0x400), exponent - 25);
    return (float)(sign ? -v : v);
}

int tu_count_outside(const float *a, size_t n, size_t offset, size_t len, float sentinel)
{
    int outside = 0;
    for (size_t i = 0; i < offset && i < n; i++)
        outside += a[i] != sentinel;
    for (size_t i = offset + len; i < n; i++)
        outside += a[i] != sentinel;
    return outside;
}

double tu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tu_kernel_name(cl_kernel k, char *name, size_t size)
{
    name[0] = '\0';
    if (k && clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, size, name, NULL) != CL_SUCCESS)
        name[0] = '\0';
}

int tu_sweeps_short(void)
{
    const char *v = getenv("CLMLA_TEST_SWEEPS");
    if (!v || !v[0] || strcmp(v, "full") == 0)
        return 0;
    if (strcmp(v, "short") == 0)
        return 1;
    printf("CLMLA_TEST_SWEEPS '%s': expected full or short\n", v);
    exit(2);
}

int tu_context_or_skip(clmla_context **ctx)
{
    clmla_status st = clmla_context_create(NULL, ctx);
    if (st == CLMLA_SUCCESS)
        return 0;
    printf("skipped: no OpenCL device (%s: %s)\n", clmla_status_string(st), clmla_last_error(NULL));
    return 1;
}

int tu_max_blocks(const int *lens, int nseq, int block_tokens)
{
    int most = 1;
    for (int s = 0; s < nseq; s++) {
        const int blocks = (lens[s] + block_tokens - 1) / block_tokens;
        most = blocks > most ? blocks : most;
    }
    return most + 1;
}

/* Whether the part NAME runs for the arguments argv[1 .. argc-1] (each of them a part or "all"). */
static int part_selected(int argc, char **argv, const char *name, const char *on_request)
{
    int selected = argc == 1 && !(on_request && strcmp(name, on_request) == 0);
    for (int a = 1; a < argc; a++)
        selected |= strcmp(argv[a], name) == 0 || (on_request && strcmp(argv[a], "all") == 0);
    return selected;
}

tu_parts_result tu_run_parts(int argc, char **argv, const tu_part *parts, int n, const tu_parts_options *options,
                             clmla_context **ctx, const int *check_failed)
{
    const char *on_request = options ? options->on_request : NULL;
    int name_width = options ? options->name_width : 0;
    if (name_width == 0)
        for (int p = 0; p < n; p++)
            if ((int)strlen(parts[p].name) + 1 > name_width)
                name_width = (int)strlen(parts[p].name) + 1;

    for (int a = 1; a < argc; a++) {
        int known = on_request && strcmp(argv[a], "all") == 0;
        for (int p = 0; p < n; p++)
            known |= strcmp(argv[a], parts[p].name) == 0;
        if (!known) {
            printf("unknown part '%s'; the parts are:%s", argv[a], on_request ? " all" : "");
            for (int p = 0; p < n; p++)
                printf(" %s", parts[p].name);
            printf("\n");
            return TU_PARTS_UNKNOWN;
        }
    }
    if (tu_context_or_skip(ctx) != 0)
        return TU_PARTS_NO_DEVICE;
    for (int p = 0; p < n; p++) {
        if (!part_selected(argc, argv, parts[p].name, on_request))
            continue;
        double t0 = tu_seconds();
        int failed = *check_failed;
        parts[p].run();
        printf("# part %-*s %6.1f s, %d failed\n", name_width, parts[p].name, tu_seconds() - t0,
               *check_failed - failed);
    }
    clmla_context_destroy(*ctx);
    *ctx = NULL;
    return TU_PARTS_RAN;
}

clmla_status tu_cache_fill_round_robin(clmla_cache *cache, const int32_t *ids, const int *lens, int nseq, int rkv,
                                       int dr, int block_tokens, cl_mem ckv, cl_mem kr, tu_rng *rng)
{
    int have[64] = {0}, start[64] = {0};
    if (nseq > 64)
        return CLMLA_ERROR_INVALID_ARGUMENT;
    for (int s = 1; s < nseq; s++)
        start[s] = start[s - 1] + lens[s - 1];
    for (int done = 0; !done;) {
        done = 1;
        for (int s = 0; s < nseq; s++) {
            if (have[s] >= lens[s])
                continue;
            done = 0;
            int n = 1 + tu_rng_below(rng, 2 * block_tokens);
            if (n > lens[s] - have[s])
                n = lens[s] - have[s];
            const size_t row = (size_t)(start[s] + have[s]);
            const clmla_status st =
                clmla_cache_append_cl(cache, 0, ids[s], n, ckv, row * rkv, rkv, kr, row * dr, dr, NULL);
            if (st != CLMLA_SUCCESS)
                return st;
            have[s] += n;
        }
    }
    return CLMLA_SUCCESS;
}

static int trace_one_shape(const char *path, int *kernels)
{
    enum { MAX_KERNELS = 128 };
    static struct {
        char name[96], local[64];
        int reported;
    } seen[MAX_KERNELS];
    int n = 0, bad = 0;
    *kernels = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("# trace %s: cannot be read\n", path);
        return -1;
    }
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        char kind[16], name[96], size[64];
        if (line[0] == '#' || sscanf(line, "%*d\t%15[^\t]\t%95[^\t]\t%63[^\t]", kind, name, size) != 3 ||
            strcmp(kind, "kernel") != 0)
            continue;
        ++*kernels;
        const char *slash = strchr(size, '/');
        const char *local = slash ? slash + 1 : "";
        int i = 0;
        while (i < n && strcmp(seen[i].name, name) != 0)
            i++;
        if (i == n) {
            if (n == MAX_KERNELS)
                continue;
            snprintf(seen[n].name, sizeof(seen[n].name), "%s", name);
            snprintf(seen[n].local, sizeof(seen[n].local), "%s", local);
            seen[n].reported = 0;
            n++;
        }
        const int driver = strcmp(local, "-") == 0 || !local[0];
        if ((driver || strcmp(seen[i].local, local) != 0) && !seen[i].reported) {
            if (driver)
                printf("# %s: its work-group size left to the driver (%s)\n", name, size);
            else
                printf("# %s: work-group sizes %s and %s\n", name, seen[i].local, local);
            seen[i].reported = 1;
            bad++;
        }
    }
    fclose(f);
    return *kernels ? bad : -1;
}

clmla_context *tu_traced_context(const char *name, char *path, size_t size)
{
    snprintf(path, size, "%s_%d.tsv", name, (int)getpid());
    remove(path);
    clmla_context_options o;
    memset(&o, 0, sizeof(o));
    o.trace = path;
    clmla_context *traced = NULL;
    const clmla_status st = clmla_context_create_opts(&o, &traced);
    if (st != CLMLA_SUCCESS)
        printf("# a context that traces into %s: %s\n", path, clmla_status_string(st));
    return traced;
}

int tu_traced_context_shapes(clmla_context *traced, const char *path)
{
    clmla_context_destroy(traced);
    int kernels = 0;
    const int bad = trace_one_shape(path, &kernels);
    if (bad == 0)
        printf("# the trace: %d kernel lines, each kernel in one work-group shape\n", kernels);
    remove(path);
    return bad;
}
