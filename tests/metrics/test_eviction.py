"""Eviction policies on hand-made attention matrices, with selections worked out by hand."""

from __future__ import annotations

import pytest
import torch

from trajscope.errors import TrajscopeError
from trajscope.metrics import eviction as ev


def causal(rows: list[list[float]]) -> torch.Tensor:
    """A [1, 1, P, P] prefill attention matrix from rows (already causal and normalised by hand)."""
    return torch.tensor(rows, dtype=torch.float32)[None, None]


# P = 6. Row i attends over keys 0..i.
A = causal([
    [1.0, 0, 0, 0, 0, 0],
    [0.5, 0.5, 0, 0, 0, 0],
    [0.2, 0.7, 0.1, 0, 0, 0],
    [0.1, 0.1, 0.1, 0.7, 0, 0],
    [0.1, 0.6, 0.1, 0.1, 0.1, 0],
    [0.1, 0.1, 0.6, 0.1, 0.0, 0.1],
])


def kept(sel):
    return sel.kept_positions(0, 0)


def test_streamingllm_keeps_sinks_and_recent():
    # B = 5: sinks 0..3 and the 1 most recent (5)
    assert kept(ev.select("streamingllm", A, 5, window=1)) == [0, 1, 2, 3, 5]
    # B = 0.5 of 6 = 3 ≤ 4 sinks: the reference code refuses a budget that is all sinks
    with pytest.raises(TrajscopeError, match="not larger than the 4 attention sinks"):
        ev.select("streamingllm", A, 0.5, window=1)


def test_h2o_accumulated_attention_plus_recent():
    # column sums over all 6 prompt queries: key0 2.0, key1 2.0, key2 0.9, key3 0.9, key4 0.1, key5 0.1
    # recent w = 1 → key 5; budget 3 → 2 heavy hitters among 0..4: keys 0 and 1 (tie 0 = 1 → both)
    assert kept(ev.select("h2o", A, 3, window=1)) == [0, 1, 5]
    # budget 4: next heavy hitter ties key2 = key3 = 0.9 → lower position, key 2
    assert kept(ev.select("h2o", A, 4, window=1)) == [0, 1, 2, 5]


def test_snapkv_window_scores_with_pooling():
    # w = 2: queries 4 and 5 score keys 0..3: s = [0.2, 0.7, 0.7, 0.2]
    # window keys 4, 5 score 0 before pooling; avg-pool k=5 with zero padding counted (÷ 5 everywhere):
    #   j0: (0.2+0.7+0.7)/5 = 0.32; j1: 1.8/5 = 0.36; j2: 1.8/5 = 0.36; j3: 1.6/5 = 0.32
    # B = 3 → window {4, 5} + the top one: j1 = j2 tie → the lower position, key 1.
    assert kept(ev.select("snapkv", A, 3, window=2)) == [1, 4, 5]
    # B = 4: keys 1 and 2 (0.36 each) beat 0 and 3 (0.32)
    assert kept(ev.select("snapkv", A, 4, window=2)) == [1, 2, 4, 5]
    # pooling matters: one query (w = 1) with an isolated peak at key 0 and a cluster at keys 3-5
    C = causal([[1, 0, 0, 0, 0, 0, 0, 0]] * 7 + [[.4, 0, 0, .2, .2, .2, 0, 0]])
    # s = [.4, 0, 0, .2, .2, .2, 0]; pooled /5: j0 .08, j1 .12, j2 .16, j3 .12, j4 .12, j5 .08, j6 .08
    assert kept(ev.select("snapkv", C, 2, window=1)) == [2, 7]
    raw = ev._select_scored(C[0, :, 7:].sum(1), 8, 2, 1, per_head=True, pool=None)
    assert torch.nonzero(raw[0]).reshape(-1).tolist() == [0, 7]


