"""One MLA layer over 2 tensor-parallel ranks with torch.distributed (gloo, two processes on this
machine), each on its own OpenCL device or all on the same one (PoCL's CPU device works).

Each rank loads shard r of n of the layer (Layer.from_pretrained(..., tp_rank=r, tp_size=n): its
heads' rows of q_b_proj / kv_b_proj and columns of o_proj; the latent cache is shared by all heads,
so every rank keeps the whole latent cache of its sequences). Every step's output is a partial sum,
which the ranks all-reduce; the result is checked against the unsharded layer.

    python python/examples/tp_torch_distributed.py [--model DIR --layer N] [--devices 0,1] [--ranks 2]

Without --model a random-weight DeepSeek-V3-shaped folder (small) is written to a temporary folder.
"""
import argparse
import json
import os
import struct
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import clmla


def write_random_model(folder, heads=8):
    """A small DeepSeek-V3-style folder: config.json and model.safetensors (numpy only)."""
    D, rq, rkv, dn, dr, dv = 128, 48, 64, 32, 16, 32
    cfg = {"model_type": "deepseek_v3", "hidden_size": D, "num_attention_heads": heads,
           "num_key_value_heads": heads, "q_lora_rank": rq, "kv_lora_rank": rkv, "qk_nope_head_dim": dn,
           "qk_rope_head_dim": dr, "v_head_dim": dv, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "max_position_embeddings": 163840, "intermediate_size": 64,
           "attention_bias": True,
           "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
    rng = np.random.default_rng(0)
    shapes = {"q_a_proj.weight": (rq, D), "q_a_layernorm.weight": (rq,), "q_b_proj.weight": (heads * (dn + dr), rq),
              "kv_a_proj_with_mqa.weight": (rkv + dr, D), "kv_a_layernorm.weight": (rkv,),
              "kv_b_proj.weight": (heads * (dn + dv), rkv), "o_proj.weight": (D, heads * dv),
              "q_a_proj.bias": (rq,), "kv_a_proj_with_mqa.bias": (rkv + dr,), "o_proj.bias": (D,)}
    header, blobs, off = {}, [], 0
    for name, shape in shapes.items():
        if "layernorm" in name:
            a = 1 + 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[-1])
        b = a.astype("<f4").tobytes()
        header["model.layers.0.self_attn." + name] = {"dtype": "F32", "shape": list(shape),
                                                      "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)


def run(layer, x, prefill, reduce=None):
    """Prefill, then decode one token a step; each step's output all-reduced when reduce is given."""
    cache = clmla.Cache(layer.context, blocks=-(-len(x) // 16), block_tokens=16, config=layer)
    seq = cache.add()
    outs, t = [], 0
    while t < len(x):
        n = prefill if t == 0 else 1
        y = torch.from_numpy(layer(x[t:t + n], batch=[(seq, n)], cache=cache))
        if reduce:
            reduce(y)
        outs.append(y)
        t += n
    cache.close()
    return torch.cat(outs)


def worker(rank, world, args, init_file):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    device = args.devices[rank % len(args.devices)] if args.devices else None
    ctx = clmla.Context(device)
    shard = clmla.Layer.from_pretrained(args.model, layer=args.layer, tp_rank=rank, tp_size=world, context=ctx)
    D = shard.config.hidden_size
    x = np.random.default_rng(1).uniform(-1, 1, (args.tokens, D)).astype(np.float32)  # the same on every rank
    y = run(shard, x, args.prefill, reduce=lambda t: dist.all_reduce(t, op=dist.ReduceOp.SUM))
    print("rank %d: %s, heads %d..%d of %d, kv_b_proj %d bytes on the device" % (
        rank, ctx.device.name, rank * shard.config.num_heads // world, (rank + 1) * shard.config.num_heads // world - 1,
        shard.config.num_heads, shard.memory()["kv_b_proj"]), flush=True)
    ok = torch.tensor([1])
    if rank == 0:
        whole = clmla.Layer.from_pretrained(args.model, layer=args.layer, context=ctx)
        ref = run(whole, x, args.prefill)
        err = float((y.double() - ref.double()).abs().max() / ref.double().abs().max())
        good = err <= 1e-5
        print("all-reduced output of %d ranks against the unsharded layer, %d tokens (prefill %d, then decode): "
              "max relative error %.2e: %s" % (world, args.tokens, args.prefill, err, "OK" if good else "FAILED"),
              flush=True)
        ok[0] = int(good)
    dist.broadcast(ok, src=0)
    shard.close()
    ctx.close()
    dist.destroy_process_group()
    if not ok[0]:
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a model folder (default: a random one)")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--devices", type=lambda s: s.split(","), default=None,
                    help="device spec per rank, comma separated (default: the default device for all)")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--prefill", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.model:
            args.model = os.path.join(tmp, "model")
            os.makedirs(args.model)
            write_random_model(args.model)
        init_file = os.path.join(tmp, "dist-init")
        mp.spawn(worker, args=(args.ranks, args, init_file), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
