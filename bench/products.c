/* Phase "products": the layer's projections alone, y = x W^T with x of `batch` rows (the tokens of
 * a decode step), through the public clmla_linear (clmla_linear_forward_cl): the weight kept on the
 * device as the layer keeps its projections and the library's own product dispatch (host/mla/gemm.c).
 * The paths name the projections of the checkpoint: q_proj (or q_a_proj and q_b_proj with a query
 * LoRA), kv_a_proj_with_mqa, kv_b_proj, o_proj, and qkv_a_proj, the product the layer runs: q_proj
 * (or q_a_proj) and kv_a_proj_with_mqa stacked into one matrix, as both multiply the hidden state. A decode step reads each weight matrix once,
 * whatever the number of rows, so the row's GB/s (weights as stored + x + y, with the caches
 * flushed before every call) against the read peak is how close the product comes to streaming speed.
 * W is given to clmla_linear already in the row's weights dtype (bench/encode.c), as a checkpoint
 * holds it; its bytes are the linear's device bytes (FP8's scales included).
 * Every row is checked against a float64 host computation of 64 sampled outputs, with the weights
 * the encoding denotes. */
#include "bench.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct product_state {
    bench_device *dev;
    size_t m, n, k;
    cl_mem x, y;
    float *w;               /* W [n, k] row-major on the host, as the weights dtype denotes it, for the check */
    clmla_linear **timed;   /* `copies` clmla_linears of W, each its own device copy */
    size_t copies, calls;
    int packed;             /* clmla_linear_info.packed: kept as the layer keeps it on CPU devices */
} product_state;

static int product_enqueue(void *user, cl_event *last)
{
    product_state *st = user;
    /* each call reads the next copy, as a model's layers each read their own weights */
    clmla_linear *w = st->timed[st->calls++ % st->copies];
    const clmla_status s = clmla_linear_forward_cl(w, (int)st->m, st->x, 0, st->y, 0, last);
    if (s != CLMLA_SUCCESS)
        fprintf(stderr, "clmla-bench: product failed: %s\n", clmla_last_error(st->dev->ctx));
    return s != CLMLA_SUCCESS;
}

/* N x K of the named projection for this shape; 0 when the shape has no such matrix. */
static int projection(const bench_shape *s, const char *name, size_t *n, size_t *k)
{
    if (strcmp(name, "q_proj") == 0 && s->rq == 0) {
        *n = (size_t)s->H * s->dq;
        *k = (size_t)s->D;
    } else if (strcmp(name, "q_a_proj") == 0 && s->rq > 0) {
        *n = (size_t)s->rq;
        *k = (size_t)s->D;
    } else if (strcmp(name, "q_b_proj") == 0 && s->rq > 0) {
        *n = (size_t)s->H * s->dq;
        *k = (size_t)s->rq;
    } else if (strcmp(name, "kv_a_proj") == 0) {
        *n = (size_t)s->row;
        *k = (size_t)s->D;
    } else if (strcmp(name, "qkv_a_proj") == 0) { /* the layer's fused product: q_proj or q_a_proj, then kv_a */
        *n = (size_t)(s->rq > 0 ? s->rq : s->H * s->dq) + (size_t)s->row;
        *k = (size_t)s->D;
    } else if (strcmp(name, "kv_b_proj") == 0) {
        *n = (size_t)s->H * (s->dn + s->dv);
        *k = (size_t)s->rkv;
    } else if (strcmp(name, "o_proj") == 0) {
        *n = (size_t)s->D;
        *k = (size_t)s->H * s->dv;
    } else {
        return 0;
    }
    return 1;
}

/* Max relative error of 64 sampled outputs against float64 sums of the same inputs. */
static double check_product(product_state *st)
{
    const size_t m = st->m, n = st->n, k = st->k;
    const float *w = st->w;
    float *x = malloc(m * k * sizeof(float)), *y = malloc(m * n * sizeof(float));
    double worst = -1;
    if (x && w && y && clEnqueueReadBuffer(st->dev->queue, st->x, CL_TRUE, 0, m * k * sizeof(float), x, 0, NULL, NULL) == CL_SUCCESS &&
        clEnqueueReadBuffer(st->dev->queue, st->y, CL_TRUE, 0, m * n * sizeof(float), y, 0, NULL, NULL) == CL_SUCCESS) {
        worst = 0;
        for (size_t s = 0; s < 64; s++) {
            const size_t i = (s * 7) % m, j = (s * 2654435761u) % n;
            double want = 0, mag = 0;
            for (size_t p = 0; p < k; p++) {
                want += (double)x[i * k + p] * w[j * k + p];
                mag += fabs((double)x[i * k + p] * w[j * k + p]);
            }
            const double err = fabs(y[i * n + j] - want) / (mag > 0 ? mag : 1);
            if (err > worst)
                worst = err;
        }
    }
    free(x);
    free(y);
    return worst;
}

