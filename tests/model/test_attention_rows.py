"""Attention rows from q and K (``attn="rows"``) against Hugging Face's eager ``output_attentions``.

Per family (GPT-2, GPT-NeoX, Llama, Mistral, Qwen2 — the Llama-style ones with grouped
query heads, 4 query heads on 2 key heads — plus an MQA config and a sliding-window Mistral),
at prefill and at every decode step: the rows trajscope computes beside the SDPA
output equal eager attention's probabilities within 1e-5, and the telemetry tables
of a capture are unchanged against the eager path.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import trajscope as ts
from tiny import FAMILIES, build_tiny_model, hf_reference

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


def eager_rows(model, ids):
    """Per layer ``[H, T, T]`` eager probabilities of a no-cache forward over ``ids``."""
    with torch.no_grad():
        out = hf_reference(model)(torch.tensor([ids]), output_attentions=True, use_cache=False)
    return [a[0].float() for a in out.attentions]


@pytest.fixture(scope="module")
def extra_models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attn")
    mqa = build_tiny_model(tmp, "llama", num_key_value_heads=1)
    window = build_tiny_model(tmp / "w", "mistral", sliding_window=6)
    return {"llama-mqa": ts.load_model(str(mqa)), "mistral-window-6": ts.load_model(str(window))}


def _check(model, n_new=6):
    traj = ts.capture(model, PROMPT, max_new_tokens=n_new, stop_at_eos=False, attention_layers="all")
    ids = traj.token_ids[:-1]
    ref = eager_rows(model, ids)
    for layer in range(model.n_layers):
        torch.testing.assert_close(traj.attention_rows(layer), ref[layer], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_equal_eager_at_prefill_and_every_decode_step(tiny_models, family):
    _check(tiny_models[family])


@pytest.mark.parametrize("name", ["llama-mqa", "mistral-window-6"])
def test_rows_equal_eager_for_mqa_and_sliding_window(extra_models, name):
    _check(extra_models[name])


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_telemetry_tables_unchanged_against_eager(tiny_models, tiny_eager, family):
    kw = dict(max_new_tokens=8, stop_at_eos=False, prefill_rows="all")
    fast = ts.capture(tiny_models[family], PROMPT, **kw)
    ref = ts.capture(tiny_eager[family], PROMPT, **kw)
    assert fast.token_ids == ref.token_ids
    for name in ("tokens", "activations"):
        a, b = getattr(fast, name), getattr(ref, name)
        for col in a.columns:
            if a[col].dtype.is_float():
                assert (a[col] - b[col]).abs().max() < 1e-4, (name, col)
    a, b = fast.attention.sort("step", "pos", "layer", "head"), ref.attention.sort("step", "pos", "layer", "head")
    assert a.height == b.height
    for col in ("entropy", "prefix_mass", "sink_mass", "self_mass"):
        assert (a[col] - b[col]).abs().max() < 1e-5, col


def test_default_prefill_window_holds_the_last_rows(tiny_models, tiny_eager):
    model = tiny_models["llama"]
    P = len(model.encode(PROMPT))
    traj = ts.capture(model, PROMPT, max_new_tokens=3, stop_at_eos=False, prefill_rows=5)
    pre = traj.attention.filter(traj.attention["step"] == 0)
    assert sorted(set(pre["pos"].to_list())) == list(range(P - 5, P))
    assert traj.meta["attention_prefill_rows"] == 5
    full = ts.capture(tiny_eager["llama"], PROMPT, max_new_tokens=3, stop_at_eos=False)
    ref = full.attention.filter((full.attention["step"] == 0) & (full.attention["pos"] >= P - 5)).sort("pos", "layer", "head")
    assert (pre.sort("pos", "layer", "head")["entropy"] - ref["entropy"]).abs().max() < 1e-5
    with pytest.raises(ts.TrajscopeError, match="prefill_rows"):
        ts.CaptureConfig(prefill_rows=0)


def test_prefill_window_also_limits_the_unembedding(tiny_models):
    """With a window, prompt positions before it keep residual stats but get null logprob/entropy;
    inside it the numbers equal the all-rows capture."""
    model = tiny_models["gpt2"]
    P = len(model.encode(PROMPT))
    win = ts.capture(model, PROMPT, max_new_tokens=4, stop_at_eos=False, prefill_rows=6).tokens
    full = ts.capture(model, PROMPT, max_new_tokens=4, stop_at_eos=False, prefill_rows="all").tokens
    assert win["entropy"][: P - 6].null_count() == P - 6 and win["top_ids"][: P - 6].null_count() == P - 6
    assert win["logprob"][1: P - 5].null_count() == P - 6
    for col, start in (("entropy", P - 6), ("logprob", P - 5)):  # logprob(pos) comes from row pos − 1
        a, b = win[col][start:].fill_null(np.nan).to_numpy(), full[col][start:].fill_null(np.nan).to_numpy()
        assert np.nanmax(abs(a - b)) < 1e-5 and np.isnan(a).sum() == np.isnan(b).sum(), col
    assert win["top_ids"][P - 6:].to_list() == full["top_ids"][P - 6:].to_list()


def test_local_capture_takes_rows_from_the_sink_not_the_module(tiny_models, tiny_dirs, monkeypatch):
    """A local trace on the rows attention takes each layer's rows from the sink the attention fills
    (one nnsight read per layer instead of two): the prefill's as rows, each decode step's as the query,
    whose row is computed with its chunk's; the rows-vs-eager tests above check their values."""
    from trajscope.model.attention import RowSink

    taken: list[tuple[int, str]] = []
    take = RowSink.take

    def counting_take(self, layer, now=False):
        entry = take(self, layer, now)
        taken.append((layer, type(entry).__name__))
        return entry

    monkeypatch.setattr(RowSink, "take", counting_take)
    model = tiny_models["llama"]
    ts.capture(model, PROMPT, max_new_tokens=4, stop_at_eos=False)
    L = model.n_layers
    assert [layer for layer, _ in taken] == list(range(L)) * 4  # every layer, every step, in order
    assert [kind for _, kind in taken] == ["Tensor"] * L + ["QueryRow"] * (3 * L)
    taken.clear()
    remote = ts.load_model(str(tiny_dirs["llama"]), remote="local")
    ts.capture(remote, PROMPT, max_new_tokens=2, stop_at_eos=False)
    assert taken == []  # a serialised trace reads the attention modules


