"""Phase jumps and per-step telemetry on hand-made attention tables (checked against hand-counted sets)."""

import polars as pl
import pytest

from trajscope.metrics.attention import region_jumps, step_queries, step_telemetry
from trajscope.metrics.overlap import jaccard
from trajscope.metrics.position_zscore import position_zscore


def table(tops: dict[tuple[int, int], list[list[int]]], P: int = 3) -> pl.DataFrame:
    """An attention table: for each (layer, head), a list of top_pos per step (step 0 = prompt rows)."""
    rows = []
    for (layer, head), per_step in tops.items():
        for step, top in enumerate(per_step):
            poss = list(range(P)) if step == 0 else [P + step - 1]
            for pos in poss:
                # prompt rows other than the last get a decoy top set that must be ignored
                t = top if pos == (P - 1 if step == 0 else pos) else [99]
                rows.append({"step": step, "pos": pos, "layer": layer, "head": head, "entropy": float(step),
                             "entropy_norm": 0.1 * step, "prefix_mass": 1.0 - 0.1 * step,
                             "generated_mass": 0.1 * step, "sink_mass": 0.5, "sink4_mass": 0.6, "self_mass": 0.2,
                             "top_pos": t, "top_w": [1.0 / len(t)] * len(t)})
    return pl.DataFrame(rows, schema_overrides={"step": pl.Int32, "pos": pl.Int32, "layer": pl.Int16,
                                                "head": pl.Int16, "top_pos": pl.List(pl.Int32)})


def test_one_jaccard():
    """Phase jumps (Polars list ops) agree with the one set Jaccard of metrics.overlap."""
    from trajscope.metrics import attention as am

    assert not hasattr(am, "jaccard")
    assert jaccard([1, 2, 3], [2, 3, 4]) == pytest.approx(2 / 4)


def test_step_queries_uses_last_prompt_row():
    q = step_queries(table({(0, 0): [[0, 1], [1, 2], [2, 3]]}))
    assert q["step"].to_list() == [0, 1, 2]
    assert q["pos"].to_list() == [2, 3, 4]
    assert q["top_pos"].to_list()[0] == [0, 1]


def test_region_jumps_thresholds():
    # step1 vs step0: {0,1,2,3} vs {0,1,2,4} -> 3/5 = 0.6 (no jump); step2: {5,6,7,8} vs step1 -> 0 (jump)
    # step3: {5,6,7,9} vs {5,6,7,8} -> 3/5 (no jump); step4: {5,6} vs {5,6,7,9} -> 0.5 (not < 0.5)
    df = table({(0, 0): [[0, 1, 2, 3], [0, 1, 2, 4], [5, 6, 7, 8], [5, 6, 7, 9], [5, 6]]})
    j = region_jumps(df)
    assert j["jaccard"].to_list()[0] is None
    assert j["jaccard"].to_list()[1:] == pytest.approx([0.6, 0.0, 0.6, 0.5])
    assert j["jump"].to_list() == [False, False, True, False, False]
    assert region_jumps(df, threshold=0.55)["jump"].to_list() == [False, False, True, False, True]


def test_step_telemetry_selection_and_majority():
    jumpy = [[0], [1], [2], [3]]       # every decode step jumps
    steady = [[0], [0], [0], [0]]      # never jumps
    df = table({(0, 0): jumpy, (0, 1): steady, (1, 0): jumpy, (1, 1): jumpy})
    head = step_telemetry(df, layer=0, head=1)
    assert head["jump"].to_list() == [False] * 4
    layer0 = step_telemetry(df, layer=0)  # one of two heads jumps: rate 0.5 -> flagged
    assert layer0["jump_rate"].to_list()[1:] == pytest.approx([0.5] * 3)
    assert layer0["jump"].to_list() == [False, True, True, True]
    everything = step_telemetry(df)
    assert everything["jump_rate"].to_list()[1:] == pytest.approx([0.75] * 3)
    assert everything["prefix_mass"].to_list() == pytest.approx([1.0, 0.9, 0.8, 0.7])


def queries_table(top_of, P: int, n_steps: int, heads: int = 1) -> pl.DataFrame:
    """An attention table whose every prompt query (step 0) and decode query has ``top_of(pos, head)`` as its
    top set: prefill and decode drawn from the same process when ``top_of`` does not look at the phase."""
    rows = []
    for head in range(heads):
        for pos in range(P + n_steps):
            step = 0 if pos < P else pos - P + 1
            rows.append({"step": step, "pos": pos, "layer": 0, "head": head, "top_pos": top_of(pos, head)})
    base = pl.DataFrame(rows, schema_overrides={"step": pl.Int32, "pos": pl.Int32, "layer": pl.Int16,
                                                "head": pl.Int16, "top_pos": pl.List(pl.Int32)})
    return base.with_columns(*[pl.lit(0.5).alias(f) for f in ("entropy", "entropy_norm", "prefix_mass",
                                                              "generated_mass", "sink_mass", "sink4_mass",
                                                              "self_mass")])


