/* The generic search over a declared parameter space (tuner.h). */
#include "tuner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double clmla_tuner_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double clmla_tuner_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[n / 2];
}

float clmla_tuner_rand(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((double)(*s >> 8) / 16777216.0 * 2.0 - 1.0);
}

float *clmla_tuner_random_floats(size_t n, float scale, float bias, uint64_t *state)
{
    float *p = malloc(n * sizeof(float));
    if (!p)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = bias + scale * (2.0f * (float)(*state >> 40) / (float)(1 << 24) - 1.0f);
    }
    return p;
}

/* ---- the candidates ---------------------------------------------------------------------------- */

static int *field(void *tuning, size_t offset)
{
    return (int *)((char *)tuning + offset);
}

static int get_field(const void *tuning, size_t offset)
{
    int v;
    memcpy(&v, (const char *)tuning + offset, sizeof(v));
    return v;
}

static int resolve(int value, size_t offset, const void *base, const void *defaults)
{
    if (value == TUNE_BASE)
        return get_field(base, offset);
    if (value == TUNE_TOGGLE)
        return !get_field(base, offset);
    if (value == TUNE_DEFAULT)
        return get_field(defaults, offset);
    return value;
}

/* Appends t to cands unless one holds the same values, or the space or block refuses it. */
static void add(const tune_space *s, const tune_block *b, const tune_env *env, const void *t, char *cands, int *n,
                int most)
{
    if (*n >= most || (s->valid && !s->valid(t)) || (b && b->allowed && !b->allowed(t, env)))
        return;
    for (int i = 0; i < *n; i++)
        if (memcmp(cands + (size_t)i * s->size, t, s->size) == 0)
            return;
    memcpy(cands + (size_t)(*n)++ * s->size, t, s->size);
}

int clmla_tuner_enumerate(const tune_space *s, const tune_env *env, const void *base, const void *defaults, void *out, int most)
{
    char *cands = out;
    char t[512];
    int n = 0;
    if (s->size > sizeof(t) || most < 1)
        return 0;
    memcpy(cands, base, s->size); /* the base always comes first, whatever the constraints say */
    n = 1;
    if (s->add_defaults) {
        memcpy(t, base, s->size);
        const tune_axis *df = s->default_fields ? s->default_fields : s->fields;
        const int ndf = s->default_fields ? s->ndefault_fields : s->nfields;
        for (int f = 0; f < ndf; f++)
            *field(t, df[f].offset) = get_field(defaults, df[f].offset);
        add(s, NULL, env, t, cands, &n, most);
    }
    for (int bi = 0; bi < s->nblocks; bi++) {
        const tune_block *b = &s->blocks[bi];
        const int in_mode = env->quick ? (b->modes & TUNE_QUICK) || b->modes == TUNE_QUICK_FILL : (b->modes & TUNE_FULL);
        if (!in_mode || (b->applies && !b->applies(env)))
            continue;
        const int fill = env->quick && b->modes == TUNE_QUICK_FILL;
        int combos = 1;
        if (b->zip)
            combos = b->naxes ? b->axes[0].count : 0;
        else
            for (int a = 0; a < b->naxes; a++)
                combos *= b->axes[a].count;
        for (int c = 0; c < combos && !(fill && n >= 2); c++) {
            memcpy(t, base, s->size);
            int rest = c;
            for (int a = b->naxes - 1; a >= 0; a--) { /* the first axis varies slowest */
                const tune_axis *ax = &b->axes[a];
                const int i = b->zip ? c : rest % ax->count;
                if (!b->zip)
                    rest /= ax->count;
                *field(t, ax->offset) = resolve(ax->values[i], ax->offset, base, defaults);
            }
            add(s, b, env, t, cands, &n, most);
        }
    }
    return n;
}

void clmla_tuner_label(const tune_space *s, const void *candidate, char *buf, size_t size)
{
    if (size == 0)
        return;
    buf[0] = '\0';
    if (s->label && s->label(candidate, buf, size))
        return;
    size_t len = 0;
    for (int f = 0; f < s->nfields && len < size; f++) {
        const int w = snprintf(buf + len, size - len, "%s%s=%d", f ? " " : "", s->fields[f].name,
                               get_field(candidate, s->fields[f].offset));
        if (w < 0)
            break;
        len += (size_t)w;
    }
}

/* ---- reports ------------------------------------------------------------------------------------ */

