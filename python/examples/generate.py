"""transformers' generate() with and without clmla: a tiny DeepSeek-V3-shaped model with random
weights, built locally with transformers from a config (no hub), generates from three prompts
(left padding) with its own eager attention, then with each MLA attention module computing
through clmla (clmla.hf.attach); both token streams and tokens/s are printed. Needs torch and
transformers (tests/parity/run.sh makes a venv with both: build/parity-venv).

    build/parity-venv/bin/python python/examples/generate.py [NEW_TOKENS]
"""
import sys
import time

import torch
import transformers

import clmla
import clmla.hf

new_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 32
config = transformers.DeepseekV3Config(
    vocab_size=256, hidden_size=256, num_attention_heads=8, num_key_value_heads=8, q_lora_rank=96,
    kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, num_hidden_layers=2,
    intermediate_size=256, moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2,
    n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, max_position_embeddings=4096,
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                     "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                     "mscale": 1.0, "mscale_all_dim": 1.0},
    tie_word_embeddings=False, pad_token_id=0)
model = clmla.hf.random_model(config, std=0.05)
model.generation_config.eos_token_id = None
model.generation_config.pad_token_id = 0

prompts = [[11, 42, 7, 99, 150, 3, 64, 28, 201, 17], [5, 77, 130], [61, 62, 63, 64, 65, 66]]
width = max(map(len, prompts))
ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
mask = (ids != 0).long()


def run(label):
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)
    seconds = time.perf_counter() - t0
    print("%-22s %.1f tokens/s" % (label, len(prompts) * new_tokens / seconds))
    for row in out[:, width:].tolist():
        print("   ", row)
    return out


eager = run("transformers (eager)")
clmla.hf.attach(model)
print("clmla device:", clmla.default_context().device.name)
mine = run("clmla")
clmla.hf.detach(model)
print("same tokens:", torch.equal(eager, mine))
