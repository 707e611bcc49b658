"""Steering: onset exactness, CAA, effect metrics against independent computations, clear errors."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest
import torch

import trajscope as ts
from tiny import hf_reference
from trajscope.metrics.steering import kl_divergence, step_effects
from trajscope.studies.steering.summary import decay_summary
from trajscope.steering import SteeringVector
from trajscope.studies.steering.sweep import steering_sweep

PROMPT = "def parse(text):\n    "


def strong(model, layer=1, k=4, scale=20.0, mode="add"):
    g = torch.Generator().manual_seed(1)
    return SteeringVector(layer=layer, direction=torch.randn(model.d_model, generator=g), strength=scale,
                          start_step=k, mode=mode)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("k", [1, 5])
def test_onset_is_exact(tiny_models, family, k):
    model = tiny_models[family]
    base = ts.capture(model, PROMPT, max_new_tokens=12, stop_at_eos=False, residual_layers=[1])
    st = ts.capture(model, PROMPT, max_new_tokens=12, stop_at_eos=False, residual_layers=[1],
                    steering=[strong(model, k=k)])
    P = base.prompt_len
    # steps 0..k-1 produce tokens P..P+k-1: identical; step k's token differs
    assert st.token_ids[: P + k] == base.token_ids[: P + k]
    assert st.token_ids[P + k] != base.token_ids[P + k]
    # residuals are untouched at every position computed before step k
    torch.testing.assert_close(st.residual(1)[: P + k - 1], base.residual(1)[: P + k - 1])
    assert not torch.allclose(st.residual(1)[P + k - 1], base.residual(1)[P + k - 1])
    assert st.meta["steering"][0]["start_step"] == k
    torch.testing.assert_close(st.tensors["steering.0"], strong(model, k=k).direction)


def test_forced_forward_reproduces_the_steered_run(tiny_models):
    model = tiny_models["qwen2"]
    vec = strong(model, k=3, scale=5.0)
    st = ts.capture(model, PROMPT, max_new_tokens=8, stop_at_eos=False, residual_layers=[1], steering=[vec])
    ff = model.forward(st.token_ids[:-1], prompt_len=st.prompt_len, steering=[vec], layers=[1])
    torch.testing.assert_close(ff.resid[1], st.residual(1), atol=1e-5, rtol=1e-4)
    lp = torch.log_softmax(ff.logits.double(), -1)
    ent = -(lp.exp() * lp).sum(-1).numpy()
    np.testing.assert_allclose(st.tokens["entropy"].to_numpy()[:-1], ent, atol=1e-4)


def test_clamp_sets_the_projection(tiny_models):
    model = tiny_models["llama"]
    vec = strong(model, k=2, scale=3.0, mode="clamp")
    st = ts.capture(model, PROMPT, max_new_tokens=6, stop_at_eos=False, residual_layers=[1], steering=[vec])
    proj = st.residual(1) @ vec.unit
    P = st.prompt_len
    np.testing.assert_allclose(proj[P + 1:].numpy(), 3.0, atol=1e-4)
    assert abs(float(proj[P]) - 3.0) > 1e-3  # step 1 (pos P) is before onset


def test_caa_equals_mean_difference_of_hf_hidden_states(tiny_models):
    model = tiny_models["llama"]
    pairs = [("x = 'a'", 'x = "a"'), ("name = 'b'", 'name = "b"'), ("s = ''", 's = ""')]
    vec = SteeringVector.from_contrast(model, pairs, layer=0, strength=2.0)
    hf = hf_reference(model)
    diffs = []
    for pos_text, neg_text in pairs:
        hs = []
        for text in (pos_text, neg_text):
            ids = model.tokenizer(text, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                hs.append(hf(ids, output_hidden_states=True).hidden_states[1][0, -1])
        diffs.append((hs[0] - hs[1]).numpy())
    np.testing.assert_allclose(vec.direction.numpy(), np.mean(diffs, axis=0), atol=1e-5)
    assert vec.layer == 0 and vec.strength == 2.0


def test_effect_metrics_match_numpy():
    rng = np.random.default_rng(0)
    T, V, D, P = 9, 11, 6, 4
    base_l, st_l = rng.normal(size=(T, V)), rng.normal(size=(T, V))
    rb, rs = rng.normal(size=(T, D)), rng.normal(size=(T, D))
    u = rng.normal(size=D)
    u /= np.linalg.norm(u)
    base_tok = list(range(T + 1))
    st_tok = base_tok[:6] + [99] * (T + 1 - 6)
    df = step_effects(torch.tensor(base_l), torch.tensor(st_l), torch.tensor(rb), torch.tensor(rs), torch.tensor(u),
                      base_tok, st_tok, P, targets=[2, 5])

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    p, q = softmax(base_l), softmax(st_l)
    kl = (p * (np.log(p) - np.log(q))).sum(-1)
    pos = np.arange(P - 1, T)
    np.testing.assert_allclose(df["kl_to_base"].to_numpy(), kl[pos], rtol=1e-10)
    np.testing.assert_allclose(df["projection"].to_numpy(), rs[pos] @ u, rtol=1e-10)
    np.testing.assert_allclose(df["target_logit_delta"].to_numpy(), (st_l - base_l)[pos][:, [2, 5]].mean(-1))
    assert df["step"].to_list() == list(range(T - P + 1))
    assert df["token_changed"].to_list() == [bool(base_tok[i + 1] != st_tok[i + 1]) for i in pos]
    assert float(kl_divergence(torch.tensor(base_l), torch.tensor(base_l)).abs().max()) < 1e-12


def test_decay_summary_half_life():
    kl = [1.0, 0.8, 0.6, 0.45, 0.3]
    steps = pl.DataFrame({"run_id": ["a"] * 7, "start_step": [2] * 7, "strength": [1.0] * 7,
                          "step": list(range(7)), "kl_to_base": [0.0, 0.0] + kl,
                          "token_changed": [False, False, True, True, False, False, False]})
    s = decay_summary(steps, window=3)
    row = s.row(0, named=True)
    # KL halves 3 steps after onset: outside the window of steps 2, 3, 4, so not within it
    assert row["onset_kl_mean"] == 1.0 and row["half_life_median"] is None and row["halved_frac"] == 0.0
    # equal window: steps 2, 3, 4 only (changed: True, True, False)
    assert row["effect_mean"] == pytest.approx(0.8) and row["changed_frac"] == pytest.approx(2 / 3)
    assert row["steps_counted"] == 3 and row["end_kl_mean"] == pytest.approx(0.6)
    row = decay_summary(steps, window=4).row(0, named=True)  # a window that holds step 5
    assert row["half_life_median"] == 3 and row["halved_frac"] == 1.0


def test_half_life_is_taken_over_the_same_window_for_every_depth():
    """Both depths fall the same way from onset and halve 5 steps after it; in runs of 10 steps k=1 has
    room for that, k=5 (steps 5..9) does not. Over an equal window neither halves: searching the rest of
    the run (issue 31) gave k=1 a half-life of 5 and k=5 none, a depth effect made by the window alone."""
    fall = [1.0, 0.9, 0.8, 0.7, 0.6, 0.4, 0.3, 0.2, 0.1]
    rows = []
    for pi in range(3):
        for k in (1, 5):
            for s in range(10):
                kl = fall[s - k] if k <= s < k + len(fall) else 0.0
                rows.append({"run_id": f"p{pi}", "prompt_idx": pi, "start_step": k, "strength": 1.0, "step": s,
                             "kl_to_base": kl, "token_changed": s >= k})
    for window in (3, 5):  # 5: every step k=5 has
        by = {r["start_step"]: r for r in decay_summary(pl.DataFrame(rows), window=window).iter_rows(named=True)}
        assert by[1]["half_life_median"] is None and by[5]["half_life_median"] is None, window
        assert by[1]["halved_frac"] == by[5]["halved_frac"] == 0.0
    wide = {r["start_step"]: r for r in decay_summary(pl.DataFrame(rows), window=6).iter_rows(named=True)}
    assert wide[1]["half_life_median"] == 5 and wide[5]["n_runs"] == 0 and wide[5]["n_short"] == 3


def _halving_runs(halves: list[int | None], window: int = 8) -> pl.DataFrame:
    """One run per prompt from step 1: KL 1.0 at onset, then 0.4 from ``h`` steps after it (None: never)."""
    rows = []
    for pi, h in enumerate(halves):
        for s in range(1, window + 1):
            kl = 0.4 if h is not None and s - 1 >= h else 1.0
            rows.append({"run_id": f"r{pi}", "prompt_idx": pi, "start_step": 1, "strength": 1.0, "step": s,
                         "kl_to_base": kl, "token_changed": False})
    return pl.DataFrame(rows)


def test_half_life_interval_known_cases():
    """The median half-life's prompt-clustered interval: equal half-lives give a zero-width interval; ends are
    medians a resample of the prompts can give (no interpolation); runs that never halve count as infinite,
    so with half of them never halving the upper end is open (None) and with all of them the median is None."""
    from trajscope.studies.steering.summary import headline

    def summary(halves, **kw):
        return decay_summary(_halving_runs(halves), window=8, **kw)

    row = summary([3] * 6).row(0, named=True)
    assert (row["half_life_median"], row["half_life_lo"], row["half_life_hi"]) == (3, 3, 3)
    halves = [1, 2, 2, 3, 4, 5, 6, 2]
    table = summary(halves, n_boot=400)
    row = table.row(0, named=True)
    assert row["half_life_median"] == 2.5 == float(np.median(halves))
    assert 1 < row["half_life_lo"] <= 2.5 <= row["half_life_hi"] < 6  # a median of 8 prompts rarely hits an extreme
    possible = {float(np.median(np.array(c))) for c in itertools.combinations_with_replacement(halves, len(halves))}
    assert {row["half_life_lo"], row["half_life_hi"]} <= possible
    shuffled = decay_summary(_halving_runs(halves).sample(fraction=1.0, shuffle=True, seed=3), window=8, n_boot=400)
    assert shuffled.row(0, named=True)["half_life_hi"] == row["half_life_hi"]  # row order does not matter
    half = headline(table)["half_life"][0]
    assert (half["value"], half["lo"], half["hi"]) == (2.5, row["half_life_lo"], row["half_life_hi"])
    row = summary([2, 3, None, None, 2, None, 3, None]).row(0, named=True)
    assert row["half_life_median"] is None and row["half_life_hi"] is None and row["half_life_lo"] >= 2
    row = summary([None] * 4).row(0, named=True)
    assert (row["half_life_median"], row["half_life_lo"], row["half_life_hi"]) == (None, None, None)


def test_equal_windows_count_the_same_steps_for_every_depth_and_compare_with_step_one():
    """k=1 and k=4 in runs of 10 steps: both summarised over exactly 3 steered steps; a run whose window
    does not fit is counted as short, not averaged over fewer steps."""
    rows = []
    for pi in range(4):
        for k in (1, 4, 9):
            for s in range(10):
                on = s >= k
                rows.append({"run_id": f"p{pi}", "prompt_idx": pi, "start_step": k, "strength": 1.0, "step": s,
                             "kl_to_base": (0.1 * (s - k + 1) + 0.01 * pi) if on else 0.0, "token_changed": on})
    summ = decay_summary(pl.DataFrame(rows), window=3)
    k1, k4 = summ.filter(pl.col("start_step") == 1).row(0, named=True), summ.filter(pl.col("start_step") == 4).row(0, named=True)
    assert k1["steps_counted"] == k4["steps_counted"] == 3 and k1["n_runs"] == k4["n_runs"] == 4
    assert k1["effect"] == pytest.approx(k4["effect"])  # same growth from onset: no depth effect
    # the same absolute steps 4..6 under a vector on since step 1 carry 3 more steps of accumulation
    assert k4["from_step1_kl"] == pytest.approx(k4["effect"] + 0.3)
    assert k4["effect_lo"] <= k4["effect"] <= k4["effect_hi"]
    k9 = summ.filter(pl.col("start_step") == 9).row(0, named=True)
    assert k9["n_runs"] == 0 and k9["n_short"] == 4


def test_sweep_keeps_rows_when_cancelled(tiny_models):
    import threading

    model = tiny_models["gpt2"]
    cancel = threading.Event()
    vec = strong(model, k=1, scale=4.0)
    full = steering_sweep(model, [PROMPT], vec, depths=(1, 3), strengths=(2.0,), window=3, progress=False)
    assert full.complete and set(full.summary["start_step"]) == {1, 3}
    before = full.steps.filter(pl.col("step") < pl.col("start_step"))
    assert before.height > 0 and before["kl_to_base"].abs().max() < 1e-9  # nothing moves before onset
    cancel.set()
    with pytest.raises(ts.TrajscopeError, match="stopped before any run finished"):
        steering_sweep(model, [PROMPT], vec, depths=(1, 3), window=3, cancel=cancel, progress=False)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(direction=torch.ones(7)), "width 7 but layer 1 has width 32"),
    (dict(layer=5), "layer 5 is out of range"),
    (dict(start_step=6), "start_step 6 is beyond the run"),
])
def test_bad_vectors(tiny_models, kwargs, fragment):
    args = dict(layer=1, direction=torch.ones(32), strength=1.0, start_step=1) | kwargs
    with pytest.raises(ts.TrajscopeError, match=fragment):
        ts.capture(tiny_models["llama"], PROMPT, max_new_tokens=6, steering=[SteeringVector(**args)])


@pytest.mark.parametrize("strength", [float("nan"), float("inf"), -float("inf")])
def test_a_strength_that_is_not_a_finite_number_is_refused(strength):
    # a NaN strength made every steered residual NaN: the sample model's capture then stopped at step 2 on EOS
    with pytest.raises(ts.TrajscopeError, match="^The steering strength must be a finite number"):
        SteeringVector(layer=1, direction=torch.ones(32), strength=strength)
    with pytest.raises(ts.TrajscopeError, match="^The steering strength must be a finite number"):
        SteeringVector(layer=1, direction=torch.ones(32)).at(strength=strength)


def test_vector_files_round_trip(tmp_path):
    vec = SteeringVector(layer=2, direction=torch.arange(1.0, 5.0), strength=3.0, start_step=10, name="quotes")
    back = SteeringVector.load(vec.save(tmp_path / "v.safetensors"))
    assert back.to_dict() == vec.to_dict()
    np.save(tmp_path / "v.npy", np.arange(1.0, 5.0))
    assert SteeringVector.load(tmp_path / "v.npy", layer=1).direction.tolist() == [1.0, 2.0, 3.0, 4.0]
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ts.TrajscopeError, match="plain numeric"):
        SteeringVector.load(tmp_path / "obj.npy", layer=1)
    with pytest.raises(ts.TrajscopeError, match="pass layer="):
        SteeringVector.load(tmp_path / "v.npy")
    with pytest.raises(ts.TrajscopeError, match="non-zero"):
        SteeringVector(layer=0, direction=torch.zeros(4))


def test_sae_decoder_direction():
    sae = ts.SAE.load("sample_data/saes/layer3-prefill-only")
    vec = SteeringVector.from_sae(sae, 17, layer=3, strength=2.0, start_step=5)
    torch.testing.assert_close(vec.direction, sae.W_dec[17].detach().float())
    assert (vec.layer, vec.strength, vec.start_step, vec.name) == (3, 2.0, 5, "sae-17")
    with pytest.raises(ts.TrajscopeError, match="out of range"):
        SteeringVector.from_sae(sae, 10_000, layer=3)


def test_decay_summary_is_bit_identical_whatever_the_row_order():
    """The calibration report's check "the study run alone gives the same summaries" failed in CI on the last
    bit of one effect: the per-run means came out of an unordered group_by, so the mean over runs summed them
    in another order. Shuffled input rows must give the same bits."""
    rng = np.random.default_rng(0)
    rows = [{"run_id": f"r{p}-{k}", "prompt_idx": p, "start_step": k, "strength": 4.0, "step": s,
             "kl_to_base": float(rng.random() * 3.7) if s >= k else 0.0, "token_changed": bool(s % 2)}
            for p in range(40) for k in (1, 3) for s in range(12)]
    ref = decay_summary(pl.DataFrame(rows), window=5).to_dicts()
    for seed in range(8):
        order = np.random.default_rng(seed).permutation(len(rows))
        assert decay_summary(pl.DataFrame([rows[i] for i in order]), window=5).to_dicts() == ref, seed
