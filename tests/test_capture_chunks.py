"""Decode steps reduced in chunks (capture/chunks.py) against the per-step kernel.

The reference is the same capture with every step reduced on its own by
``kernels.record_step`` — the kernel NDIF captures run on the server — so each
table, kept tensor, SAE feature and probe score of a chunked capture must equal
it within float rounding, on models whose rows are padded differently (GQA,
a sliding window shorter than the prompt) and with the attachments on.
"""

from __future__ import annotations

import polars as pl
import pytest
import torch

import trajscope as ts
from trajscope.capture import chunks, kernels
from trajscope.model.attention import QueryRow
from trajscope.profile import profile_from_residuals
from trajscope.sae.model import SAE, SAEConfig
from tiny import build_tiny_model

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"

capture_mod = __import__("sys").modules["trajscope.capture"]


class PerStep(chunks.StepChunks):
    """Every step through the per-step kernel, as an NDIF capture reduces it (a decode query left for its
    chunk gets its row computed alone, over the keys it saw)."""

    def __call__(self, step, P, consumed, attn_rows, resid, logits, prev_lp, opts, out):
        self.out = out
        attn_rows = [r.rows() if isinstance(r, QueryRow) else r for r in attn_rows]
        n = len(out)
        self.last_lp = kernels.record_step(step, P, consumed, attn_rows, resid, logits, prev_lp, opts, out)
        if self.emit is not None:
            self.emit(out[-1], n + 1)
        return self.last_lp


def assert_same(a: ts.Trajectory, b: ts.Trajectory) -> None:
    assert a.token_ids == b.token_ids
    for name in ("tokens", "attention", "activations", "features", "probe"):
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        x, y = x.drop("run_id", strict=False), y.drop("run_id", strict=False)
        assert x.columns == y.columns and x.height == y.height, name
        for col in x.columns:
            if x[col].dtype.is_float():
                assert (x[col] - y[col]).abs().max() <= 2e-6, (name, col)
            elif x[col].dtype == pl.List(pl.Float32):
                d = (x[col].explode() - y[col].explode()).abs().max()
                assert d is None or d <= 2e-6, (name, col)
            else:
                assert x[col].equals(y[col]), (name, col)
    assert a.tensors.keys() == b.tensors.keys()
    for key in a.tensors:
        torch.testing.assert_close(a.tensors[key], b.tensors[key], atol=2e-6, rtol=0)


@pytest.fixture(scope="module")
def window_model(tmp_path_factory):
    return ts.load_model(str(build_tiny_model(tmp_path_factory.mktemp("w"), "mistral", sliding_window=6)))


@pytest.mark.parametrize("name", ["gpt2", "llama", "window"])
def test_chunked_capture_equals_the_per_step_kernel(tiny_models, window_model, monkeypatch, name):
    model = window_model if name == "window" else tiny_models[name]
    kw = dict(max_new_tokens=40, stop_at_eos=False, residual_layers="all", attention_layers="all",
              top_k_keys=4)
    monkeypatch.setattr(chunks, "MAX_CHUNK", 16)  # 39 decode steps: chunks of 16, 16 and 7
    chunked = ts.capture(model, PROMPT, **kw)
    monkeypatch.setattr(capture_mod, "StepChunks", PerStep)
    assert_same(chunked, ts.capture(model, PROMPT, **kw))


def test_chunked_capture_with_sae_and_probe_equals_the_per_step_kernel(tiny_models, monkeypatch):
    model = tiny_models["llama"]
    sae = SAE(SAEConfig(architecture="topk", d_in=model.d_model, d_sae=128, k=8,
                        hook_name="blocks.1.hook_resid_post"), seed=3)
    res = [ts.capture(model, p, max_new_tokens=1, residual_layers="all") for p in (PROMPT, "import os\n", "x = 1\n")]
    prof = profile_from_residuals([{layer: t.residual(layer) for layer in range(model.n_layers)} for t in res],
                                  fpr=0.2)
    kw = dict(max_new_tokens=24, stop_at_eos=False, sae=sae, sae_top_k=5, probe=ts.DriftProbe(prof, every=3))
    chunked = ts.capture(model, PROMPT, **kw)
    monkeypatch.setattr(capture_mod, "StepChunks", PerStep)
    per_step = ts.capture(model, PROMPT, **kw)
    assert chunked.features.height > 0 and chunked.probe.height > 0
    assert_same(chunked, per_step)


def test_streaming_sees_every_step_in_order_with_its_partial_run(tiny_models, monkeypatch):
    monkeypatch.setattr(chunks, "MAX_CHUNK", 3)
    events = []
    traj = ts.capture(tiny_models["qwen2"], PROMPT, max_new_tokens=11, stop_at_eos=False, on_step=events.append)
    assert [e.step for e in events] == list(range(11))
    assert [e.token_id for e in events] == traj.token_ids[traj.prompt_len - 1: traj.prompt_len + 10]
    assert events[5].partial().token_ids == traj.token_ids[: traj.prompt_len + 5]
    ent = traj.attention.group_by("step").agg(pl.col("entropy").mean()).sort("step")["entropy"].to_list()
    assert [e.mean_entropy for e in events][1:] == pytest.approx(ent[1:], abs=1e-6)


def test_chunks_stay_within_the_memory_budget():
    assert chunks.chunk_size(6, 8, 40) == chunks.MAX_CHUNK  # the sample model at short context
    assert chunks.chunk_size(30, 9, 8192) == 1  # SmolLM2 at all its 8,192 positions: one step at a time
    mid = chunks.chunk_size(30, 9, 1024)  # SmolLM2 at P = 1,024
    assert 1 < mid < chunks.MAX_CHUNK and 4 * 30 * 9 * mid * 1024 <= chunks.BUDGET_BYTES
    assert chunks.chunk_size(80, 64, 100_000) == 1
