/* Phase "products": the layer's projections alone, y = x W^T with x of `batch` rows (the tokens of
 * a decode step), through the library's own product dispatch (host/mla/gemm.c, as the layer calls it).
 * The paths name the projections of the checkpoint: q_proj (or q_a_proj and q_b_proj with a query
 * LoRA), kv_a_proj_with_mqa, kv_b_proj, o_proj, and qkv_a_proj, the product the layer runs: q_proj
 * (or q_a_proj) and kv_a_proj_with_mqa stacked into one matrix, as both multiply the hidden state. A decode step reads each weight matrix once,
 * whatever the number of rows, so the row's GB/s (weights + x + y, with the caches flushed before
 * every call) against the read peak is how close the product comes to streaming speed.
 * Every row is checked against a float64 host computation of 64 sampled outputs. */
#include "bench.h"
#include "gemm.h" /* the library's internal product dispatch (bench links clmla_static) */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct product_state {
    bench_device *dev;
    size_t m, n, k;
    cl_mem x, w, y;
    cl_mem timed;    /* `copies` copies of W as the layer keeps it on this device: packed (host/mla/gemm.h)
                        where panel > 0, else row-major */
    size_t panel, copies, calls;
} product_state;

static int product_enqueue(void *user, cl_event *last)
{
    product_state *st = user;
    const clmla_matrix x = {st->x, 0, st->k, 0, 0}, y = {st->y, 0, st->n, 0, 0};
    /* each call reads the next copy, as a model's layers each read their own weights */
    const size_t offset = st->calls++ % st->copies * st->n * st->k;
    const clmla_matrix w = {st->timed, offset, st->k, 1, st->panel};
    const clmla_status s = clmla_gemm(st->dev->ctx, st->m, st->n, st->k, 1.0f, x, w, 0.0f, y, last);
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
    float *x = malloc(m * k * sizeof(float)), *w = malloc(n * k * sizeof(float)), *y = malloc(m * n * sizeof(float));
    double worst = -1;
    if (x && w && y && clEnqueueReadBuffer(st->dev->queue, st->x, CL_TRUE, 0, m * k * sizeof(float), x, 0, NULL, NULL) == CL_SUCCESS &&
        clEnqueueReadBuffer(st->dev->queue, st->w, CL_TRUE, 0, n * k * sizeof(float), w, 0, NULL, NULL) == CL_SUCCESS &&
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
    free(w);
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
    product_state st;
    memset(&st, 0, sizeof(st));
    st.dev = c->dev;
    st.m = (size_t)c->batch;
    st.n = n;
    st.k = k;
    st.w = bench_buffer(c->dev, n * k * sizeof(float), "product weights");
    st.x = bench_buffer(c->dev, st.m * k * sizeof(float), "product input");
    st.y = bench_buffer(c->dev, st.m * n * sizeof(float), "product output");
    int rc = !st.w || !st.x || !st.y || bench_fill(c->dev, st.w, n * k, 0, c->seed + 1, 1.0f / sqrtf((float)k)) ||
             bench_fill(c->dev, st.x, st.m * k, 0, c->seed + 2, 1.0f);
    /* The timed calls read W as the layer keeps it on this device: packed where the layer packs
       its projections (CPU devices); the check still reads the row-major W. With the caches
       flushed, they also cycle through enough copies of it to fill the flush size (at most 64),
       so that a copy is not read again before that many bytes of other weights: a flush alone
       left part of W in this CPU's last-level cache (docs/BENCHMARKS.md). */
    const size_t w_bytes = n * k * sizeof(float);
    st.panel = clmla_weight_panel(c->dev->ctx, n);
    st.copies = 1;
    if (c->dev->flush_buffer) {
        st.copies = (c->dev->flush_bytes + w_bytes - 1) / w_bytes;
        if (st.copies > 64)
            st.copies = 64;
        while (st.copies > 1 && ((st.copies + 1) * w_bytes > c->dev->memory_budget ||
                                 st.copies * w_bytes > c->dev->info.max_alloc_bytes))
            st.copies--;
    }
    if (!rc) {
        float *w = malloc(w_bytes), *p = malloc(w_bytes);
        rc = !w || !p || clEnqueueReadBuffer(c->dev->queue, st.w, CL_TRUE, 0, w_bytes, w, 0, NULL, NULL) != CL_SUCCESS;
        if (!rc && st.panel)
            clmla_pack_weight(w, n, k, st.panel, p);
        else if (!rc)
            memcpy(p, w, w_bytes);
        if (!rc)
            st.timed = bench_buffer(c->dev, st.copies * w_bytes, "timed product weights");
        for (size_t i = 0; !rc && i < st.copies; i++)
            rc = !st.timed || clEnqueueWriteBuffer(c->dev->queue, st.timed, CL_TRUE, i * w_bytes, w_bytes, p, 0, NULL,
                                                   NULL) != CL_SUCCESS;
        free(w);
        free(p);
    }
    if (!rc) {
        bench_op op = {product_enqueue, NULL, &st, 0};
        rc = bench_time(c->dev, &op, c->timing, &row->t);
    }
    if (!rc) {
        row->tokens = (double)st.m;
        row->flops = 2.0 * (double)st.m * n * k;
        row->bytes = ((double)n * k + (double)st.m * k + (double)st.m * n) * sizeof(float);
        row->check_error = check_product(&st);
        snprintf(row->note, sizeof(row->note), "%zu x %zu x %zu, weights %.1f MiB%s, %zu cop%s", st.m, n, k,
                 (double)n * k * sizeof(float) / 1048576.0, st.panel ? " packed" : "", st.copies,
                 st.copies == 1 ? "y" : "ies");
        if (row->check_error < 0 || row->check_error > 1e-4) {
            fprintf(stderr, "clmla-bench: %s with %zu rows: relative error %.3g against float64\n", c->path, st.m,
                    row->check_error);
            rc = 1;
        }
    }
    bench_release(&st.w);
    bench_release(&st.timed);
    bench_release(&st.x);
    bench_release(&st.y);
    return rc;
}
