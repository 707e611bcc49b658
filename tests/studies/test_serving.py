"""Serving studies: known answers on tiny models (fp32, CPU) and the one-sentence errors.

- batched harvest equals batch-1 per prompt, and batch-composition deltas (identical-input
  copies included) stay within the measured determinism floor;
- with every prompt reusing the warm shared prefix, the computed-position count equals the
  suffix length, and the continuation's activations on the reused prefix equal an independent
  Hugging Face forward of the full sequence within the floor, per family;
- with chunk size ≥ prompt length, chunked prefill equals the monolithic pass exactly;
- the shared helpers (deltas, floor, bootstrap) against hand-computed answers;
- ``trajscope study …`` through ``register`` on an argparse parser.
"""

from __future__ import annotations

import argparse
import json

import polars as pl
import pytest
import torch

from tiny import FAMILIES
from trajscope.errors import TrajscopeError
from trajscope.model.forward import numerics
from trajscope.studies import batching, determinism, prefill, prefix_cache
from trajscope.studies.flags import register
from trajscope.studies.common import against_floor, bootstrap_ci, deltas
from trajscope.studies.harvest import harvest_served
from trajscope.studies.prompts import encode_prompts, shared_prefix_len

TEXTS = ["def fibonacci(n):\n    return n", "import os", "class A:\n    pass\n\n\nclass B:\n    x = 1",
         "for i in range(10):\n    print(i)"]
HEADER = "# System: answer with short Python.\n# License: PSF.\n"


