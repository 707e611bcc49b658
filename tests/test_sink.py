"""Position 0 (the attention sink) and massive activations: one rule each, used everywhere."""

from __future__ import annotations

import polars as pl
import torch

from trajscope import positions
from trajscope.metrics.residual_stats import ACT_FIELDS, MASSIVE_ABS, MASSIVE_RATIO, residual_stats
from trajscope.metrics.profile_drift import profile_drift_by_group


def test_the_sink_treatment_is_one_named_choice():
    assert positions.SINK_POS == 0 and positions.SKIP_SINK is True
    assert positions.first_reference_pos() == 1 and positions.first_reference_pos(False) == 0
    meta = positions.sink_meta()
    assert meta == {"sink_pos": 0, "sink_excluded": True, "sink_rule": positions.SINK_RULE}
    assert positions.sink_meta(False)["sink_excluded"] is False


def test_massive_rule_needs_both_bars():
    n = ACT_FIELDS.index("n_massive")
    x = torch.full((1000,), 0.05)
    x[0] = MASSIVE_ABS + 1  # > 100 and > 1000 × median 0.05 = 50
    assert residual_stats(x)[n] == 1
    y = torch.full((1000,), 0.2)
    y[0] = MASSIVE_ABS + 1  # > 100 but not > 1000 × 0.2 = 200
    assert residual_stats(y)[n] == 0
    z = torch.full((1000,), 0.01)
    z[0] = 99.0  # > 1000 × 0.01 but not > 100
    assert residual_stats(z)[n] == 0
    assert MASSIVE_RATIO == 1000.0
    # a layer reference median (profiles) replaces the vector's own
    assert residual_stats(y, median_abs=0.05)[n] == 1


def test_profile_drift_leaves_the_sink_out(tiny_models):
    import trajscope as ts
    from trajscope.studies.drift.build import build_profile

    model = tiny_models["llama"]
    prof = build_profile(model, ["x = 1\ny = 2", "def f(a):\n    return a"], fpr=0.1, progress=False)
    assert prof.info["sink_excluded"] is True
    traj = ts.capture(model, "import os\nprint(os)", max_new_tokens=4, stop_at_eos=False, residual_layers="all")
    kept = profile_drift_by_group([traj], prof, by="depth_band")
    full = profile_drift_by_group([traj], prof, by="depth_band", skip_first=False)
    pre = pl.col("depth_band") == "prefill"
    assert (full.filter(pre)["n_positions"] - kept.filter(pre)["n_positions"]).to_list() == [1] * model.n_layers


def test_pooled_median_counts_a_sink_vector_that_its_own_median_hides():
    n = ACT_FIELDS.index("n_massive")
    x = torch.full((8, 64), 0.5)
    x[0] = 30.0  # a sink row: every value large, so its own median is large too
    x[0, 0] = 25_000.0
    assert residual_stats(x)[0, n] == 0  # 25,000 < 1000 × 30
    pooled = residual_stats(x, pooled=True)  # layer median 0.5: 25,000 > 500
    assert pooled[0, n] == 1 and pooled[1:, n].sum() == 0
