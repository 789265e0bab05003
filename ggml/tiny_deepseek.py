"""A tiny random model of DeepSeek-V2-Lite's shape, made here without the hub, and its GGUF.

    python ggml/tiny_deepseek.py OUT_DIR LLAMA_CPP_TREE [LAYERS]

writes OUT_DIR/hf (transformers' save_pretrained: config, safetensors, a byte-level BPE tokenizer
trained on this repository's docs) and OUT_DIR/tiny-deepseek2-f16.gguf (llama.cpp's own
convert_hf_to_gguf.py from LLAMA_CPP_TREE, run in this process).

LAYERS (default 27, V2-Lite's): llama.cpp knows a q_proj without LoRA by the count of 26 or 27
layers, so with any other count q goes through a LoRA of rank 384 as in DeepSeek-V2 (the bench's
4-layer model, whose 4096-token prefills take seconds, not minutes).

The attention is V2-Lite's: 16 heads, q_proj without a LoRA, kv_lora_rank 512, qk_rope_head_dim 64,
qk_nope_head_dim 128, v_head_dim 128, YaRN as published, so that llama.cpp's deepseek2 graph calls
flash attention with K 576 / V 512. The rest is small: hidden 256, V2-Lite's 27 layers (llama.cpp
knows a q_proj without LoRA by that count; 1 dense, 26 MoE with 4 routed experts, 2 per token,
1 shared), a 1024-token vocabulary. Weights are random with a fixed seed, each matrix's entries of
standard deviation TINY_GAIN / sqrt(fan_in) (default 0.85): at 1.0, llama.cpp's own two CPU
attention paths (flash attention and the separate products) part after a few tokens, so that a
greedy comparison would measure rounding; at 0.85 they agree over 64 tokens.

The converter knows tokenizers by a hash of their output; this tokenizer is new, so its
pre-tokenizer is given as "gpt-2" (byte-level BPE with GPT-2's split), which is what it is.
"""
import glob
import os
import sys

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CONFIG = dict(
    vocab_size=1024,
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=128,
    num_hidden_layers=27,
    first_k_dense_replace=1,
    num_attention_heads=16,
    num_key_value_heads=16,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    topk_method="greedy",
    routed_scaling_factor=1.0,
    norm_topk_prob=False,
    q_lora_rank=None,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    max_position_embeddings=163840,
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                     "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                     "mscale": 0.707, "mscale_all_dim": 0.707},
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
)


def train_tokenizer(vocab_size):
    texts = []
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]:
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


GAIN = float(os.environ.get("TINY_GAIN", "0.85"))


def make_model(out, layers):
    torch.manual_seed(20261206)
    config = dict(CONFIG, num_hidden_layers=layers)
    if layers not in (26, 27):
        config["q_lora_rank"] = 384
    cfg = transformers.AutoConfig.for_model("deepseek_v2", **config)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    g = torch.Generator().manual_seed(56)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] if p.dim() > 1 else 1
                p.copy_(torch.randn(p.shape, generator=g) * (GAIN / fan_in ** 0.5))
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    train_tokenizer(CONFIG["vocab_size"]).save_pretrained(out)


def convert(hf_dir, gguf_path, tree):
    sys.path.insert(0, tree)
    sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outfile", gguf_path, "--outtype", "f16"]
    import convert_hf_to_gguf
    from conversion import base
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    convert_hf_to_gguf.main()


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    out, tree = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    layers = int(sys.argv[3]) if len(sys.argv) == 4 else 27
    hf_dir = os.path.join(out, "hf")
    os.makedirs(hf_dir, exist_ok=True)
    make_model(hf_dir, layers)
    convert(hf_dir, os.path.join(out, "tiny-deepseek2-f16.gguf"), tree)


if __name__ == "__main__":
    main()
