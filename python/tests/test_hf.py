"""clmla.hf.attach / detach on tiny random transformers models: generate() through clmla gives
eager attention's tokens, detach restores transformers' own attention, and what attach cannot run
is refused by name. The per-family table is tests/parity/generate.py's.

Skipped where torch or transformers is missing (run.sh of tests/parity runs it in its venv).
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import clmla  # noqa: E402
import clmla.hf  # noqa: E402

from conftest import TINY_DEEPSEEK  # noqa: E402

BASE = dict(TINY_DEEPSEEK, vocab_size=48, num_hidden_layers=2, pad_token_id=0)


def tiny(model_type="deepseek_v3", seed=0, **kw):
    cfg = transformers.AutoConfig.for_model(model_type, **dict(BASE, **kw))
    model = clmla.hf.random_model(cfg, seed=seed, std=0.1)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def prompts():
    ids = torch.tensor([[0, 0, 0, 5, 7, 9, 11, 3], [17, 12, 23, 19, 14, 2, 8, 6], [0, 0, 0, 0, 0, 9, 8, 7]])
    return ids, (ids != 0).long()  # 0 is the padding


def test_generate_matches_eager_and_detach_restores():
    model = tiny()
    ids, mask = prompts()
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, output_logits=True,
              return_dict_in_generate=True)
    attn = [m for _, m in clmla.hf.attention_modules(model)]
    forwards = [m.forward for m in attn]
    with torch.no_grad():
        eager = model.generate(**kw)
        assert clmla.hf.attach(model, cache_dtype="f32") is model
        assert all(m.forward is not f for m, f in zip(attn, forwards))
        mine = model.generate(**kw)
        again = model.generate(**kw)  # a second generate call: a fresh clmla cache
        clmla.hf.detach(model)
        after = model.generate(**kw)
    assert [m.forward for m in attn] == forwards
    assert torch.equal(eager.sequences, mine.sequences) and torch.equal(mine.sequences, again.sequences)
    assert torch.equal(eager.sequences, after.sequences)
    for a, b in zip(eager.logits, mine.logits):
        assert float((a - b).abs().max() / a.abs().max()) <= 1e-4


def test_forward_without_cache():
    """A plain forward (use_cache=False) runs the whole sequence through a fresh clmla cache."""
    model = tiny(seed=1)
    ids, mask = prompts()
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        clmla.hf.attach(model)
        got = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        clmla.hf.detach(model)
    real = mask.bool()
    assert float((got - want)[real].abs().max() / want[real].abs().max()) <= 1e-4


def test_shared_indexer_layers():
    """glm_moe_dsa with "shared" layers (no indexer: the selection of the full layer before them),
    past index_topk: a forward and generate() through clmla against eager attention. 32 indexer heads:
    with few, a key whose every head's ReLU is 0 scores exactly 0, and transformers and clmla break
    such ties at the top-k boundary differently (docs/MODELS.md)."""
    model = tiny("glm_moe_dsa", seed=2, num_hidden_layers=4, index_topk=4, index_head_dim=16, index_n_heads=32,
                 indexer_types=["full", "shared", "shared", "full"],
                 mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
    ids = torch.tensor([[17, 12, 23, 19, 14, 2, 8, 6, 9, 30]])
    kw = dict(input_ids=ids, max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
        eager = model.generate(**kw)
        clmla.hf.attach(model)
        got = model(input_ids=ids, use_cache=False).logits
        mine = model.generate(**kw)
        clmla.hf.detach(model)
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-4
    assert torch.equal(eager.sequences, mine.sequences)
    for a, b in zip(eager.logits, mine.logits):
        assert float((a - b).abs().max() / a.abs().max()) <= 1e-4


def test_refusals():
    model = tiny()
    with pytest.raises(clmla.Error, match="cache_dtype must be one of"):
        clmla.hf.attach(model, cache_dtype="f64")
    clmla.hf.attach(model)
    with pytest.raises(clmla.Error, match="attached already"):
        clmla.hf.attach(model)
    clmla.hf.detach(model)
    with pytest.raises(clmla.Error, match="not attached"):
        clmla.hf.detach(model)

    llama = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(
        vocab_size=32, hidden_size=32, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(clmla.Error, match="no MLA attention module"):
        clmla.hf.attach(llama)

    # a rope type clmla does not run: refused by name by clmla's own config reader
    dyn = tiny(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(clmla.Error, match="dynamic"):
        clmla.hf.attach(dyn)
    assert getattr(dyn, "_clmla_attached", None) is None