void clmla_tuner_report_stage(const tune_settings *s, const char *stage, const char *detail, int total)
{
    if (!s->progress)
        return;
    clmla_tune_event e = {.kind = CLMLA_TUNE_STAGE, .stage = stage, .detail = detail, .total = total, .error = -1};
    s->progress(s->user, &e);
}

void clmla_tuner_report_best(const tune_settings *s, const tune_space *space, const void *best, double ratio)
{
    if (!s->progress)
        return;
    char label[512];
    clmla_tuner_label(space, best, label, sizeof(label));
    clmla_tune_event e = {.kind = CLMLA_TUNE_BEST, .stage = space->kernel, .tuning = best, .label = label,
                          .ratio = ratio, .error = -1};
    s->progress(s->user, &e);
}

static void report_candidate(const tune_settings *s, const tune_family *f, const char *stage, int index, int total,
                             const void *cand, int timed, const char *note, double error, const double *times,
                             double ratio)
{
    if (!s->progress)
        return;
    char label[512];
    clmla_tuner_label(f->space, cand, label, sizeof(label));
    clmla_tune_event e = {.kind = CLMLA_TUNE_CANDIDATE, .stage = stage, .index = index, .total = total, .tuning = cand,
                          .label = label, .timed = timed, .note = note, .error = error,
                          .times = timed ? times : NULL, .time_names = f->time_names,
                          .num_times = timed ? f->num_times : 0, .ratio = ratio};
    s->progress(s->user, &e);
}

/* ---- the search --------------------------------------------------------------------------------- */

/* The largest difference of out from ref relative to ref's largest magnitude (infinity where out
   holds a value that is not finite). */
static double difference(const float *out, const float *ref, size_t n)
{
    double diff = 0, mag = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)out[i] - (double)ref[i]);
        if (!isfinite(d))
            return INFINITY;
        diff = d > diff ? d : diff;
        mag = fabs((double)ref[i]) > mag ? fabs((double)ref[i]) : mag;
    }
    return diff / (mag > 0 ? mag : 1e-30);
}

static double mean_ratio(const double *t, const double *t0, int n)
{
    double r = 0;
    for (int i = 0; i < n; i++)
        r += t[i] / t0[i] / n;
    return r;
}

