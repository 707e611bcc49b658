"""Colour scales and axes that stay readable on a 30-layer model with an attention sink."""

import numpy as np
import polars as pl

from trajscope.studies.drift import plots as dp
from trajscope.ui import analysis_plots as ap
from trajscope.ui import plots


def _drift(n_layers=30, n_pos=40, prompt_len=10, sink=75.0):
    rng = np.random.default_rng(0)
    pos, layer = np.meshgrid(np.arange(n_pos), np.arange(n_layers))
    score = 1 + 0.3 * rng.standard_normal(pos.shape)
    score[:, 0] = sink
    return pl.DataFrame({"pos": pos.ravel(), "layer": layer.ravel(), "score": score.ravel()}), prompt_len


def test_drift_scale_is_centred_at_one_and_not_set_by_the_sink():
    drift, P = _drift()
    hm = dp.drift_heatmap(drift, P).get(0)
    lo, hi = hm.opts.get().kwargs["clim"]
    assert abs((lo + hi) / 2 - 1) < 1e-9 and hi < 3  # the sink (75) would make it 0–151
    x_of_pos0 = 0 - P + 1  # the step axis: x = pos − P + 1
    assert hm.bounds.lbrt()[0] == x_of_pos0 + 0.5 and "pos 0 (attention sink) left out" in hm.opts.get().kwargs["title"]
    ticks = hm.opts.get().kwargs["yticks"]
    assert len(ticks) <= 16 and ticks[-1] == 29  # 30 labels would overlap
    assert hm.opts.get().kwargs["height"] >= 14 * 30


def test_drift_curves_keep_a_legend_that_fits():
    drift, P = _drift()
    curves = [e for e in dp.drift_curves(drift, {}, P).values() if e.label]
    assert 1 < len(curves) <= len(ap.LAYER_COLORS)


def test_robust_clim_ignores_a_few_extremes():
    v = np.r_[np.linspace(0, 1, 1000), 500.0]
    assert ap.robust_clim(v)[1] < 2
    assert ap.robust_clim(np.array([np.nan])) == (0.0, 1.0)


def test_head_grid_of_30_layers_is_tall_enough_and_labels_do_not_crowd():
    q = pl.DataFrame({"step": [0] * 270, "layer": np.repeat(np.arange(30), 9), "head": np.tile(np.arange(9), 30),
                      "entropy_norm": np.linspace(0, 1, 270)})
    opts = plots.head_grid(q, 0, "entropy_norm").opts.get().kwargs
    assert opts["height"] >= 30 * 16 and len(opts["yticks"]) <= 16 and opts["xticks"] == list(range(9))
