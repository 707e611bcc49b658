"""The feature index and the labels: values against an independent re-encode, densities against a direct count,
the shipped index against fresh captures, labels through the file (and an unwritable directory)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import polars as pl
import pytest
import torch

import trajscope as ts
from trajscope import positions
from trajscope.cli import main
from trajscope.model import sample_data_dir
from trajscope.prompts import read_prompts
from trajscope.features.index import (DENSITY_FILE, EXAMPLES_FILE, INFO_FILE, FeatureIndex, IndexSettings,
                                 build_index)
from trajscope.features.labels import LABELS_FILE, FeatureLabels
from trajscope.sae.model import SAE

SAE_DIR = sample_data_dir() / "saes" / "layer3-prefill-only"
PROMPTS = sample_data_dir() / "prompts" / "heldout_code.jsonl"


def encode_by_hand(sae: SAE, x: torch.Tensor) -> np.ndarray:
    """TopK SAE encoding written out from the weights (not through ``SAE.encode``): ``[n, d_sae]``."""
    assert sae.cfg.architecture == "topk" and sae.cfg.normalize_activations == "none"
    h = (x.double() - sae.b_dec.double()) @ sae.W_enc.double() + sae.b_enc.double()
    out = np.zeros(h.shape)
    hn = h.numpy()
    top = np.argsort(-hn, axis=1)[:, : sae.cfg.k]
    rows = np.arange(h.shape[0])[:, None]
    out[rows, top] = np.maximum(hn[rows, top], 0)
    return out


@pytest.fixture(scope="module")
def sae() -> SAE:
    return SAE.load(str(SAE_DIR))


@pytest.fixture(scope="module")
def small(sample_model, sae):
    items = read_prompts(PROMPTS)[:3]
    settings = IndexSettings(prompts=str(PROMPTS), n_prompts=3, max_new_tokens=6, top_n=4, context=5)
    index = build_index(sample_model, sae, items, settings)
    runs = [ts.capture(sample_model, it["prompt"], max_new_tokens=6, residual_layers=[3]) for it in items]
    acts = [encode_by_hand(sae, r.residual(3).float()) for r in runs]
    return items, index, runs, acts


def test_top_contexts_equal_an_independent_reencode(small):
    items, index, runs, acts = small
    by_id = {str(it["id"]): i for i, it in enumerate(items)}
    ex = index.examples
    assert len(ex) and ex["rank"].max() == 3 and ex.group_by("feature").len()["len"].max() == 4
    for r in ex.sample(min(200, len(ex)), seed=0).iter_rows(named=True):
        i = by_id[r["prompt_id"]]
        traj, a = runs[i], acts[i]
        assert r["value"] == pytest.approx(a[r["pos"], r["feature"]], rel=1e-4, abs=1e-5)
        texts = traj.tokens.sort("pos")["text"].to_list()
        assert r["token"] == texts[r["pos"]] and r["left"] == texts[max(0, r["pos"] - 5):r["pos"]]
        assert r["phase"] == positions.phase(r["pos"], traj.prompt_len)
        assert r["step"] == positions.query_step(r["pos"], traj.prompt_len)
    # rank 0 is the feature's maximum over every position of every prompt
    best = np.concatenate(acts).max(0)
    top = ex.filter(pl.col("rank") == 0)
    np.testing.assert_allclose(top["value"].to_numpy(), best[top["feature"].to_numpy()], rtol=1e-4, atol=1e-5)
    assert set(top["feature"].to_list()) == set(np.flatnonzero(best > 0).tolist())


def test_density_equals_a_direct_count(small):
    _, index, runs, acts = small
    pre = sum((a[: r.prompt_len] > 0).sum(0) for r, a in zip(runs, acts))
    dec = sum((a[r.prompt_len:] > 0).sum(0) for r, a in zip(runs, acts))
    n_pre = sum(r.prompt_len for r in runs)
    n_dec = sum(a.shape[0] - r.prompt_len for r, a in zip(runs, acts))
    d = index.density.sort("feature")
    assert len(d) == 1024 and d["n_prefill"][0] == n_pre and d["n_decode"][0] == n_dec and n_dec > 0
    np.testing.assert_array_equal(d["active_prefill"].to_numpy(), pre)
    np.testing.assert_array_equal(d["active_decode"].to_numpy(), dec)
    np.testing.assert_allclose(d["density_decode"].to_numpy(), dec / n_dec)
    assert index.density_of(7)["active_prefill"] == pre[7]


def test_index_round_trips_through_its_files(small, tmp_path):
    index = small[1]
    index.save(tmp_path)
    back = FeatureIndex.load(tmp_path)
    assert back.examples.equals(index.examples) and back.density.equals(index.density) and back.info == index.info
    assert FeatureIndex.load(tmp_path / "nothing") is None


def test_shipped_index_matches_fresh_captures(sample_model, sae):
    files = [SAE_DIR / n for n in (EXAMPLES_FILE, DENSITY_FILE, INFO_FILE)]
    assert sum(f.stat().st_size for f in files) < 1_000_000
    index = FeatureIndex.load(SAE_DIR)
    info = index.info
    assert (info["n_prompts"], info["max_new_tokens"], info["prompts"]) == (60, 64, "sample_data/prompts/heldout_code.jsonl")
    assert info["n_prefill"] > 0 and info["n_decode"] > 0 and set(index.examples["phase"]) == {"prefill", "decode"}
    assert index.examples["feature"].n_unique() == sae.cfg.d_sae
    prompts = {str(p["id"]): p["prompt"] for p in read_prompts(PROMPTS)}
    for pid in index.examples.filter(pl.col("phase") == "decode")["prompt_id"].unique(maintain_order=True)[:2]:
        traj = ts.capture(sample_model, prompts[pid], max_new_tokens=info["max_new_tokens"], residual_layers=[3])
        a = encode_by_hand(sae, traj.residual(3).float())
        rows = index.examples.filter(pl.col("prompt_id") == pid)
        np.testing.assert_allclose(rows["value"].to_numpy(), a[rows["pos"].to_numpy(), rows["feature"].to_numpy()],
                                   rtol=1e-3, atol=1e-4)


def test_cli_builds_an_index(tmp_path, capsys):
    assert main(["sae-index", "--sae", str(SAE_DIR), "--limit", "1", "--max-new-tokens", "3", "--top-n", "2",
                 "--out", str(tmp_path), "--quiet"]) == 0
    info = json.loads((tmp_path / INFO_FILE).read_text())
    assert (info["n_prompts"], info["max_new_tokens"], info["top_n"]) == (1, 3, 2)
    assert FeatureIndex.load(tmp_path).examples["rank"].max() == 1


def test_labels_round_trip_through_the_file(tmp_path):
    labels = FeatureLabels(tmp_path)
    assert labels.set(123, "  for-loop   header ") and labels.set(5, "x") and labels.set(5, "")
    assert json.loads((tmp_path / LABELS_FILE).read_text()) == {"123": "for-loop header"}
    again = FeatureLabels(tmp_path)
    assert again.get(123) == "for-loop header" and again.name(123) == "f123 · for-loop header" and again.name(5) == "f5"
    assert not list(tmp_path.glob("*.tmp"))


def test_unwritable_directory_keeps_labels_in_memory(tmp_path, monkeypatch):
    sae_dir = tmp_path / "sae"
    shutil.copytree(SAE_DIR, sae_dir, ignore=shutil.ignore_patterns("*.parquet", "*.csv"))
    FeatureLabels(sae_dir).set(1, "kept on disk")
    before = (sae_dir / LABELS_FILE).read_bytes()
    labels = FeatureLabels(sae_dir)

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("trajscope.io.tempfile.mkstemp", refuse)  # what a read-only directory does
    assert labels.set(2, "only in memory") is False
    assert "not writable" in labels.problem and str(sae_dir) in labels.problem
    assert labels.get(2) == "only in memory" and labels.get(1) == "kept on disk"
    assert (sae_dir / LABELS_FILE).read_bytes() == before
