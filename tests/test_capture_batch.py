"""Batched capture equals batch-1 capture per prompt (issue 14's acceptance point).

``capture_batch`` decodes a padded batch together and recomputes each step's telemetry from one
teacher-forced batch forward; ``capture`` runs one KV-cached generation trace per prompt. Per
prompt the two must agree: token ids, positions, steps, phases, top-k ids and top attended keys
exactly; every float column of the ``tokens``, ``attention`` and ``activations`` tables within
1e-5 (absolute and relative: a few times the float32 rounding of these statistics, the ~2e-6
relative floor); kept residuals within the model's measured determinism floor
(:func:`trajscope.studies.determinism.measure_floor`; 1e-5 relative L2 where it is not measured);
kept attention tensors within 1e-5.
Checked for left and right padding, prompts of different lengths, a batch that does not divide
the prompt count, a prefill window smaller than the prompt, eager attention, and a prompt
that reaches EOS while the rest of its batch goes on.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch

import trajscope as ts
from tiny import FAMILIES
from trajscope.capture.batch import capture_batch
from trajscope.errors import TrajscopeError
from trajscope.model.forward import numerics
from trajscope.studies.common import against_floor, deltas
from trajscope.studies.determinism import measure_floor

PROMPTS = ["def add(a, b):\n    return", "import os\nclass Foo:", "x = 1",
           "for i in range(3):\n    print(i, i * 2)"]
TOL = 1e-5


def _same_table(a: pl.DataFrame, b: pl.DataFrame, what: str) -> None:
    assert a.columns == b.columns and a.height == b.height, what
    for c in a.columns:
        x, y = a[c], b[c]
        if c in ("run_id",):
            continue
        if x.dtype == pl.List(pl.Float32) or x.dtype == pl.List(pl.Float64):
            assert (x.list.len() == y.list.len()).fill_null(True).all() and x.is_null().equals(y.is_null()), (what, c)
            x, y = x.explode(), y.explode()
        if x.dtype.is_float():
            xa, ya = x.to_numpy().astype(np.float64), y.to_numpy().astype(np.float64)
            assert np.array_equal(np.isnan(xa), np.isnan(ya)), (what, c)
            np.testing.assert_allclose(ya, xa, rtol=TOL, atol=TOL, equal_nan=True, err_msg=f"{what}.{c}")
        else:
            assert x.equals(y), (what, c)


def assert_same_run(one: ts.Trajectory, many: ts.Trajectory, floor: pl.DataFrame | None = None) -> None:
    """``many`` (batched) equals ``one`` (batch-1 capture) within the tolerances in the module docstring."""
    assert many.token_ids == one.token_ids
    for key in ("prompt_len", "n_steps", "n_generated", "stop_reason", "attention_prefill_rows", "residual_layers",
                "attention_layers"):
        assert many.meta[key] == one.meta[key], key
    for name in ("tokens", "attention", "activations"):
        _same_table(getattr(one, name), getattr(many, name), name)
    assert sorted(one.tensors) == sorted(many.tensors)
    res = {int(k.split(".")[1]): one.tensors[k] for k in one.tensors if k.startswith("residual.")}
    if res:
        got = {layer: many.tensors[f"residual.{layer}"] for layer in res}
        d = pl.DataFrame(deltas(res, got))
        if floor is None:
            assert d["rel_l2"].max() <= TOL
        else:
            d = against_floor(d, floor, dtype="float32")
            assert d["floor_rel_l2"].null_count() == 0 and not d["above_floor"].any()
    for k in one.tensors:
        if k.startswith("attention."):
            torch.testing.assert_close(many.tensors[k], one.tensors[k], rtol=TOL, atol=TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_capture_equals_batch_one_capture_per_prompt(tiny_models, family):
    model = tiny_models[family]
    cfg = ts.CaptureConfig(max_new_tokens=6, stop_at_eos=False, residual_layers="all", attention_layers=[1])
    with numerics(threads=1):
        one = [ts.capture(model, p, cfg) for p in PROMPTS]
        floor = measure_floor(model, [(str(i), t.token_ids[:-1]) for i, t in enumerate(one)])
        for side in ("left", "right"):
            many = capture_batch(model, PROMPTS, cfg, batch_size=3, padding_side=side)  # batches of 3 and 1
            assert len(many) == len(PROMPTS)
            assert len({t.prompt_len for t in many}) > 1  # prompts of different lengths share a batch
            for a, b in zip(one, many):
                assert b.meta["serving"] == {"batch_size": 3, "padding_side": side, "dtype": "float32",
                                             "device": "cpu"}
                assert_same_run(a, b, floor)


@pytest.mark.parametrize("side", ["left", "right"])
def test_prefill_window_and_eager_attention(tiny_models, tiny_eager, side):
    """Rows mode computes only the last ``prefill_rows`` prompt rows; eager computes all (as capture does)."""
    cfg = ts.CaptureConfig(max_new_tokens=4, stop_at_eos=False, prefill_rows=3)
    for model in (tiny_models["qwen2"], tiny_eager["llama"]):
        one = [ts.capture(model, p, cfg) for p in PROMPTS]
        many = capture_batch(model, PROMPTS, cfg, batch_size=4, padding_side=side)
        for a, b in zip(one, many):
            assert_same_run(a, b)
        prefill = many[3].attention.filter(pl.col("step") == 0)
        n_rows = prefill["pos"].n_unique()
        assert n_rows == (many[3].prompt_len if model.attn_impl == "eager" else 3)


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_prompt_that_stops_at_eos_while_its_batch_goes_on(tiny_dirs, side):
    model = ts.load_model(str(tiny_dirs["llama"]), device="cpu")  # its own handle: the EOS id is changed below
    cfg = ts.CaptureConfig(max_new_tokens=6, residual_layers=[0])
    probe = ts.capture(model, PROMPTS[2], cfg.replace(stop_at_eos=False))
    model.tokenizer.eos_token_id = probe.token_ids[probe.prompt_len + 2]  # "x = 1" now ends at its third token
    one = [ts.capture(model, p, cfg) for p in PROMPTS]
    assert [t.meta["stop_reason"] for t in one].count("eos") >= 1 and one[2].meta["n_generated"] == 3
    assert any(t.meta["stop_reason"] == "max_new_tokens" for t in one)
    many = capture_batch(model, PROMPTS, cfg, batch_size=4, padding_side=side)
    for a, b in zip(one, many):
        assert_same_run(a, b)


def test_batch_one_is_capture_and_the_settings_are_recorded(tiny_models, tmp_path):
    model = tiny_models["gpt2"]
    cfg = ts.CaptureConfig(max_new_tokens=3)
    one = ts.capture(model, PROMPTS[0], cfg, run_id="a")
    (b,) = capture_batch(model, PROMPTS[:1], cfg, batch_size=1, run_ids=["a"])
    for name in ("tokens", "attention", "activations"):
        assert getattr(b, name).equals(getattr(one, name))  # the same engine, bit for bit
    assert b.meta["serving"]["batch_size"] == 1
    (c,) = capture_batch(model, PROMPTS[:1], cfg, batch_size=2, padding_side="right", run_ids=["c"])
    saved = ts.Trajectory.load(c.save(tmp_path / "c"))
    assert saved.meta["serving"] == {"batch_size": 2, "padding_side": "right", "dtype": "float32", "device": "cpu"}
    assert saved.run_id == "c"


def test_clear_errors(tiny_models):
    model = tiny_models["llama"]
    with pytest.raises(TrajscopeError, match=r"^Batched capture decodes greedily \(temperature 0\)"):
        capture_batch(model, PROMPTS, ts.CaptureConfig(temperature=0.8), batch_size=2)
    capture_batch(model, PROMPTS[:1], ts.CaptureConfig(temperature=0.8, max_new_tokens=2), batch_size=1)  # allowed
    vec = ts.SteeringVector(layer=0, direction=torch.ones(model.d_model), strength=1.0)
    with pytest.raises(TrajscopeError, match=r"^Batched capture does not steer"):
        capture_batch(model, PROMPTS, ts.CaptureConfig(steering=(vec,)), batch_size=2)
    with pytest.raises(TrajscopeError, match=r"^padding_side must be 'left' or 'right'"):
        capture_batch(model, PROMPTS, batch_size=2, padding_side="middle")
    with pytest.raises(TrajscopeError, match=r"^The batch size must be a whole number of at least 1"):
        capture_batch(model, PROMPTS, batch_size=0)
    with pytest.raises(TrajscopeError, match=r"^The prompt list is empty"):
        capture_batch(model, [], batch_size=2)


def test_capture_command_batches_a_prompt_file(tiny_dirs, tmp_path):
    from trajscope.cli import main

    pf = tmp_path / "p.jsonl"
    pf.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt": p}) for i, p in enumerate(PROMPTS)), encoding="utf-8")
    base = ["capture", "--model", str(tiny_dirs["gpt2"]), "--prompts", str(pf), "--max-new-tokens", "3", "--quiet"]
    assert main(base + ["--out", str(tmp_path / "one")]) == 0
    assert main(base + ["--out", str(tmp_path / "many"), "--batch-size", "3", "--padding-side", "left"]) == 0
    for i in range(len(PROMPTS)):
        a = ts.Trajectory.load(tmp_path / "one" / f"p{i}")
        b = ts.Trajectory.load(tmp_path / "many" / f"p{i}")
        assert b.meta["serving"] == {"batch_size": 3, "padding_side": "left", "dtype": "float32", "device": "cpu"}
        assert_same_run(a, b)
    assert main(base + ["--out", str(tmp_path / "x"), "--batch-size", "2", "--temperature", "0.7"]) == 2


def test_an_attached_sae_gives_the_same_features(tiny_models):
    from trajscope.sae.model import SAE, SAEConfig

    sae = SAE(SAEConfig(architecture="topk", d_in=32, d_sae=128, k=8, hook_name="blocks.1.hook_resid_post"), seed=3)
    cfg = ts.CaptureConfig(max_new_tokens=4, stop_at_eos=False, sae=sae, sae_top_k=5)
    model = tiny_models["llama"]
    one = [ts.capture(model, p, cfg) for p in PROMPTS]
    for a, b in zip(one, capture_batch(model, PROMPTS, cfg, batch_size=4, padding_side="right")):
        assert_same_run(a, b)  # includes the sae_l0 / sae_rel_err / sae_cos columns of tokens
        _same_table(a.features, b.features, "features")
        assert b.meta["sae"] == a.meta["sae"]


def test_a_sliding_window_model_left_padded(tmp_path):
    from tiny import build_tiny_model

    model = ts.load_model(str(build_tiny_model(tmp_path, "mistral", sliding_window=4)), device="cpu")
    cfg = ts.CaptureConfig(max_new_tokens=6, stop_at_eos=False, attention_layers=[0], residual_layers="all")
    one = [ts.capture(model, p, cfg) for p in PROMPTS]
    for a, b in zip(one, capture_batch(model, PROMPTS, cfg, batch_size=4, padding_side="left")):
        assert_same_run(a, b)  # keys outside the window have zero weight in both
    with pytest.raises(TrajscopeError, match=r"^Right padding puts pad columns inside"):
        capture_batch(model, PROMPTS, cfg, batch_size=4, padding_side="right")