def _prompts(model, texts=TEXTS, max_tokens=24):
    return encode_prompts(model, [{"prompt": t, "id": f"p{i}"} for i, t in enumerate(texts)], max_tokens)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (the CI machine is shared); restored afterwards."""
    with numerics(threads=1):
        yield


@pytest.fixture(scope="module")
def floors(tiny_models):
    """The fp32 determinism floor of each tiny model, measured on the test prompts (lazily)."""
    cache: dict[str, pl.DataFrame] = {}

    def get(family):
        if family not in cache:
            m = tiny_models[family]
            cache[family] = determinism.measure_floor(m, _prompts(m) + _prompts(m, with_texts(TEXTS), None))
        return cache[family]

    return get


def with_texts(texts):
    return [HEADER + t for t in texts]


def _within(df, floor):
    df = against_floor(df, floor)
    assert df["floor_rel_l2"].null_count() == 0
    return df


# -- known answers for the shared helpers ------------------------------------------------------------

def test_deltas_known_answer():
    a = {0: torch.tensor([[3.0, 4.0], [1.0, 0.0]])}
    b = {0: torch.tensor([[3.0, 4.0], [0.0, 1.0]])}
    d = deltas(a, b)
    assert d["layer"] == [0, 0] and d["pos"] == [0, 1]
    assert d["l2"] == pytest.approx([0.0, 2 ** 0.5]) and d["rel_l2"] == pytest.approx([0.0, 2 ** 0.5])
    assert d["cos"] == pytest.approx([1.0, 0.0])


def test_floor_by_layer_takes_the_larger_of_noise_and_twice_rounding():
    det = pl.DataFrame({"dtype": ["float32"] * 4, "layer": [0, 0, 0, 0], "prompt_id": ["a", "a", "b", "b"],
                        "condition": ["repeat", "vs_float64", "threads", "vs_float64"],
                        "rel_l2": [1e-7, 3e-7, 5e-7, 2e-7], "l2": [1.0, 1.0, 1.0, 1.0]})
    fl = determinism.floor_by_layer(det)
    assert fl["noise_rel_l2"][0] == pytest.approx(5e-7) and fl["floor_rel_l2"][0] == pytest.approx(6e-7)


def test_bootstrap_interval_brackets_the_mean_and_is_reproducible():
    v = [1.0, 2.0, 3.0, 4.0, 5.0]
    lo, hi = bootstrap_ci(v)
    assert lo < 3.0 < hi and (lo, hi) == bootstrap_ci(v)


# -- acceptance on tiny models -----------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_batch_to_layer_stops_after_the_layer_and_equals_forward_batch(tiny_models, family):
    """The stopping forward reads exactly what the full padded forward reads, and no block after the
    deepest harvested one, nor the unembedding, runs."""
    from trajscope.model.forward import _blocks
    from trajscope.model.batch import batch_to_layer

    model = tiny_models[family]
    seqs = [ids for _, ids in _prompts(model)]
    hf = model.nn._module
    blocks = _blocks(hf, model)
    calls: list[str] = []
    handles = [blocks[-1].register_forward_hook(lambda *a: calls.append("last block")),
               hf.get_output_embeddings().register_forward_hook(lambda *a: calls.append("unembed"))]
    try:
        for side in ("left", "right"):
            full = model.forward_batch(seqs, padding_side=side, layers=[0])
            calls.clear()
            got = batch_to_layer(model, seqs, [0], padding_side=side)
            assert calls == [] and len(got) == len(seqs)
            for fw, g in zip(full, got):
                assert torch.equal(fw.resid[0], g[0]), (family, side)
    finally:
        for h in handles:
            h.remove()
    assert len(blocks) > 1  # the test means something only when a block follows layer 0
    with pytest.raises(TrajscopeError, match="at least one layer"):
        batch_to_layer(model, seqs, [])


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_harvest_equals_batch_one_per_prompt(tiny_models, floors, family):
    model = tiny_models[family]
    prompts = _prompts(model)
    one = harvest_served(model, prompts, [0, 1], batch_size=1)
    fl = floors(family)
    for side in ("left", "right"):
        many = harvest_served(model, prompts, [0, 1], batch_size=4, padding_side=side)
        assert many.rows["batch_size"].unique().to_list() == [4]
        assert many.rows["padding_side"].unique().to_list() == [side]
        for layer in (0, 1):
            a, b = one.per_prompt(layer), many.per_prompt(layer)
            for pid in a:
                d = pl.DataFrame(deltas({layer: a[pid]}, {layer: b[pid]})).with_columns(dtype=pl.lit("float32"))
                assert not _within(d, fl)["above_floor"].any(), (family, side, pid)


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_composition_within_floor(tiny_models, floors, family):
    model = tiny_models[family]
    d, bands = batching.batch_composition_study(model, _prompts(model), batch_size=3)
    assert set(d["neighbours"].unique()) == {"shorter", "longer", "mixed", "copies"}
    assert set(d["padding_side"].unique()) == {"left", "right"}
    d = _within(d, floors(family))
    assert not d["above_floor"].any() and not d["greedy_diverged"].any()
    assert (bands["rel_spread"] <= 2 * bands["rel_l2_max"] + 1e-12).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_chunk_at_least_prompt_length_equals_monolithic_exactly(tiny_models, family):
    model = tiny_models[family]
    prompts = _prompts(model)
    longest = max(len(ids) for _, ids in prompts)
    d = prefill.chunked_prefill_study(model, prompts, chunks=[longest, longest + 5])
    assert (d["l2"] == 0).all() and not d["greedy_diverged"].any()
    small = prefill.chunked_prefill_study(model, prompts[:1], chunks=[2])
    assert not _within(small, determinism.measure_floor(model, prompts[:1]))["above_floor"].any()


def test_full_prefix_reuse_computes_exactly_the_suffix(tiny_models):
    model = tiny_models["llama"]
    prompts = _prompts(model, with_texts(TEXTS), max_tokens=None)
    shared = shared_prefix_len([ids for _, ids in prompts])
    h = harvest_served(model, prompts, [1], prefix_cache="warm")
    seqs = h.rows.group_by("prompt_id", maintain_order=True).agg(
        pl.len().alias("n"), (pl.col("status") == "computed").sum().alias("computed"), pl.col("n_reused").first())
    assert (seqs["n_reused"] == shared).all()
    assert (seqs["computed"] == seqs["n"] - shared).all()
    assert h.acts[1].shape[0] == int(seqs["computed"].sum())
    cov = prefix_cache.coverage_map(model, prompts, prefix_cache.plan_reuse([ids for _, ids in prompts]))
    summ = prefix_cache.coverage_summary(cov)
    overall = summ.filter(pl.col("by") == "all")
    assert overall["share_never_produced"][0] == pytest.approx(shared * len(prompts) / cov.height)
    assert summ.filter((pl.col("by") == "region") & (pl.col("group") == "shared"))["share_never_produced"][0] == 1.0


@pytest.mark.parametrize("family", FAMILIES)
def test_prefix_reuse_equals_hf_full_forward_within_floor(tiny_models, floors, family):
    """Independent check: the continuation on a reused prefix vs Hugging Face's own full forward."""
    model = tiny_models[family]
    prompts = _prompts(model, with_texts(TEXTS[:3]), max_tokens=None)
    h = harvest_served(model, prompts, [0], prefix_cache="warm")
    got = h.per_prompt(0)
    rows = []
    for pid, ids in prompts:
        with torch.no_grad():
            ref = model.torch_module()(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
        r = len(ids) - got[pid].shape[0]
        assert r == shared_prefix_len([i for _, i in prompts]) > 0
        rows.append(pl.DataFrame(deltas({0: ref.hidden_states[1][0, r:].float()}, {0: got[pid]})))
    d = _within(pl.concat(rows).with_columns(dtype=pl.lit("float32")), floors(family))
    assert not d["above_floor"].any()


def test_determinism_study_on_cpu_has_a_zero_repeat_floor_and_lower_precision_moves(tiny_models):
    model = tiny_models["gpt2"]
    det = determinism.determinism_study(model, _prompts(model)[:2], dtypes=["float32", "bfloat16"], repeats=1)
    assert {"repeat", "deterministic", "vs_float64", "vs_float32"} <= set(det["condition"].unique())
    fl = determinism.floor_by_layer(det)
    f32 = fl.filter(pl.col("dtype") == "float32")
    bf = fl.filter(pl.col("dtype") == "bfloat16")
    assert (f32["noise_rel_l2"] == 0).all() and (f32["floor_rel_l2"] > 0).all()
    assert (bf["floor_rel_l2"] > 100 * f32["floor_rel_l2"]).all()


# -- errors ------------------------------------------------------------------------------------------

def test_clear_errors(tiny_models):
    model = tiny_models["llama"]
    prompts = _prompts(model)
    with pytest.raises(TrajscopeError, match=r"^The cpu device cannot run float8_e4m3fn"):
        determinism.determinism_study(model, prompts, dtypes=["float8_e4m3fn"])
    for bad in (0, -3):
        with pytest.raises(TrajscopeError, match=r"^Chunk sizes must be positive"):
            prefill.chunked_prefill_study(model, prompts, chunks=[4, bad])
    with pytest.raises(TrajscopeError, match=r"^The prompts share a prefix of only 0 token"):
        prefix_cache.plan_reuse([ids for _, ids in prompts])
    with pytest.raises(TrajscopeError, match="batch_size=1"):
        harvest_served(model, prompts, [0], batch_size=2, prefix_cache="warm")


# -- command line ------------------------------------------------------------------------------------

def _parser():
    parser = argparse.ArgumentParser(prog="trajscope")
    register(parser.add_subparsers(dest="command"))
    return parser


def _run(argv):
    args = _parser().parse_args(argv)
    return args.func(args)


@pytest.mark.parametrize("study,extra,table", [
    ("batch", ["--batch-size", "2", "--neighbours", "longer,copies", "--slots", "first"], "batch"),
    ("chunked-prefill", ["--chunks", "1,64"], "chunked-prefill"),
    ("prefix-cache", ["--header", "default"], "prefix-cache_coverage"),
    ("determinism", ["--dtypes", "float32", "--repeats", "1"], "determinism_floor"),
])
def test_study_commands_write_tables_with_metadata(tiny_dirs, tmp_path, capsys, study, extra, table):
    pf = tmp_path / "p.jsonl"
    pf.write_text("\n".join(json.dumps({"prompt": t, "id": f"p{i}"}) for i, t in enumerate(TEXTS)), encoding="utf-8")
    out = tmp_path / "out"
    assert _run(["study", study, "--model", str(tiny_dirs["gpt_neox"]), "--prompts", str(pf), "--out", str(out),
                 "--max-prompts", "3", "--max-tokens", "16", *extra]) == 0
    meta = pl.read_parquet_metadata(out / f"{table}.parquet")
    assert meta["trajscope_table"] == f"serving_{table}" and "trajscope_schema" in meta
    df = pl.read_parquet(out / f"{table}.parquet")
    assert df.height > 0 and "rel_l2" in capsys.readouterr().out
    if study == "prefix-cache":
        assert set(df["status"].unique()) == {"reused", "computed"}


def test_study_command_errors(tiny_dirs, tmp_path):
    pf = tmp_path / "p.jsonl"
    pf.write_text("\n".join(json.dumps({"prompt": t}) for t in TEXTS), encoding="utf-8")
    common = ["--model", str(tiny_dirs["llama"]), "--prompts", str(pf), "--out", str(tmp_path / "o")]
    with pytest.raises(TrajscopeError, match=r"^Chunk sizes must be positive"):
        _run(["study", "chunked-prefill", *common, "--chunks", "0"])
    with pytest.raises(TrajscopeError, match=r"^The prompts share a prefix"):
        _run(["study", "prefix-cache", *common])
    with pytest.raises(TrajscopeError, match=r"^The cpu device cannot run float8_e4m3fn"):
        _run(["study", "determinism", *common, "--dtypes", "float8_e4m3fn"])
    with pytest.raises(SystemExit):
        _parser().parse_args(["study", "nonsense"])


@pytest.mark.parametrize("study,extra", [
    ("batch", ["--batch-size", "2", "--neighbours", "longer,copies", "--slots", "first"]),
    ("chunked-prefill", ["--chunks", "1,64"]),
    ("prefix-cache", ["--header", "default"]),
    ("determinism", ["--dtypes", "float32,bfloat16", "--repeats", "1"]),
])
def test_headline_is_one_value_in_the_marker_and_the_report(tiny_dirs, tmp_path, monkeypatch, study, extra):
    """The serving studies' headline numbers come from one function (summary.headline): the written marker and
    the report section show what it returned; unpatched, the marker equals it recomputed from the written tables."""
    from trajscope.reports.studies import sections
    from trajscope.studies.registry import Result
    from trajscope.studies.serving import summary

    pf = tmp_path / "p.jsonl"
    pf.write_text("\n".join(json.dumps({"prompt": t, "id": f"p{i}"}) for i, t in enumerate(TEXTS)), encoding="utf-8")
    argv = ["study", study, "--model", str(tiny_dirs["gpt_neox"]), "--prompts", str(pf), "--max-prompts", "3",
            "--max-tokens", "16", *extra]
    real = summary.headline
    sentinel = {"the headline": {"value": 4242.5, "lo": 4141.5, "hi": 4343.5, "n": 3}}
    monkeypatch.setattr(summary, "headline", lambda result: sentinel)
    assert _run([*argv, "--out", str(tmp_path / "patched")]) == 0
    marker = json.loads((tmp_path / "patched" / f"{study}.result.json").read_text())
    assert marker["summaries"] == sentinel
    html = sections()[study](tmp_path / "patched")[1]
    assert "4.24e+03 [4.14e+03, 4.34e+03]" in html
    monkeypatch.setattr(summary, "headline", real)
    assert _run([*argv, "--out", str(tmp_path / "real")]) == 0
    written = json.loads((tmp_path / "real" / f"{study}.result.json").read_text())["summaries"]
    recomputed = real(Result.load(tmp_path / "real", study))
    assert written and json.loads(json.dumps(recomputed)) == written
