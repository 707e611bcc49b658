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
    from trajscope.studies.drift.figures import HeatmapFigure

    drift, P = _drift()
    data = dp.heatmap_data(drift, P)
    lo, hi = data["clim"]
    assert abs((lo + hi) / 2 - 1) < 1e-9 and hi < 3  # the sink (75) would make it 0–151
    assert data["x_min"] == 1 - P + 1 and data["sink_max"] == 75.0  # the step axis: x = pos − P + 1; pos 0 apart
    fig = HeatmapFigure()
    fig.show(data)
    assert "pos 0 (attention sink) left out" in fig.figure.title.text
    ticks = fig.ticker.ticks
    assert len(ticks) <= 16 and ticks[-1] == 29  # 30 labels would overlap
    assert fig.figure.height >= 14 * 30


def test_drift_curves_keep_a_legend_that_fits():
    from trajscope.studies.drift.figures import CurvesFigure

    drift, P = _drift()
    data = dp.curves_data(drift, {}, P)
    assert 1 < len(data["series"]) <= len(ap.LAYER_COLORS) and data["n_layers"] == 30
    fig = CurvesFigure()
    fig.show(data)
    assert sum(item.visible for item in fig.legend.items) == len(data["series"])
    assert f"({len(data['series'])} of 30 layers" in fig.figure.title.text


def test_robust_clim_ignores_a_few_extremes():
    v = np.r_[np.linspace(0, 1, 1000), 500.0]
    assert ap.robust_clim(v)[1] < 2
    assert ap.robust_clim(np.array([np.nan])) == (0.0, 1.0)


def test_grid_figure_of_30_layers_is_tall_enough_and_labels_do_not_crowd():
    from trajscope.ui.attention_figures import HeadGridFigure

    q = pl.DataFrame({"step": [0] * 270, "layer": np.repeat(np.arange(30), 9), "head": np.tile(np.arange(9), 30),
                      "entropy_norm": np.linspace(0, 1, 270)})
    fig = HeadGridFigure()
    fig.show(plots.head_grid_data(q, 0, "entropy_norm"))
    assert fig.figure.height >= 30 * 16 and len(fig.yticker.ticks) <= 16 and fig.xticker.ticks == list(range(9))
    assert np.asarray(fig.source.data["image"][0])[29, 8] == 1.0  # the last layer's last head, bottom right
