#!/usr/bin/env python3
"""A selecting prefill step of a sparse-attention (DSA) layer on both attention paths, and AUTO.

clmla-bench's layer and prefill phases build layers without an indexer; this times one with one,
through the Python package: DeepSeek-V3.2's head dims (rq 1536, rkv 512, dn/dr/dv 128/64/128) with
--heads heads (hidden 2048), its indexer (64 heads of 128), top-k --topk, random weights, one
sequence whose T tokens are one prefill step (every query past the top-k selects). Per T: the
median of --reps wall-clock times of the step (layer call to output on the host) on each path,
and how far the two paths' outputs are apart. It decided AUTO's rule for selecting steps on CPUs
(docs/DESIGN.md, "The lightning indexer"; figures in docs/perf-log.md).

    PYTHONPATH=python/src CLMLA_LIBRARY=build/libclmla.so python3 bench/dsa_prefill.py --tokens 1024,2048,4096
"""
import argparse
import statistics
import time

import numpy as np

import clmla


def uniform(rng, rows, cols):
    return (rng.uniform(-1, 1, (rows, cols)) / np.sqrt(cols)).astype(np.float32)


def layer_weights(cfg, rng):
    D, H, rq, rkv = cfg.hidden_size, cfg.num_heads, cfg.q_lora_rank, cfg.kv_lora_rank
    dn, dr, dv, HI, dI = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.index_n_heads, cfg.index_head_dim
    return {
        "q_a_proj": uniform(rng, rq, D),
        "q_a_layernorm": (1 + 0.1 * rng.uniform(-1, 1, rq)).astype(np.float32),
        "q_b_proj": uniform(rng, H * (dn + dr), rq),
        "kv_a_proj_with_mqa": uniform(rng, rkv + dr, D),
        "kv_a_layernorm": (1 + 0.1 * rng.uniform(-1, 1, rkv)).astype(np.float32),
        "kv_b_proj": uniform(rng, H * (dn + dv), rkv),
        "o_proj": uniform(rng, D, H * dv),
        "indexer.wq_b.weight": uniform(rng, HI * dI, rq),
        "indexer.wk.weight": uniform(rng, dI, D),
        "indexer.k_norm.weight": np.ones(dI, np.float32),
        "indexer.k_norm.bias": np.zeros(dI, np.float32),
        "indexer.weights_proj.weight": uniform(rng, HI, D),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1024,2048,4096", help="prefill lengths T")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--topk", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default=None)
    a = ap.parse_args()
    cfg = clmla.LayerConfig(hidden_size=2048, num_heads=a.heads, q_lora_rank=1536, kv_lora_rank=512,
                            qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, index_n_heads=64,
                            index_head_dim=128, index_topk=a.topk, index_rope_pairing="half_split")
    rng = np.random.default_rng(0)
    ctx = clmla.Context(a.device)
    layer = clmla.Layer(cfg, layer_weights(cfg, rng), context=ctx)
    print("device %s; %d heads, indexer 64 x 128, top-k %d; AUTO's dense threshold %d tokens" % (
        ctx.device.name, a.heads, a.topk, layer.auto_threshold), flush=True)
    for T in (int(t) for t in a.tokens.split(",")):
        x = rng.standard_normal((T, cfg.hidden_size)).astype(np.float32)
        times, outs = {}, {}
        for path in ("absorbed", "decompressed", "auto"):
            runs = []
            for _ in range(a.reps):
                with clmla.Cache(ctx, blocks=T // 64 + 2, config=layer) as cache:
                    seq = cache.add()
                    t0 = time.perf_counter()
                    outs[path] = layer(x, batch=[(seq, T)], cache=cache, path=path)
                    runs.append(time.perf_counter() - t0)
            times[path] = statistics.median(runs)
        apart = np.abs(outs["absorbed"] - outs["decompressed"]).max() / np.abs(outs["absorbed"]).max()
        print("T %5d: absorbed %.3f s, decompressed %.3f s, auto %.3f s; paths %.1e apart" % (
            T, times["absorbed"], times["decompressed"], times["auto"], apart), flush=True)


if __name__ == "__main__":
    main()
