"""SAE reconstruction metrics recomputed by hand (NumPy) on small fixed tensors."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch

from trajscope.metrics import sae_eval as ev

X = np.array([[1.0, 2.0, 0.0], [3.0, -1.0, 2.0], [0.0, 0.5, 1.0], [2.0, 2.0, 2.0]])
X_HAT = np.array([[1.5, 2.0, 0.0], [2.0, -1.0, 1.0], [0.0, 0.0, 1.0], [2.0, 3.0, 2.0]])
F = np.array([[0.0, 1.0, 0.0, 0.0, 2.0],
              [0.5, 0.0, 0.0, 0.0, 1.0],
              [0.0, 0.0, 0.0, 0.0, 3.0],
              [1.0, 1.0, 0.0, 0.0, 0.2]])


def test_reconstruction_stats_match_hand_computation():
    got = ev.reconstruction_stats(torch.tensor(X), torch.tensor(X_HAT), torch.tensor(F))
    # by hand: squared errors per row 0.25, 2, 0.25, 1 -> 3.5
    sq = 0.25 + 2.0 + 0.25 + 1.0
    mean = X.mean(0)
    centred = sum(float(((row - mean) ** 2).sum()) for row in X)
    total = float((X ** 2).sum())
    assert got["n"] == 4
    assert got["fvu"] == pytest.approx(sq / centred)
    assert got["fvu_uncentred"] == pytest.approx(sq / total)
    assert got["mse"] == pytest.approx(sq / 12)
    cos = [float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(X, X_HAT)]
    assert got["cos"] == pytest.approx(np.mean(cos))
    assert got["l0"] == pytest.approx((2 + 2 + 1 + 3) / 4)
    # densities: f0 2/4, f1 2/4, f2 0, f3 0, f4 4/4 -> dead 2/5, dense (> 1%) 3/5
    assert got["dead"] == pytest.approx(0.4) and got["dense"] == pytest.approx(0.6)


def test_fvu_is_zero_for_perfect_and_one_for_the_mean():
    x = torch.tensor(X)
    f = torch.tensor(F)
    assert ev.reconstruction_stats(x, x.clone(), f)["fvu"] == 0.0
    assert ev.reconstruction_stats(x, x.mean(0).expand_as(x), f)["fvu"] == pytest.approx(1.0)


def test_empty_set_is_nan_not_an_error():
    got = ev.reconstruction_stats(torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0, 5))
    assert got["n"] == 0 and math.isnan(got["fvu"])


def test_bands():
    assert [ev.depth_band(s) for s in (0, 1, 4, 5, 16, 17, 64, 65, 256, 300)] == [
        "prefill", "1-4", "1-4", "5-16", "5-16", "17-64", "17-64", "65-256", "65-256", "257+"]
    assert [ev.entropy_band(h) for h in (0.0, 0.49, 0.5, 1.49, 1.5, 2.99, 3.0, 9.0)] == [
        "0-0.5", "0-0.5", "0.5-1.5", "0.5-1.5", "1.5-3", "1.5-3", "3+", "3+"]
    assert ev.entropy_band(None) is None


def test_reconstruction_table_groups_and_side_by_side():
    rows = pl.DataFrame({"phase": ["prefill", "prefill", "decode", "decode"], "step": [0, 0, 1, 8],
                         "entropy": [0.1, 2.0, 0.2, 4.0]}).with_columns(
        pl.col("step").map_elements(ev.depth_band, return_dtype=pl.String).alias("depth_band"),
        pl.col("entropy").map_elements(ev.entropy_band, return_dtype=pl.String).alias("entropy_band"))
    x, xh, f = torch.tensor(X), torch.tensor(X_HAT), torch.tensor(F)
    splice = pl.DataFrame({"kl": [0.1, 0.3, 0.5, None], "ce_increase": [0.0, 0.2, 1.0, None]})
    t = ev.reconstruction_table(rows, x, {"a": (xh, f), "b": (x.clone(), f)}, {"a": splice})
    pre = t.filter((pl.col("sae") == "a") & (pl.col("group") == "prefill")).row(0, named=True)
    want = ev.reconstruction_stats(x[:2], xh[:2], f[:2])
    assert pre["n"] == 2 and pre["fvu"] == pytest.approx(want["fvu"]) and pre["kl"] == pytest.approx(0.2)
    step8 = t.filter((pl.col("sae") == "a") & (pl.col("group") == "8")).row(0, named=True)
    assert step8["n"] == 1 and math.isnan(step8["kl"])  # null splice value is skipped, none left
    assert t.filter((pl.col("sae") == "b"))["fvu_uncentred"].max() == 0.0
    groups = t.filter(pl.col("sae") == "a").select("kind", "group").rows()
    assert ("entropy_band", "decode H 3+") in groups and ("depth_band", "5-16") in groups
    wide = ev.side_by_side(t, ["fvu", "kl"])
    assert wide.columns == ["kind", "group", "n", "fvu[a]", "fvu[b]", "kl[a]", "kl[b]"]
    ratio = ev.ratio_to_prefill(t, "fvu_uncentred").filter((pl.col("sae") == "a") & (pl.col("group") == "prefill"))
    assert ratio["fvu_uncentred_vs_prefill"][0] == pytest.approx(1.0)


def test_source_groups_split_greedy_and_sampled_decode_rows():
    rows = pl.DataFrame({"phase": ["prefill", "decode", "decode", "decode"], "step": [0, 1, 1, 2],
                         "source": ["greedy", "greedy", "sample-0", "sample-0"],
                         "depth_band": ["prefill", "1-4", "1-4", "1-4"], "entropy_band": ["3+"] * 4})
    x = torch.tensor(X)
    t = ev.reconstruction_table(rows, x, {"a": (torch.tensor(X_HAT), torch.tensor(F))})
    src = t.filter(pl.col("kind") == "source")
    assert src["group"].to_list() == ["decode greedy", "decode sample-0"] and src["n"].to_list() == [1, 2]


def test_position_control_groups():
    rows = pl.DataFrame({"phase": ["prefill"] * 3 + ["decode"], "step": [0, 0, 0, 1], "pos": [0, 15, 16, 17],
                         "depth_band": ["prefill"] * 3 + ["1-4"], "entropy_band": ["3+"] * 4})
    t = ev.reconstruction_table(rows, torch.tensor(X), {"a": (torch.tensor(X_HAT), torch.tensor(F))})
    pos = t.filter(pl.col("kind") == "position")
    assert pos["group"].to_list() == ["prefill pos<16", "prefill pos>=16"] and pos["n"].to_list() == [2, 1]