clmla_status clmla_tuner_search(clmla_context *ctx, const tune_family *f, const tune_settings *s, const void *reference,
                         const void *cands_in, int n, tune_outcome *o)
{
    const char *cands = cands_in;
    const size_t size = f->space->size;
    memset(o, 0, sizeof(*o));
    o->best = -1;
    o->candidates = n;
    if (f->num_times < 1 || f->num_times > TUNE_MAX_TIMES || n < 1)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: nothing to search", f->space->kernel);
    float *ref = malloc((f->out_count ? f->out_count : 1) * sizeof(float));
    float *out = malloc((f->out_count ? f->out_count : 1) * sizeof(float));
    if (!ref || !out) {
        free(ref);
        free(out);
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "%s: out of host memory for the outputs", f->space->kernel);
    }
    clmla_status st = f->measure(f->state, reference, ref, NULL);
    if (st != CLMLA_SUCCESS) {
        char why[512];
        snprintf(why, sizeof(why), "%s", clmla_last_error(ctx));
        st = clmla_fail(ctx, st, "%s: the default parameters fail: %s", f->space->kernel, why);
        goto done;
    }
    clmla_tuner_report_stage(s, f->space->kernel, f->detail, n);
    const double start = clmla_tuner_now();
    double best_ratio = 0;
    for (int i = 0; i < n; i++) {
        const void *cand = cands + (size_t)i * size;
        double times[TUNE_MAX_TIMES] = {0};
        if (i > 0 && s->max_seconds > 0 && clmla_tuner_now() - start > s->max_seconds) {
            report_candidate(s, f, f->space->kernel, i + 1, n, cand, 0, "skipped: the time allowed is spent", -1, NULL, 0);
            continue;
        }
        st = f->measure(f->state, cand, out, times);
        char note[512];
        double err = -1;
        int ok = st == CLMLA_SUCCESS;
        if (!ok)
            snprintf(note, sizeof(note), "failed: %s", clmla_last_error(ctx));
        else {
            err = difference(out, ref, f->out_count);
            for (int k = 0; k < f->num_times; k++)
                ok = ok && times[k] > 0;
            if (!(err <= f->tolerance))
                snprintf(note, sizeof(note), "wrong result: %.2e from the default parameters' output", err);
            else if (!ok)
                snprintf(note, sizeof(note), "no time measured");
            ok = ok && err <= f->tolerance;
        }
        if (!ok) {
            report_candidate(s, f, f->space->kernel, i + 1, n, cand, 0, note, err, NULL, 0);
            if (i == 0) {
                st = clmla_fail(ctx, st != CLMLA_SUCCESS ? st : CLMLA_ERROR_UNSUPPORTED,
                                "%s: the parameters in force fail (%s)", f->space->kernel, note);
                goto done;
            }
            continue;
        }
        if (i == 0)
            memcpy(o->base_times, times, sizeof(times));
        const double ratio = mean_ratio(times, o->base_times, f->num_times);
        o->timed++;
        report_candidate(s, f, f->space->kernel, i + 1, n, cand, 1, NULL, err, times, ratio);
        if (o->best < 0 || ratio < best_ratio) {
            o->best = i;
            best_ratio = ratio;
            memcpy(o->best_times, times, sizeof(times));
        }
    }
    st = CLMLA_SUCCESS;
    o->ratio = best_ratio;
    /* A best other than the first may owe its place to the moment it ran: timed again beside the
       first, alternated, it is kept only when the median of its ratios is at most 1. */
    if (o->best > 0 && f->confirm_rounds > 0) {
        double ratios[16], t_base[16][TUNE_MAX_TIMES], t_best[16][TUNE_MAX_TIMES];
        const int rounds = f->confirm_rounds < 16 ? f->confirm_rounds : 16;
        const void *pair[2] = {cands, cands + (size_t)o->best * size};
        clmla_tuner_report_stage(s, "confirmation", f->detail, 2 * rounds);
        for (int r = 0; r < rounds; r++) {
            ratios[r] = 2; /* a failure counts as a loss */
            int ran = 1;
            for (int w = 0; w < 2; w++) {
                double *t = w ? t_best[r] : t_base[r];
                memset(t, 0, sizeof(t_base[r]));
                const clmla_status ms = f->measure(f->state, pair[w], out, t);
                const double err = ms == CLMLA_SUCCESS ? difference(out, ref, f->out_count) : -1;
                const int good = ms == CLMLA_SUCCESS && err <= f->tolerance && t[0] > 0;
                ran = ran && good;
                report_candidate(s, f, "confirmation", 2 * r + w + 1, 2 * rounds, pair[w], good,
                                 good ? NULL : "failed", err, t, good && ran ? mean_ratio(t, t_base[r], f->num_times) : 0);
            }
            if (ran)
                ratios[r] = mean_ratio(t_best[r], t_base[r], f->num_times);
        }
        double sorted[16];
        memcpy(sorted, ratios, sizeof(double) * (size_t)rounds);
        const double confirmed = clmla_tuner_median(sorted, rounds);
        int mid = 0; /* the round whose ratio is the median, for the times kept */
        for (int r = 0; r < rounds; r++)
            if (ratios[r] == confirmed)
                mid = r;
        if (confirmed <= 1.0) {
            o->ratio = confirmed;
            memcpy(o->best_times, t_best[mid], sizeof(o->best_times));
            memcpy(o->base_times, t_base[mid], sizeof(o->base_times));
        } else {
            o->best = 0;
            o->ratio = 1;
            memcpy(o->best_times, o->base_times, sizeof(o->best_times));
        }
    }
    clmla_tuner_report_best(s, f->space, cands + (size_t)o->best * size, o->ratio);
done:
    free(ref);
    free(out);
    return st;
}

clmla_status clmla_tuner_settings_resolve(clmla_context *ctx, const char *call, const void *result,
                                          const clmla_kernel_tune_options *options, clmla_kernel_tune_options *o,
                                          tune_settings *s)
{
    memset(s, 0, sizeof(*s));
    memset(o, 0, sizeof(*o));
    if (!ctx || !result)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", call, ctx ? "result" : "ctx");
    if (options)
        *o = *options;
    if (o->quick != 0 && o->quick != 1)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: options->quick must be 0 or 1, not %d", call, o->quick);
    if (o->repetitions < 0 || o->repetitions > 32)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: options->repetitions must be 0 (the default) or 1..32, not %d",
                          call, o->repetitions);
    if (o->max_candidates < 0)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: options->max_candidates must be 0 (no limit) or more, not %d",
                          call, o->max_candidates);
    if (!(o->max_seconds >= 0) || !isfinite(o->max_seconds))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: options->max_seconds must be 0 (no limit) or a positive number of seconds", call);
    s->quick = o->quick;
    s->reps = o->repetitions ? o->repetitions : o->quick ? 3 : 7;
    s->max_candidates = o->max_candidates;
    s->max_seconds = o->max_seconds;
    s->progress = o->progress;
    s->user = o->user;
    return CLMLA_SUCCESS;
}