def test_decode_steps_take_unsteered_block_outputs_from_the_sink(tiny_models, monkeypatch):
    """At a decode step a local trace reads through nnsight only the blocks it steers; every other block's
    output comes from the sink's forward hook (read once the logits are), and the hooks are gone after the
    run. The values are held to a no-cache forward by test_capture's residual test and, steered, by
    test_steering's forced-forward test."""
    from trajscope.model.attention import RowSink
    from trajscope.model.families import get_path
    from trajscope.steering import SteeringVector

    taken: list[int] = []
    output = RowSink.output

    def counting_output(self, layer):
        taken.append(layer)
        return output(self, layer)

    monkeypatch.setattr(RowSink, "output", counting_output)
    model = tiny_models["llama"]
    L = model.n_layers
    plain = ts.capture(model, PROMPT, max_new_tokens=4, stop_at_eos=False, residual_layers="all")
    assert taken == list(range(L)) * 3  # the three decode steps; the prefill reads every block through nnsight
    taken.clear()
    vec = SteeringVector(layer=1, direction=torch.ones(model.d_model), strength=4.0)
    steered = ts.capture(model, PROMPT, max_new_tokens=4, stop_at_eos=False, residual_layers="all", steering=[vec])
    assert taken == [layer for layer in range(L) if layer != 1] * 3
    assert steered.token_ids != plain.token_ids or not torch.equal(steered.residual(1), plain.residual(1))
    blocks = get_path(model.torch_module(), model.family.blocks)
    assert all(not block._forward_hooks for block in blocks)


def test_the_sink_holds_one_step_at_a_time(tiny_models, monkeypatch):
    """The generation loop empties the sink after each step, so it never holds more than one step's entries
    and one key tensor per layer (a sink nobody empties keeps every step's keys of every layer)."""
    from trajscope.model.attention import RowSink, collect_rows

    held: list[tuple[int, int]] = []
    defer = RowSink.defer

    def watching_defer(self, query, key, scaling):
        defer(self, query, key, scaling)
        held.append((len(self.calls), len(self.keys)))

    monkeypatch.setattr(RowSink, "defer", watching_defer)
    model = tiny_models["gpt2"]
    ts.capture(model, PROMPT, max_new_tokens=5, stop_at_eos=False)
    L = model.n_layers
    assert len(held) == 4 * L and max(c for c, _ in held) == L and max(k for _, k in held) == L
    config, mine = model.nn._module.config, RowSink()
    with collect_rows(config, mine) as sink:
        assert sink is mine and config._trajscope_row_sink is mine
    assert getattr(config, "_trajscope_row_sink", None) is None


def test_a_sliding_window_keeps_its_decode_rows_in_the_forward(extra_models, monkeypatch):
    """A sliding-window cache drops old keys, so its decode rows cannot wait for the chunk's keys."""
    from trajscope.model.attention import RowSink

    kinds: list[str] = []
    take = RowSink.take

    def counting_take(self, layer, now=False):
        entry = take(self, layer, now)
        kinds.append(type(entry).__name__)
        return entry

    monkeypatch.setattr(RowSink, "take", counting_take)
    ts.capture(extra_models["mistral-window-6"], PROMPT, max_new_tokens=3, stop_at_eos=False)
    assert kinds and set(kinds) == {"Tensor"}


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
def test_chunk_rows_equal_each_step_computed_alone(heads):
    """The rows of a chunk of decode steps, from one product over the newest keys, equal each step's row
    computed alone over the keys it saw (attention_rows, the forward's path; checked against eager above)."""
    from trajscope.model.attention import QueryRow, RowSink, attention_rows, chunk_rows

    H, Hkv = heads
    torch.manual_seed(0)
    keys = torch.randn(1, Hkv, 20, 8)
    sink, entries, alone = RowSink(), [], []
    for n_keys in (14, 15, 16, 17):  # four decode steps, the newest sees 17 keys
        q = torch.randn(1, H, 1, 8)
        sink.keys = [keys[:, :, :n_keys]]
        entries.append(QueryRow(sink, 0, q, n_keys, 0.3))
        alone.append(attention_rows(q, keys[:, :, :n_keys], None, 0.3, n_keys - 1)[0])
    rows = chunk_rows(entries, 18)
    assert rows.shape == (H, 4, 18)
    for c, a in enumerate(alone):
        n = a.shape[-1]
        torch.testing.assert_close(rows[:, c:c + 1, :n], a, atol=1e-6, rtol=1e-5)
        assert not rows[:, c, n:].any()
    torch.testing.assert_close(entries[1].rows(), alone[1])
