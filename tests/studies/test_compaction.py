"""The compaction study against independent Hugging Face references, per family, and its probe and command.

Setup B (restart) is checked against a plain HF forward of ``<sys> <summary> <T3>``;
setup A (mask) against an HF forward given an explicit 4-D additive mask that hides
T1 and T2 from every query from T3's start on (HF passes a 4-D mask through
unchanged), and the control D the same way from the summary's start on; with nothing
masked, A (and D) is C bit for bit. The probe must recover a
signal planted in the residual stream through a known direction and stay at chance
on shuffled labels.
"""

from __future__ import annotations

import json
import random

import numpy as np
import polars as pl
import pytest
import torch

from tiny import FAMILIES, hf_reference
from trajscope.errors import TrajscopeError
from trajscope.steering import SteeringVector
from trajscope.studies.compaction.engine import run_setup, setup_input
from trajscope.studies.compaction.study import compaction
from trajscope.studies.probe import bootstrap_interval, score_probe, split_sessions
from trajscope.studies.sessions import SEGMENTS, Session, read_sessions, synthetic_sessions, tokenize_session

SESSION = Session("s0", "import os\n", "def setup():\n    user_id = 4821\n", "def f(a):\n    return a\n",
                  "# summary: setup() and f(a)\n", "assert user_id ==", fact="user_id = 4821", label=4)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread when the cores are shared; torch's setting is restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def short_sessions(n: int, seed: int = 0, n_classes: int = 3) -> list[Session]:
    """Short sessions (≈ 30 tokens) that fit the tiny models' 128 positions."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name = rng.choice(["user", "order", "job", "node", "task"])
        label = i % n_classes  # balanced classes
        out.append(Session(f"s{i}", "import os\n", f"{name}_id = {label + 1}{rng.randint(100, 999)}\n",
                           rng.choice(["x = 1\n", "def f(a):\n    return a\n"]), f"# {name}\n",
                           f"assert {name}_id ==", label=label))
    return out


def hf_hidden(model, ids, mask4d=None):
    """Logits and block outputs of an independent no-cache HF forward (hidden_states[l + 1] = block l)."""
    with torch.no_grad():
        out = hf_reference(model)(torch.tensor([ids]), attention_mask=mask4d, output_hidden_states=True,
                                   use_cache=False)
    return out.logits[0].float(), [h[0].float() for h in out.hidden_states[1:]]


def explicit_mask(T: int, hide: list[int], mask_from: int) -> torch.Tensor:
    """``[1, 1, T, T]`` additive mask: causal, and queries ≥ mask_from do not see keys in ``hide``."""
    allowed = torch.ones(T, T).tril().bool()
    rows = torch.arange(T) >= mask_from
    for k in hide:
        allowed[rows, k] = False
    m = torch.zeros(T, T)
    m.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return m[None, None]


@pytest.mark.parametrize("family", FAMILIES)
def test_nothing_masked_makes_A_equal_C_exactly(tiny_models, family):
    model = tiny_models[family]
    tok = tokenize_session(model, SESSION)
    layers = range(model.n_layers)
    lc, rc = run_setup(model, tok, "C", layers=layers)
    for setup in ("A", "D"):
        la, ra = run_setup(model, tok, setup, layers=layers, masked=())
        assert torch.equal(la, lc) and all(torch.equal(ra[k], rc[k]) for k in layers)
    lm, _ = run_setup(model, tok, "A", layers=layers)  # and masking T1/T2 does change T3
    assert not torch.allclose(lm, lc, atol=1e-4)
    ref_logits, _ = hf_hidden(model, tok.ids)  # C is the plain full-context forward
    torch.testing.assert_close(lc, ref_logits[tok.span("t3")[0]:], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_restart_B_equals_an_independent_hf_forward(tiny_models, family):
    model = tiny_models[family]
    tok = tokenize_session(model, SESSION)
    logits, resid = run_setup(model, tok, "B", layers=range(model.n_layers))
    ref_logits, ref = hf_hidden(model, tok.restart_ids)
    a, b = tok.span("t3", restart=True)
    assert b == len(tok.restart_ids) and logits.shape[0] == tok.n_t3
    torch.testing.assert_close(logits, ref_logits[a:b], atol=1e-5, rtol=1e-4)
    for layer in range(model.n_layers - 1):  # HF's last hidden state is after the final norm
        torch.testing.assert_close(resid[layer], ref[layer][a:b], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_mask_A_and_D_equal_hf_with_an_explicit_4d_mask(tiny_models, family):
    """A hides T1/T2 from T3's first query on; D (the control) from the summary's first query on."""
    model = tiny_models[family]
    tok = tokenize_session(model, SESSION)
    (a1, b1), (a2, b2), (s0, _), (t3, _) = tok.span("t1"), tok.span("t2"), tok.span("summary"), tok.span("t3")
    for setup, start in (("A", t3), ("D", s0)):
        inp = setup_input(tok, setup)
        assert b1 == a2 and inp.mask_from == start
        assert (~inp.key_mask).nonzero().flatten().tolist() == list(range(a1, b2))
        logits, resid = run_setup(model, tok, setup, layers=range(model.n_layers))
        ref_logits, ref = hf_hidden(model, tok.ids, explicit_mask(len(tok.ids), list(range(a1, b2)), start))
        torch.testing.assert_close(logits, ref_logits[t3:], atol=1e-5, rtol=1e-4)
        for layer in range(model.n_layers - 1):
            torch.testing.assert_close(resid[layer], ref[layer][t3:], atol=1e-5, rtol=1e-4)
    _, ra = run_setup(model, tok, "A", layers=[0])
    _, rd = run_setup(model, tok, "D", layers=[0])
    assert torch.equal(ra[0], rd[0])  # block 0's keys and values do not depend on context: A = D there


def test_study_tables_and_a_masked_decode_that_matches_the_forward(tiny_models):
    model = tiny_models["llama"]
    sessions = short_sessions(12)
    res = compaction(model, sessions, max_new_tokens=3, n_boot=100)
    n3 = sum(tokenize_session(model, s).n_t3 for s in sessions)
    assert res.tables["compaction_states"].height == n3 * 6 * model.n_layers and res.tables["compaction_next_token"].height == n3 * 6
    assert set(res.tables["compaction_decode"]["setup"]) == {"A", "B", "D"} and res.tables["compaction_decode"].height == 36
    assert res.tables["compaction_probe"].height == model.n_layers * 6 * 2
    summ = res.tables["compaction_summary"]
    assert (summ["lo"] <= summ["estimate"] + 1e-12).all() and (summ["estimate"] <= summ["hi"] + 1e-12).all()
    assert res.tables["compaction_sessions"].filter(pl.col("split") == "test").height == 4
    # A's greedy decode (KV cache, masked from T3's start) is the argmax of A's teacher-forced forward
    tok = tokenize_session(model, sessions[0])
    inp = setup_input(tok, "A")
    ids = model.masked_decode(inp.ids, 3, inp.key_mask, mask_from=inp.mask_from)
    forced = model.forward(ids[:-1], key_mask=inp.key_mask, mask_from=inp.mask_from).logits
    assert forced[len(inp.ids) - 1:].argmax(-1).tolist() == ids[len(inp.ids):]


def test_probe_recovers_a_planted_direction_and_not_shuffled_labels(tiny_models):
    """Plant ``strength · u_label`` in block 0's output at T3's last token (steering through the boundary):
    the probe reads it from block 1 on held-out sessions; with shuffled labels it stays at chance."""
    model = tiny_models["llama"]
    sessions = short_sessions(60, seed=1)
    dirs = torch.linalg.qr(torch.randn(model.d_model, 3, generator=torch.Generator().manual_seed(0)))[0].T
    feats = []
    for s in sessions:
        ids = tokenize_session(model, s).ids
        vec = SteeringVector(0, dirs[s.label], strength=4.0, start_step=1, end_step=2)  # the last position only
        feats.append(model.forward(ids, prompt_len=len(ids) - 1, steering=[vec], layers=[1]).resid[1][-1])
    x, y = torch.stack(feats), torch.tensor([s.label for s in sessions])
    train, test = split_sessions(len(sessions), 0.3, seed=0)
    assert not set(train) & set(test)
    real = score_probe(x, y, train, test)
    shuffled = score_probe(x, y, train, test, shuffle=True)
    assert real.accuracy >= 0.9 and real.lo > real.majority
    assert shuffled.lo <= shuffled.chance <= shuffled.hi and shuffled.accuracy < 0.55
    noise = score_probe(torch.randn(300, 32, generator=torch.Generator().manual_seed(3)), torch.randint(0, 3, (300,)),
                        *split_sessions(300, 0.3))  # pure noise: at chance
    assert noise.lo < 1 / 3 + 0.05 < noise.hi + 0.1 and noise.accuracy < 0.45


def test_bootstrap_interval_is_a_percentile_interval_of_the_mean():
    est, lo, hi = bootstrap_interval(np.r_[np.zeros(50), np.ones(50)], n_boot=2000)
    assert est == 0.5 and 0.38 < lo < 0.45 and 0.55 < hi < 0.62
    assert np.isnan(bootstrap_interval([1.0])[1])


def test_synthetic_sessions_keep_the_fact_in_T1_only():
    sessions = synthetic_sessions(50, seed=3)
    assert sessions == synthetic_sessions(50, seed=3)
    for s in sessions:
        number = s.fact.split(" = ")[1]
        assert number in s.t1 and all(number not in getattr(s, k) for k in ("sys", "t2", "summary", "t3"))
        assert s.label == int(number[0]) and s.t3.rstrip().endswith(("==", "="))


def test_clear_errors(tiny_models, tmp_path):
    model = tiny_models["llama"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"sys": "a", "t1": "b", "summary": "c", "t3": "d"}) + "\n")
    with pytest.raises(TrajscopeError, match=r"missing the segment\(s\) t2"):
        read_sessions(bad)
    long = Session("long", "a\n", "b\n", "c\n", "x = 1\n" * 60, "d")
    with pytest.raises(TrajscopeError, match="the summary has .* tokens, more than the model's context window of 128"):
        tokenize_session(model, long)
    with pytest.raises(TrajscopeError, match="too few to hold out"):
        compaction(model, short_sessions(6), max_new_tokens=0)
    with pytest.raises(TrajscopeError, match="needs a 'label'"):
        compaction(model, [SESSION, Session(**{**SESSION.__dict__, "label": None})], max_new_tokens=0)


def test_command_parses_helps_and_writes_parquet(tiny_dirs, tmp_path, capsys):
    from trajscope.cli import main

    with pytest.raises(SystemExit):
        main(["study", "compaction", "--help"])
    help_text = capsys.readouterr().out
    assert "example:" in help_text and "--synthetic 200" in help_text and "(default: 16)" in help_text
    assert "--prompts" not in help_text  # its input is sessions
    assert main(["study", "compaction", "--out", str(tmp_path / "x")]) == 2  # exactly one of --sessions, --synthetic
    assert "exactly one of --sessions FILE or --synthetic N" in capsys.readouterr().err
    sessions = tmp_path / "s.jsonl"
    sessions.write_text("".join(json.dumps(s.to_dict()) + "\n" for s in short_sessions(14)))
    out = tmp_path / "out"
    assert main(["study", "compaction", "--model", str(tiny_dirs["gpt2"]), "--sessions", str(sessions),
                 "--out", str(out), "--max-new-tokens", "2", "--layers", "1", "--n-boot", "50"]) == 0
    for name in ("sessions", "states", "next_token", "decode", "probe", "summary"):
        meta = pl.read_parquet_metadata(out / f"compaction_{name}.parquet")
        assert meta["trajscope_table"] == f"compaction_{name}"
    assert pl.read_parquet(out / "compaction_states.parquet")["layer"].unique().to_list() == [1]
    assert pl.read_parquet(out / "compaction_sessions.parquet").height == 14 and SEGMENTS[0] == "sys"
    marker = json.loads((out / "compaction.result.json").read_text())
    assert marker["config"]["sessions"] == str(sessions) and marker["summaries"]["divergence"]["layer"] == 1


def test_planted_signal_lands_on_T1_positions_only(tiny_models):
    """The planted fact is added to block ``plant_layer``'s output at exactly T1's positions (A and C)."""
    from trajscope.studies.compaction.engine import _plant_steering, plant_directions

    model = tiny_models["qwen2"]
    tok = tokenize_session(model, SESSION)
    u = plant_directions(3, model.d_model)[1]
    steer, prompt_len = _plant_steering(tok, u, 0, 5.0)
    got = model.forward(tok.ids, prompt_len=prompt_len, steering=steer, layers=[0]).resid[0]
    base = model.forward(tok.ids, layers=[0]).resid[0]
    a, b = tok.span("t1")
    expected = torch.zeros_like(base)
    expected[a:b] = 5.0 * u
    torch.testing.assert_close(got - base, expected, atol=1e-5, rtol=0)
    res = compaction(model, short_sessions(14), plant_strength=5.0, n_boot=50)
    assert res.tables["compaction_decode"].is_empty() and res.config["plant_strength"] == 5.0
