"""The hidden states that enter one layer's self_attn in a transformers model, saved as the X.npy
that `clmla run` reads, with transformers' own attention output of that layer beside it.

    python capture_hidden.py MODEL_DIR LAYER "some text" OUT_PREFIX

writes OUT_PREFIX_X.npy (float32 [T, hidden_size], the input of model.layers[LAYER].self_attn for
the text's tokens, one sequence at positions 0..T-1) and OUT_PREFIX_Y_transformers.npy (that
module's output, float32 [T, hidden_size]). Then

    clmla run --model MODEL_DIR --layer LAYER --input OUT_PREFIX_X.npy --output OUT_PREFIX_Y.npy

computes the same attention with clmla, to compare with the second file. MODEL_DIR is a local
folder (config.json, safetensors, tokenizer); the model runs in float32 on the CPU.
"""
import sys

import numpy as np
import torch
import transformers


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    folder, layer, text, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    attn = model.model.layers[layer].self_attn
    seen = {}

    def before(module, args, kwargs):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        seen["x"] = hidden[0].detach().float().numpy()

    def after(module, args, kwargs, output):
        out = output[0] if isinstance(output, tuple) else output
        seen["y"] = out[0].detach().float().numpy()

    hooks = [attn.register_forward_pre_hook(before, with_kwargs=True),
             attn.register_forward_hook(after, with_kwargs=True)]
    with torch.no_grad():
        model(**tokenizer(text, return_tensors="pt"))
    for h in hooks:
        h.remove()
    np.save(prefix + "_X.npy", seen["x"].astype(np.float32))
    np.save(prefix + "_Y_transformers.npy", seen["y"].astype(np.float32))
    print("%s_X.npy: %s float32; %s_Y_transformers.npy: %s" % (prefix, seen["x"].shape, prefix, seen["y"].shape))


if __name__ == "__main__":
    main()