int bench_products(const bench_case *c, bench_row *row)
{
    size_t n = 0, k = 0;
    if (!projection(c->shape, c->path, &n, &k)) {
        snprintf(row->note, sizeof(row->note), "this model shape has no %s", c->path);
        return -1;
    }
    product_state st = {.dev = c->dev, .m = (size_t)c->batch, .n = n, .k = k};
    /* W is made on the device (the same values as every other phase's weights), then read back:
       the host copy feeds clmla_linear_create and the check. */
    const size_t w_bytes = n * k * sizeof(float);
    cl_mem w_fill = bench_buffer(c->dev, w_bytes, "product weights");
    st.x = bench_buffer(c->dev, st.m * k * sizeof(float), "product input");
    st.y = bench_buffer(c->dev, st.m * n * sizeof(float), "product output");
    st.w = malloc(w_bytes);
    int rc = !w_fill || !st.x || !st.y || !st.w ||
             bench_fill(c->dev, w_fill, n * k, 0, c->seed + 1, 1.0f / sqrtf((float)k)) ||
             bench_fill(c->dev, st.x, st.m * k, 0, c->seed + 2, 1.0f) ||
             clEnqueueReadBuffer(c->dev->queue, w_fill, CL_TRUE, 0, w_bytes, st.w, 0, NULL, NULL) != CL_SUCCESS;
    bench_release(&w_fill);
    /* The timed calls read W as clmla_linear keeps it on this device, as the layer keeps its
       projections: packed on CPU devices. With the caches flushed, they also cycle through enough
       copies of it (one clmla_linear each) to fill the flush size (at most 64), so that a copy is
       not read again before that many bytes of other weights: a flush alone left part of W in this
       CPU's last-level cache (docs/BENCHMARKS.md). The budget keeps room for one more W, as when
       the copies shared one buffer next to the row-major W. Copies count in W's stored size: a
       smaller dtype takes more of them to fill the flush size. */
    const size_t stored = bench_weight_stored_bytes(c->weights, n, k);
    st.copies = 1;
    if (c->dev->flush_buffer) {
        st.copies = (c->dev->flush_bytes + stored - 1) / stored;
        if (st.copies > 64)
            st.copies = 64;
        while (st.copies > 1 && (st.copies + 1) * stored > c->dev->memory_budget)
            st.copies--;
    }
    if (!rc) {
        st.timed = calloc(st.copies, sizeof(*st.timed));
        rc = !st.timed;
    }
    bench_encoded w;
    memset(&w, 0, sizeof(w));
    if (!rc && bench_encode_weight(st.w, n, k, c->weights, &w) != 0) {
        fprintf(stderr, "clmla-bench: out of host memory for the %s weights\n", clmla_dtype_name(c->weights));
        rc = 1;
    }
    for (size_t i = 0; !rc && i < st.copies; i++) {
        const clmla_status s = clmla_linear_create(c->dev->ctx, &w.tensor, &st.timed[i]);
        if (s != CLMLA_SUCCESS) {
            fprintf(stderr, "clmla-bench: clmla_linear_create (copy %zu of %zu) failed: %s\n", i + 1, st.copies,
                    clmla_last_error(c->dev->ctx));
            rc = 1;
        }
    }
    bench_encoded_free(&w);
    clmla_linear_info info;
    memset(&info, 0, sizeof(info));
    if (!rc) {
        rc = clmla_linear_get_info(st.timed[0], &info) != CLMLA_SUCCESS;
        st.packed = !rc && info.packed;
    }
    if (!rc) {
        bench_op op = {product_enqueue, NULL, &st, 0};
        rc = bench_time(c->dev, &op, c->timing, &row->t);
    }
    if (!rc) {
        row->tokens = (double)st.m;
        row->flops = 2.0 * (double)st.m * n * k;
        /* W as the device stores it, which is what a call reads; the library reports it, so a
           weight kept in another dtype than the one given would show here. */
        row->weight_bytes = (double)info.device_bytes;
        row->bytes = row->weight_bytes + ((double)st.m * k + (double)st.m * n) * sizeof(float);
        row->check_error = check_product(&st);
        snprintf(row->note, sizeof(row->note), "%zu x %zu x %zu, weights %.1f MiB%s%s, %zu cop%s", st.m, n, k,
                 row->weight_bytes / 1048576.0, st.packed ? " packed" : "",
                 info.device_bytes != stored ? " (not the dtype's size)" : "", st.copies,
                 st.copies == 1 ? "y" : "ies");
        if (row->check_error < 0 || row->check_error > 1e-4) {
            fprintf(stderr, "clmla-bench: %s with %zu rows: relative error %.3g against float64\n", c->path, st.m,
                    row->check_error);
            rc = 1;
        }
    }
    for (size_t i = 0; st.timed && i < st.copies; i++)
        clmla_linear_destroy(st.timed[i]);
    free(st.timed);
    free(st.w);
    bench_release(&st.x);
    bench_release(&st.y);
    return rc;
}
