/* Two contexts on the same device, one per thread (pthreads), each with its own layer and cache,
 * running a schedule of forward steps at the same time (a barrier starts them together): prefill
 * chunks on both paths, a batch of two sequences, decode steps, a refused step
 * (CLMLA_ERROR_CACHE_FULL, whose message must be its own context's), sequences freed and their ids
 * and blocks reused next round. Every output and the cache contents must be bitwise what the same
 * schedule gives when it runs alone, before the threads and again after them: the library keeps
 * no hidden global state that one context could change under another. The threads create and
 * destroy their contexts concurrently too; they run once with two configurations (different
 * weights, shapes, head groups, cache dtypes: any shared program, kernel or scratch buffer would
 * show) and once with the same one. Rounds per schedule: `test_concurrency [ROUNDS]` (default 10). */
#include "check.h"
#include "clmla.h"
#include "test_util.h"
#include "tolerance.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* What one worker computes; `out` and `cache_rows` are compared bitwise between runs. */
typedef struct schedule {
    int which;                 /* 0 or 1: a different configuration each */
    int rounds;
    pthread_barrier_t *start;  /* threads: wait here with the layer and cache made, then go together */
    clmla_status status;       /* the first unexpected status, or CLMLA_SUCCESS */
    char error[512];           /* its message */
    char full_message[512];    /* clmla_last_error after the refused step */
    float *out;                /* [rounds, TOKENS, D] */
    float *cache_rows;         /* [rounds, TOKENS, rkv + dr] */
    size_t out_n, rows_n;
} schedule;

enum { TOKENS = 40 };

static clmla_layer_config config_of(int which)
{
    return which == 0 ? tu_small_config(48, 3, 16, 32, 16, 8, 16) : tu_small_config(40, 5, 0, 24, 8, 4, 12);
}

static void fail_with(schedule *s, clmla_status st, clmla_context *ctx, const char *what)
{
    if (s->status == CLMLA_SUCCESS) {
        s->status = st == CLMLA_SUCCESS ? CLMLA_ERROR_INTERNAL : st;
        snprintf(s->error, sizeof(s->error), "%s: %s: %s", what, clmla_status_string(st), clmla_last_error(ctx));
    }
}

