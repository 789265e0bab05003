"""transformers' generate() through clmla (clmla.hf.attach) against transformers' own eager
attention, per MLA family, on tiny random models built from configs (no hub).

Each case: the model of the family's parity case (parity.py's configs and weights, float32, eager
attention), three prompts of different lengths batched with left padding, 48 new tokens by greedy
search with the end-of-sequence token off. The same generate runs with the model as it is and with
clmla.hf.attach; the tokens must be equal and the logits of every step within 1e-4 of eager's
(max |clmla - eager| / max |eager| per step). Then a bfloat16 copy of some models: eager and
clmla each run in bfloat16 over the float32 run's tokens (teacher forcing), and clmla's logits must
be no further from float32 eager's than transformers' own bfloat16 run is (within 1.5x).

Usage: generate.py [--only REGEX] [--out FILE]   (the table is printed, and written to FILE)
Exit status: 1 when any case fails.
"""

import argparse
import copy
import os
import re
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402  (the families' tiny configs and weights)

import clmla  # noqa: E402
import clmla.hf  # noqa: E402

NEW_TOKENS = 48
TOL = 1e-4
PROMPTS = [[5, 7, 9, 11, 3, 12, 8, 13, 21, 4, 6], [17, 12, 23, 19, 14], [9, 8, 7, 6, 5, 4, 3, 10]]


def dsa(name, heads):
    """A DSA case with enough indexer heads that no score is exactly 0 (every head's ReLU 0), where
    transformers' top-k breaks ties arbitrarily and clmla takes the earlier position."""
    return {"base": name, "name": name + "-%dheads" % heads, "set": {"index_n_heads": heads}}


# (parity case, overrides of its config). minicpm3: transformers switches LongRoPE's factors for the
# whole batch when its longest row passes original_max_position_embeddings (clmla: per sequence),
# so its original length is below every prompt's and every row uses the long factors throughout.
CASES = [
    {"base": "deepseek_v3-yarn"},
    {"base": "deepseek_v3-qproj"},
    {"base": "deepseek_v3-bias"},
    {"base": "deepseek_v2-yarn-qlora"},
    {"base": "deepseek_v2-yarn-qproj"},
    {"base": "kimi_k25-yarn"},
    {"base": "axk1-yarn"},
    {"base": "youtu-default"},
    {"base": "sarvam_mla-yarn"},
    {"base": "glm4_moe_lite-default"},
    {"base": "minicpm3-longrope", "name": "minicpm3-longrope-orig4",
     "rope": {"original_max_position_embeddings": 4}, "set": {"max_position_embeddings": 128}},
    {"base": "mistral4-yarn-llama4", "set": {"max_position_embeddings": 128}},
    {"base": "longcat_flash-s0", "name": "longcat_flash"},
    {"base": "kimi_linear-kda"},
    dsa("deepseek_v32-sparse", 32),
    dsa("glm_moe_dsa-sparse", 32),
    dsa("glm_moe_dsa-shared", 32),
]
BF16 = ("deepseek_v3-yarn", "deepseek_v2-yarn-qproj", "glm4_moe_lite-default")


def build(case):
    base = next(c for c in parity.CASES if c["name"] == case["base"])
    cfg = copy.deepcopy(parity.make_config(base))
    text = getattr(cfg, "text_config", None) or cfg
    for key, value in case.get("set", {}).items():
        setattr(text, key, value)
    if "rope" in case:
        text.rope_parameters = dict(text.rope_parameters, **case["rope"])
    text.vocab_size = max(text.vocab_size, 32)
    cls = parity.auto_class(base)
    if hasattr(cls, "from_config"):
        model = cls.from_config(cfg, attn_implementation="eager")
    else:
        cfg._attn_implementation = "eager"
        model = cls(cfg)
    parity.init_weights(model, base["name"])
    model.eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def batch():
    n = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (n - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in PROMPTS])
    return ids, mask


def generate(model, ids, mask):
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                         output_logits=True, return_dict_in_generate=True)
    return out, time.perf_counter() - t0


def step_errors(a, b):
    return [float((x - y).abs().max() / x.abs().max()) for x, y in zip(a, b)]


def logits_over(model, seqs, mask):
    """Logits of every position of the given token streams, one forward (teacher forcing)."""
    return model(input_ids=seqs, attention_mask=mask).logits.float()


def run_case(case):
    name = case.get("name", case["base"])
    model = build(case)
    ids, mask = batch()
    row = {"case": name, "family": parity.make_config(next(c for c in parity.CASES if c["name"] == case["base"])).model_type}
    with torch.no_grad():
        eager, t_eager = generate(model, ids, mask)
        clmla.hf.attach(model)
        try:
            mine, t_mine = generate(model, ids, mask)
        finally:
            clmla.hf.detach(model)
        errs = step_errors(eager.logits, mine.logits)
        equal = torch.equal(eager.sequences, mine.sequences)
        row.update(steps=len(errs), tokens_equal=equal, logits_err=max(errs),
                   eager_tps=ids.shape[0] * NEW_TOKENS / t_eager, clmla_tps=ids.shape[0] * NEW_TOKENS / t_mine)
        row["ok"] = equal and len(errs) == NEW_TOKENS and max(errs) <= TOL
        if case["base"] in BF16:
            full = torch.cat([mask, torch.ones_like(eager.sequences[:, ids.shape[1]:])], dim=1)
            ref = logits_over(model, eager.sequences, full)
            model.to(torch.bfloat16)
            own = logits_over(model, eager.sequences, full)
            clmla.hf.attach(model)
            try:
                theirs = logits_over(model, eager.sequences, full)
            finally:
                clmla.hf.detach(model)
            real = full.bool()
            scale = ref[real].abs().max()
            row["bf16_eager_err"] = float((own - ref)[real].abs().max() / scale)
            row["bf16_clmla_err"] = float((theirs - ref)[real].abs().max() / scale)
            row["ok"] = row["ok"] and row["bf16_clmla_err"] <= 1.5 * row["bf16_eager_err"]
    return row


def render(rows):
    lines = ["| case | model_type | steps | tokens equal | max logits error | eager tok/s | clmla tok/s | "
             "bf16: eager / clmla vs f32 | result |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append("| %s | %s | - | - | - | - | - | - | ERROR: %s |" % (r["case"], r.get("family", "?"), r["error"]))
            continue
        bf = ("%.2g / %.2g" % (r["bf16_eager_err"], r["bf16_clmla_err"])) if "bf16_eager_err" in r else "-"
        lines.append("| %s | %s | %d | %s | %.2g | %.0f | %.0f | %s | %s |" % (
            r["case"], r["family"], r["steps"], "yes" if r["tokens_equal"] else "NO", r["logits_err"], r["eager_tps"],
            r["clmla_tps"], bf, "pass" if r["ok"] else "FAIL"))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for case in CASES:
        name = case.get("name", case["base"])
        if args.only and not re.search(args.only, name):
            continue
        try:
            rows.append(run_case(case))
        except Exception as e:  # a case that cannot run is a failure of its own row
            traceback.print_exc()
            rows.append({"case": name, "error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:120])})
        print(render(rows[-1:]).splitlines()[-1], flush=True)
    table = render(rows)
    print()
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    failed = [r["case"] for r in rows if "error" in r or not r["ok"]]
    print("\n%d passed, %d failed" % (len(rows) - len(failed), len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
