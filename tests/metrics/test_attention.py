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


def test_sharp_jumps_are_the_run_outliers_only():
    """Every decode step 'jumps' under the fixed 0.5 rule (a noisy head); only the real switch is sharp."""
    # top-8 sets that keep o of 8 keys per step: J = o / (16 − o): o=5 -> 0.455, o=4 -> 0.333, o=0 -> 0
    keeps = [5, 4, 5, 4, 5, 5, 4, 5, 0, 5, 4, 5]
    tops, fresh = [list(range(8))], 100
    for o in keeps:
        new = list(range(fresh, fresh + 8 - o))
        fresh += 8 - o
        tops.append(tops[-1][8 - o:] + new)
    tele = step_telemetry(table({(0, 0): tops}))
    J = tele["jaccard"].to_list()
    assert J[1:] == pytest.approx([o / (16 - o) for o in keeps])
    assert tele["jump"].to_list() == [False] + [True] * len(keeps)  # the fixed rule flags every decode step
    # by hand: median 0.455, MAD 0 -> floored at 0.05; cut-off 0.455 − 3 × 0.05 = 0.305: only J = 0 is below
    assert tele["sharp_jump"].to_list() == [False] * 9 + [True] + [False] * 3


def test_position_drift_is_zscore_against_prefill():
    acts = pl.DataFrame({"pos": [0, 1, 2, 3, 0, 1, 2, 3], "layer": [0] * 4 + [1] * 4,
                         "phase": ["prefill", "prefill", "prefill", "decode"] * 2,
                         "norm": [1.0, 2.0, 3.0, 6.0, 10.0, 10.0, 10.0, 11.0]})
    d0 = position_zscore(acts, layer=0)
    assert d0["drift"].to_list() == pytest.approx([-1.0, 0.0, 1.0, 4.0])  # mean 2, std 1
    d1 = position_zscore(acts, layer=1)  # zero spread in prefill -> undefined
    assert d1["drift"].to_list() == [None] * 4