def test_sharp_jump_fires_at_its_stated_rate_on_the_null():
    """Prefill and decode queries from one process (sink + 2 recent keys + 5 random keys of the last 20), 8 heads:
    decode is the null, so sharp jumps fire on decode at the rate stated from prefill, within sampling error."""
    import numpy as np

    rng = np.random.default_rng(0)
    tops = {}

    def top_of(pos, head):
        if (pos, head) not in tops:
            recent = {max(pos - 1, 0), max(pos - 2, 0)}
            window = np.arange(max(pos - 20, 0), max(pos, 1))
            extra = rng.choice(window, size=min(5, len(window)), replace=False)
            tops[pos, head] = sorted({0} | recent | {int(x) for x in extra})
        return tops[pos, head]

    P, n = 400, 800
    tele = step_telemetry(queries_table(top_of, P, n, heads=8), layer=0)
    rate, n_null = tele["sharp_null_rate"][0], tele["sharp_null_n"][0]
    assert n_null == P - 1 and 0.02 < rate <= 0.05 and tele["sharp_cutoff"][0] > 0
    fired = tele.filter(pl.col("step") >= 1)["sharp_jump"].mean()
    sd = (rate * (1 - rate) * (1 / n + 1 / n_null)) ** 0.5
    assert abs(fired - rate) < 4 * sd, (fired, rate, sd)
    assert tele.filter(pl.col("step") >= 1)["jump"].mean() > 0.5  # the fixed rule fires on most steps


def test_a_planted_jump_fires_and_nothing_else_does():
    """Sink + 3 recent keys + a region of 4 keys; at decode step 20 the region moves: J drops from 7/9 to 3/13."""
    P, switch = 60, 20

    def top_of(pos, head):
        region = range(50, 54) if pos >= P + switch - 1 else range(10, 14)
        return sorted({0, pos - 1, pos - 2, pos - 3} | set(region))

    tele = step_telemetry(queries_table(top_of, P, 40))
    assert tele["jaccard"][switch] == pytest.approx(3 / 13) and tele["jaccard"][switch + 1] == pytest.approx(7 / 9)
    assert tele.filter(pl.col("sharp_jump"))["step"].to_list() == [switch]
    assert tele["sharp_null_rate"][0] == 0.0 and tele["sharp_null_n"][0] == P - 1


def test_too_few_prompt_rows_give_no_null_and_no_sharp_jump():
    tele = step_telemetry(table({(0, 0): [[0, 1], [5, 6], [7, 8]]}))
    assert tele["jump"].to_list() == [False, True, True]
    assert tele["sharp_jump"].to_list() == [False] * 3 and tele["sharp_cutoff"].is_null().all()
    assert tele["sharp_null_n"][0] == 2  # three prompt rows: two pairs, fewer than MIN_NULL_PAIRS


def test_null_cutoff_is_the_largest_within_alpha():
    import numpy as np

    from trajscope.metrics.attention import null_cutoff

    J = np.array([0.0, 0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    assert null_cutoff(J, np.ones(10, bool), 0.1) == (0.1, 0.1)  # J < 0.1: one of ten
    assert null_cutoff(J, np.ones(10, bool), 0.25) == (0.1, 0.1)  # 0.2 would fire on 3 of 10 > 0.25
    assert null_cutoff(J, np.ones(10, bool), 0.3) == (0.2, 0.3)
    jump = np.array([True] * 3 + [False] * 7)
    assert null_cutoff(J, jump, 0.3) == (np.inf, 0.3)  # only jumps count: at most 3 of 10 fire at any cut-off
    assert null_cutoff(J, np.zeros(10, bool), 0.05) == (np.inf, 0.0)  # never a jump on the null


def test_position_drift_is_zscore_against_prefill():
    acts = pl.DataFrame({"pos": [0, 1, 2, 3, 0, 1, 2, 3], "layer": [0] * 4 + [1] * 4,
                         "phase": ["prefill", "prefill", "prefill", "decode"] * 2,
                         "norm": [1.0, 2.0, 3.0, 6.0, 10.0, 10.0, 10.0, 11.0]})
    d0 = position_zscore(acts, layer=0)
    assert d0["drift"].to_list() == pytest.approx([-1.0, 0.0, 1.0, 4.0])  # mean 2, std 1
    d1 = position_zscore(acts, layer=1)  # zero spread in prefill -> undefined
    assert d1["drift"].to_list() == [None] * 4