/* The schedule, on a context of its own (made and destroyed here). */
static void *run_schedule(void *arg)
{
    schedule *s = arg;
    const clmla_layer_config c = config_of(s->which);
    const int D = c.hidden_size, rkv = c.kv_lora_rank, dr = c.qk_rope_head_dim;
    clmla_context *ctx = NULL;
    clmla_status st = clmla_context_create(NULL, &ctx);
    if (st != CLMLA_SUCCESS) {
        fail_with(s, st, NULL, "context_create");
        return NULL;
    }
    tu_weights w;
    if (tu_weights_make(&w, &c, 3000 + (uint64_t)s->which) != 0) {
        fail_with(s, CLMLA_ERROR_OUT_OF_HOST_MEMORY, ctx, "weights");
        clmla_context_destroy(ctx);
        return NULL;
    }
    clmla_layer *layer = NULL;
    clmla_cache *cache = NULL;
    st = clmla_layer_create(ctx, &c, &w.layer, &layer);
    if (st != CLMLA_SUCCESS)
        fail_with(s, st, ctx, "layer_create");
    /* 22 blocks of 4: both sequences fit (2 x 40 tokens = 20 blocks), a third does not. */
    clmla_cache_config cc = {1, rkv, dr, 4, 22, s->which ? CLMLA_CACHE_F16 : CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
    if (st == CLMLA_SUCCESS && (st = clmla_cache_create(ctx, &cc, &cache)) != CLMLA_SUCCESS)
        fail_with(s, st, ctx, "cache_create");
    float *x = tu_random_inputs(2 * TOKENS, D, 4000 + (uint64_t)s->which);
    if (s->start)
        pthread_barrier_wait(s->start);
    for (int r = 0; st == CLMLA_SUCCESS && r < s->rounds; r++) {
        float *out = s->out + (size_t)r * TOKENS * D;
        int32_t a = -1, b = -1;
        clmla_cache_seq_add(cache, &a);
        clmla_cache_seq_add(cache, &b);
        /* a: prefill 9 decompressed, then 7 absorbed; a 17 + b 17 in one batch (auto: both paths
           or one, by the threshold); then 7 decode steps for a alone. b's outputs are not kept. */
        struct {
            clmla_batch_entry e[2];
            int n;
            clmla_attention_path path;
        } steps[10] = {{{{a, 9}}, 1, CLMLA_PATH_DECOMPRESSED}, {{{a, 7}}, 1, CLMLA_PATH_ABSORBED},
                       {{{a, 17}, {b, 17}}, 2, CLMLA_PATH_AUTO}};
        for (int k = 3; k < 10; k++) {
            steps[k].e[0].seq_id = a;
            steps[k].e[0].num_tokens = 1;
            steps[k].n = 1;
            steps[k].path = k % 2 ? CLMLA_PATH_ABSORBED : CLMLA_PATH_AUTO;
        }
        int done = 0;
        float step_out[2 * TOKENS * 48];
        for (int k = 0; k < 10 && st == CLMLA_SUCCESS; k++) {
            float step_x[2 * TOKENS * 48];
            int rows = steps[k].e[0].num_tokens;
            memcpy(step_x, x + (size_t)done * D, (size_t)rows * D * sizeof(float));
            if (steps[k].n == 2) {
                memcpy(step_x + (size_t)rows * D, x + (size_t)(TOKENS + done) * D,
                       (size_t)steps[k].e[1].num_tokens * D * sizeof(float));
            }
            clmla_forward_args fa = {steps[k].e, steps[k].n, 0, steps[k].path};
            st = clmla_layer_forward(layer, cache, &fa, step_x, step_out);
            if (st != CLMLA_SUCCESS) {
                fail_with(s, st, ctx, "forward");
                break;
            }
            memcpy(out + (size_t)done * D, step_out, (size_t)rows * D * sizeof(float));
            done += rows;
        }
        /* A third sequence cannot take 40 tokens: refused, with this context's own message. */
        int32_t extra = -1;
        clmla_cache_seq_add(cache, &extra);
        clmla_batch_entry big = {extra, TOKENS};
        clmla_forward_args fa = {&big, 1, 0, CLMLA_PATH_AUTO};
        clmla_status full = clmla_layer_forward(layer, cache, &fa, x, step_out);
        if (full != CLMLA_ERROR_CACHE_FULL)
            fail_with(s, full, ctx, "the refused step");
        if (r == 0)
            snprintf(s->full_message, sizeof(s->full_message), "%s", clmla_last_error(ctx));
        if (st == CLMLA_SUCCESS) {
            float *rows = s->cache_rows + (size_t)r * TOKENS * (rkv + dr);
            st = clmla_cache_read(cache, 0, a, 0, TOKENS, rows, rows + (size_t)TOKENS * rkv);
            if (st != CLMLA_SUCCESS)
                fail_with(s, st, ctx, "cache_read");
        }
        /* Free everything: the next round reuses the ids and blocks. */
        clmla_cache_seq_free(cache, a);
        clmla_cache_seq_free(cache, b);
        clmla_cache_seq_free(cache, extra);
    }
    free(x);
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    tu_weights_free(&w);
    clmla_context_destroy(ctx);
    return NULL;
}

static void schedule_init(schedule *s, int which, int rounds)
{
    memset(s, 0, sizeof(*s));
    const clmla_layer_config c = config_of(which);
    s->which = which;
    s->rounds = rounds;
    s->out_n = (size_t)rounds * TOKENS * c.hidden_size;
    s->rows_n = (size_t)rounds * TOKENS * (c.kv_lora_rank + c.qk_rope_head_dim);
    s->out = calloc(s->out_n, sizeof(float));
    s->cache_rows = calloc(s->rows_n, sizeof(float));
}

static void schedule_free(schedule *s)
{
    free(s->out);
    free(s->cache_rows);
}

/* Bitwise equal, or the first difference. */
static void check_same(const schedule *got, const schedule *want, const char *what)
{
    CHECK(got->status == CLMLA_SUCCESS, "%s (config %d): %s", what, got->which, got->error);
    if (got->status != CLMLA_SUCCESS || want->status != CLMLA_SUCCESS)
        return;
    size_t first = got->out_n;
    for (size_t i = 0; i < got->out_n && first == got->out_n; i++)
        if (memcmp(&got->out[i], &want->out[i], sizeof(float)) != 0)
            first = i;
    CHECK(first == got->out_n, "%s (config %d): outputs differ from the run alone, first at %zu: %.9g vs %.9g", what,
          got->which, first, first < got->out_n ? got->out[first] : 0.0, first < got->out_n ? want->out[first] : 0.0);
    CHECK(memcmp(got->cache_rows, want->cache_rows, got->rows_n * sizeof(float)) == 0,
          "%s (config %d): cache contents differ from the run alone", what, got->which);
    CHECK(strcmp(got->full_message, want->full_message) == 0 && strstr(got->full_message, "cache full") != NULL,
          "%s (config %d): the refused step's message is '%s', alone it was '%s'", what, got->which,
          got->full_message, want->full_message);
}

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 10;
    double t0 = tu_seconds();
    /* Alone, one after the other. */
    schedule alone[2];
    for (int i = 0; i < 2; i++) {
        schedule_init(&alone[i], i, rounds);
        run_schedule(&alone[i]);
        CHECK(alone[i].status == CLMLA_SUCCESS, "config %d alone: %s", i, alone[i].error);
    }
    /* Both schedules run alone once more give the same (the check of the check). */
    schedule again;
    schedule_init(&again, 0, rounds);
    run_schedule(&again);
    check_same(&again, &alone[0], "config 0 alone, twice");
    schedule_free(&again);
    double t1 = tu_seconds();

    /* Together: two threads, twice: the two configurations, then the same configuration twice. */
    for (int mode = 0; mode < 2; mode++) {
        schedule together[2];
        pthread_t threads[2];
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, 2);
        for (int i = 0; i < 2; i++) {
            schedule_init(&together[i], mode == 0 ? i : 1, rounds);
            together[i].start = &start;
            CHECK(pthread_create(&threads[i], NULL, run_schedule, &together[i]) == 0, "pthread_create");
        }
        for (int i = 0; i < 2; i++)
            pthread_join(threads[i], NULL);
        pthread_barrier_destroy(&start);
        for (int i = 0; i < 2; i++) {
            check_same(&together[i], &alone[together[i].which],
                       mode == 0 ? "two configurations in two threads" : "one configuration in two threads");
            schedule_free(&together[i]);
        }
    }
    double t2 = tu_seconds();
    /* And alone again, after the threads: nothing they left behind changes a new context. */
    for (int i = 0; i < 2; i++) {
        schedule after;
        schedule_init(&after, i, rounds);
        run_schedule(&after);
        check_same(&after, &alone[i], "alone after the threads");
        schedule_free(&after);
    }
    printf("# %d rounds of %d tokens per schedule: alone %.1f s, in threads %.1f s, after %.1f s\n", rounds, TOKENS,
           t1 - t0, t2 - t1, tu_seconds() - t2);
    for (int i = 0; i < 2; i++)
        schedule_free(&alone[i]);
    return check_summary();
}
