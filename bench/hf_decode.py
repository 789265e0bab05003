"""Decode steps of a transformers model at a long context, its own eager attention against the
same model with clmla.hf.attach, in one process on one machine: the per-step time of the whole
model and of its attention modules alone (forward hooks, wall clock), medians over the steps.

The model: 2 decoder layers of DeepSeek-V2-Lite's attention shape (hidden 2048, 16 heads, no query
LoRA, kv_lora_rank 512, nope 128, rope 64, v 128, YaRN), random weights, float32, with a small MLP
(intermediate 1408, 4 routed experts) so that the attention is what differs. Each side prefills
the same random prompt of --ctx tokens, then runs --steps greedy decode steps (batch 1). Needs torch
and transformers (build/parity-venv):

    CLMLA_LIBRARY=build/libclmla.so PYTHONPATH=python/src build/parity-venv/bin/python bench/hf_decode.py \
        [--ctx 4096] [--steps 16] [--cache-dtype f32] [--json FILE]
"""
import argparse
import json
import statistics
import time

import torch
import transformers

import clmla
import clmla.hf


def model_v2_lite(layers):
    cfg = transformers.DeepseekV2Config(
        vocab_size=1024, hidden_size=2048, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None,
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_hidden_layers=layers,
        intermediate_size=1408, moe_intermediate_size=1408, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, first_k_dense_replace=1, max_position_embeddings=163840,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                         "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                         "mscale": 0.707, "mscale_all_dim": 0.707},
        tie_word_embeddings=False, pad_token_id=0)
    return clmla.hf.random_model(cfg, norm_std=0.1)


def timed_decode(model, prompt, steps):
    """Prefill, then `steps` decode steps by hand (greedy), timing each step and its attention."""
    attn_time = []
    hooks = []
    for _, m in clmla.hf.attention_modules(model):
        hooks.append(m.register_forward_pre_hook(lambda mod, a, k: attn_time.append(-time.perf_counter()),
                                                 with_kwargs=True))
        hooks.append(m.register_forward_hook(lambda mod, a, k, o: attn_time.append(time.perf_counter()),
                                             with_kwargs=True))
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
        prefill = time.perf_counter() - t0
        token = out.logits[:, -1:].argmax(-1)
        step_s, attn_s, tokens = [], [], []
        for _ in range(steps):
            del attn_time[:]
            t0 = time.perf_counter()
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            step_s.append(time.perf_counter() - t0)
            attn_s.append(sum(attn_time))
            token = out.logits[:, -1:].argmax(-1)
            tokens.append(int(token))
    for h in hooks:
        h.remove()
    return prefill, step_s, attn_s, tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--cache-dtype", default="f32")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    model = model_v2_lite(a.layers)
    prompt = torch.randint(1, 1024, (1, a.ctx), generator=torch.Generator().manual_seed(1))
    rows = []
    for side in ("eager", "clmla"):
        if side == "clmla":
            clmla.hf.attach(model, cache_dtype=a.cache_dtype, max_tokens=a.ctx + a.steps + 1)
            timed_decode(model, prompt[:, :64], 2)  # the kernels built before the timed run
        prefill, step_s, attn_s, tokens = timed_decode(model, prompt, a.steps)
        if side == "clmla":
            clmla.hf.detach(model)
        row = {"side": side, "ctx": a.ctx, "steps": a.steps, "layers": a.layers, "prefill_s": prefill,
               "step_ms": 1e3 * statistics.median(step_s), "attention_ms": 1e3 * statistics.median(attn_s),
               "tokens": tokens, "torch_threads": torch.get_num_threads(),
               "device": clmla.default_context().device.name if side == "clmla" else "torch cpu"}
        rows.append(row)
        print("%-6s prefill %.2f s, decode step %.2f ms (attention %.2f ms), median of %d steps at ctx %d" % (
            side, prefill, row["step_ms"], row["attention_ms"], a.steps, a.ctx), flush=True)
    e, c = rows
    print("attention: clmla %.1fx faster than eager; whole step %.2fx; same tokens: %s" % (
        e["attention_ms"] / c["attention_ms"], e["step_ms"] / c["step_ms"], e["tokens"] == c["tokens"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