clmla_status clmla_tuner_latent_start(clmla_context *ctx, const char *call, const void *result,
                                      const clmla_kernel_tune_options *options, int prefill,
                                      clmla_kernel_tune_options *o, tune_settings *s, int *heads, int *ctx_len)
{
    const clmla_status st = clmla_tuner_settings_resolve(ctx, call, result, options, o, s);
    if (st != CLMLA_SUCCESS)
        return st;
    *heads = o->heads ? o->heads : 16;
    *ctx_len = o->ctx_len ? o->ctx_len : 4096;
    if (prefill && *heads != 16 && *heads != 128)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: options->heads must be 16 (a V2-Lite layer) or 128 (V3), not %d", call, *heads);
    if (!prefill && (*heads < 1 || *heads > 1024))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: options->heads must be 1..1024, not %d", call,
                          o->heads);
    if (*ctx_len < 64 || *ctx_len > 65536)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: options->ctx_len must be 64..65536, not %d", call,
                          o->ctx_len);
    return CLMLA_SUCCESS;
}

/* ---- random layers ---------------------------------------------------------------------------- */

void clmla_tuner_random_layer_free(clmla_tuner_random_layer *r)
{
    for (int i = 0; i < 8; i++)
        free(r->data[i]);
    memset(r, 0, sizeof(*r));
}

clmla_status clmla_tuner_random_layer_make(clmla_context *ctx, clmla_tuner_random_layer *r, clmla_preset preset,
                                    clmla_weights_dtype want, uint64_t *state)
{
    memset(r, 0, sizeof(*r));
    clmla_layer_config *cfg = &r->cfg;
    clmla_status st = clmla_layer_config_preset(preset, cfg);
    if (st != CLMLA_SUCCESS)
        return st;
    cfg->weights_dtype = want;
    const int D = cfg->hidden_size, H = cfg->num_heads, rq = cfg->q_lora_rank, rkv = cfg->kv_lora_rank,
              dn = cfg->qk_nope_head_dim, dr = cfg->qk_rope_head_dim, dv = cfg->v_head_dim, dq = dn + dr;
    float **d = r->data;
    if (rq > 0) {
        d[0] = clmla_tuner_random_floats((size_t)rq * D, 1.0f / sqrtf((float)D), 0, state);
        d[1] = clmla_tuner_random_floats((size_t)rq, 0.1f, 1.0f, state);
        d[2] = clmla_tuner_random_floats((size_t)H * dq * rq, 1.0f / sqrtf((float)rq), 0, state);
    } else
        d[3] = clmla_tuner_random_floats((size_t)H * dq * D, 1.0f / sqrtf((float)D), 0, state);
    d[4] = clmla_tuner_random_floats((size_t)(rkv + dr) * D, 1.0f / sqrtf((float)D), 0, state);
    d[5] = clmla_tuner_random_floats((size_t)rkv, 0.1f, 1.0f, state);
    d[6] = clmla_tuner_random_floats((size_t)H * (dn + dv) * rkv, 1.0f / sqrtf((float)rkv), 0, state);
    d[7] = clmla_tuner_random_floats((size_t)D * H * dv, 1.0f / sqrtf((float)(H * dv)), 0, state);
    if ((rq > 0 ? !d[0] || !d[1] || !d[2] : !d[3]) || !d[4] || !d[5] || !d[6] || !d[7]) {
        clmla_tuner_random_layer_free(r);
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory for a random layer's weights");
    }
    clmla_layer_weights *w = &r->w;
    if (rq > 0) {
        w->q_a_proj = clmla_tensor_2d(d[0], rq, D);
        w->q_a_layernorm = clmla_tensor_1d(d[1], rq);
        w->q_b_proj = clmla_tensor_2d(d[2], (int64_t)H * dq, rq);
    } else
        w->q_proj = clmla_tensor_2d(d[3], (int64_t)H * dq, D);
    w->kv_a_proj_with_mqa = clmla_tensor_2d(d[4], rkv + dr, D);
    w->kv_a_layernorm = clmla_tensor_1d(d[5], rkv);
    w->kv_b_proj = clmla_tensor_2d(d[6], (int64_t)H * (dn + dv), rkv);
    w->o_proj = clmla_tensor_2d(d[7], D, (int64_t)H * dv);
    return CLMLA_SUCCESS;
}