def test_pyramid_budget_schedule_by_hand():
    # B=10, L=4, β=5: from 2B − B/β = 18 down to B/β = 2 in steps of 16/3: 18, 12.67, 7.33, 2 → 18, 13, 7, 2
    assert ev.pyramid_budgets(10, 4, beta=5) == [18, 13, 7, 2]
    assert sum(ev.pyramid_budgets(7, 6)) == 42 and ev.pyramid_budgets(3, 1) == [3]
    # B = 3, w = 1: c = 2 outside the window, β = 2 → c/β = 1, 2c − c/β = 3 → budgets 1 + 3 = 4 and 1 + 1 = 2
    sel = ev.select("pyramidkv", A.expand(2, 1, 6, 6), 3, window=1, beta=2, schedule="paper")
    assert sel.mask[0, 0].sum() == 4 and sel.mask[1, 0].sum() == 2 and sel.budget_tokens == 3


def test_per_head_versus_shared():
    two = torch.cat([A, causal([[1, 0, 0, 0, 0, 0], [0.5, 0.5, 0, 0, 0, 0], [0.1, 0.1, 0.8, 0, 0, 0],
                                [0.1, 0.1, 0.1, 0.7, 0, 0], [0.1, 0.1, 0.1, 0.6, 0.1, 0],
                                [0.0, 0.0, 0.0, 0.0, 0.9, 0.1]])], dim=1)  # head 1's last query looks at key 4
    # w = 1: head 0 pools [.1, .1, .6, .1, 0] → key 1 (.18, ties key 2); head 1 pools [0, 0, 0, 0, .9] → key 2
    per = ev.select("snapkv", two, 2, window=1, per_head=True)
    shared = ev.select("snapkv", two, 2, window=1, per_head=False)
    assert per.kept_positions(0, 0) != per.kept_positions(0, 1)
    assert shared.kept_positions(0, 0) == shared.kept_positions(0, 1)


def test_query_scored_policies_and_costs():
    decode = torch.zeros(1, 2, 1, 8)  # two decode steps over 6 prompt keys + 2 generated
    decode[0, 0, 0, [1, 6]] = torch.tensor([0.6, 0.4])
    decode[0, 1, 0, [3, 7]] = torch.tensor([0.9, 0.1])
    orc = ev.select("oracle", A, 3, window=1, query_rows=decode)
    assert 5 in kept(orc) and {1, 3} & set(kept(orc))
    full = ev.select("snapkv", A, 1.0, window=2)
    costs = ev.step_costs(full, decode, 6, k=2)
    assert costs["recall_at_k"].to_list() == [1.0, 1.0] and costs["evicted_mass"].to_list() == [0.0, 0.0]
    # SnapKV, w = 1, B = 2: row 5 pooled /5 → j1 = j2 = .18 (tie: key 1) → keeps {1, 5}
    few = ev.step_costs(ev.select("snapkv", A, 2, window=1), decode, 6, k=1)
    assert few["recall_at_k"].to_list() == [1.0, 0.0]
    assert few["evicted_mass"].to_list() == pytest.approx([0.0, 0.9])
    assert few["step"].to_list() == [1, 2]
    km = ev.key_mask(ev.select("snapkv", A, 2, window=1), 8)
    assert km.shape == (1, 1, 8) and km[0, 0].tolist() == [False, True, False, False, False, True, True, True]


@pytest.mark.parametrize("budget, fragment", [(0, "not a count"), (-0.5, "not a fraction"), (1.5, "not a fraction"),
                                              (True, "neither")])
def test_bad_budgets(budget, fragment):
    with pytest.raises(TrajscopeError, match=fragment):
        ev.select("snapkv", A, budget, window=1)


def test_clear_errors():
    with pytest.raises(TrajscopeError, match="longer than the prompt"):
        ev.select("snapkv", A, 3, window=7)
    with pytest.raises(TrajscopeError, match="Unknown eviction policy 'lru'"):
        ev.select("lru", A, 3)
    with pytest.raises(TrajscopeError, match="query_rows"):
        ev.select("oracle", A, 3, window=1)
    with pytest.raises(TrajscopeError, match="not larger than the window"):
        ev.select("snapkv", A, 2, window=2)
    with pytest.raises(TrajscopeError, match="schedule 'linear'"):
        ev.select("pyramidkv", A, 3, window=1, schedule="linear")
    with pytest.raises(TrajscopeError, match="reads the last 6 prefill query rows"):
        ev.select("h2o", A[:, :, 4:], 3, window=1)
