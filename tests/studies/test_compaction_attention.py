"""Attention mass from T3's queries onto the summary, against an independent eager HF ``output_attentions``.

The study reads attention rows through the model boundary (q · Kᵀ beside the fast kernel, the key
mask applied); the reference is a plain Hugging Face forward with eager attention of the same
weights, given the setup's context (B: ``<sys> <summary> <T3>``) and, for A and D, an explicit 4-D
additive mask that hides T1/T2 from queries from T3's (D: the summary's) first position on.
"""

from __future__ import annotations

import polars as pl
import pytest
import torch

from tiny import FAMILIES, hf_reference
from test_compaction import SESSION, explicit_mask, short_sessions
from trajscope.studies.compaction.engine import attention_spans, measure_session, setup_input
from trajscope.studies.compaction.study import compaction
from trajscope.studies.sessions import tokenize_session


def hf_masses(model, tok, setup: str) -> dict[str, torch.Tensor]:
    """``{segment: [L, n_t3]}`` head-mean attention mass of T3's queries, from eager HF ``output_attentions``."""
    inp = setup_input(tok, setup)
    hide = (~inp.key_mask).nonzero().flatten().tolist()
    mask = explicit_mask(len(inp.ids), hide, inp.mask_from) if hide else None
    with torch.no_grad():
        out = hf_reference(model)(torch.tensor([inp.ids]), attention_mask=mask, output_attentions=True, use_cache=False)
    a, b = inp.t3
    spans = attention_spans(tok, setup)
    res = {}
    for seg in ("sys", "summary", "masked", "t3"):
        keys = [j for s, e in spans[seg] for j in range(s, e)]
        res[seg] = torch.stack([w[0, :, a:b][..., keys].double().sum(-1).mean(0) for w in out.attentions])
    return res


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_mass_equals_eager_hf_output_attentions(tiny_models, family):
    model = tiny_models[family]
    tok = tokenize_session(model, SESSION)
    layers = list(range(model.n_layers))
    *_, att = measure_session(model, tok, layers)
    assert att.height == 4 * model.n_layers * tok.n_t3
    for setup in ("A", "B", "C", "D"):
        ref = hf_masses(model, tok, setup)
        got = att.filter(pl.col("setup") == setup).sort("layer", "t3_index")
        for seg, col in (("sys", "sys_mass"), ("summary", "summary_mass"), ("t3", "t3_mass")):
            want = ref[seg].flatten().numpy()
            torch.testing.assert_close(torch.tensor(got[col].to_numpy()), torch.tensor(want), atol=2e-5, rtol=1e-4)
        masked = got["masked_mass"]
        if setup == "B":
            assert masked.null_count() == got.height  # the restart has no T1/T2
        else:
            torch.testing.assert_close(torch.tensor(masked.to_numpy()), torch.tensor(ref["masked"].flatten().numpy()),
                                       atol=2e-5, rtol=1e-4)
    a = att.filter(pl.col("setup") == "A")
    assert a["masked_mass"].abs().max() < 1e-6  # A hides T1/T2 from T3
    c = att.filter(pl.col("setup") == "C")
    assert c["masked_mass"].max() > 1e-3  # C does attend to them
    total = att["summary_mass"] + att["sys_mass"] + att["masked_mass"].fill_null(0) + att["t3_mass"]
    assert (total - 1).abs().max() < 1e-5
    assert (att["summary_mass_max"] >= att["summary_mass"] - 1e-12).all()


def test_study_writes_the_attention_table_and_its_intervals(tiny_models, tmp_path):
    model = tiny_models["gpt_neox"]
    sessions = short_sessions(12)
    res = compaction(model, sessions, max_new_tokens=0, n_boot=100)
    n3 = sum(tokenize_session(model, s).n_t3 for s in sessions)
    assert res.tables["compaction_attention"].height == n3 * 4 * model.n_layers
    summ = res.tables["compaction_summary"].filter(pl.col("metric") == "attention_summary_mass")
    assert summ.height == 4 * model.n_layers and (summ["n_sessions"] == 12).all()
    per = (res.tables["compaction_attention"].group_by("session_id", "setup", "layer").agg(pl.col("summary_mass").mean())
           .group_by("setup", "layer").agg(pl.col("summary_mass").mean()))
    joined = summ.join(per, left_on=["pair", "layer"], right_on=["setup", "layer"])
    assert joined.height == summ.height
    torch.testing.assert_close(torch.tensor(joined["estimate"].to_numpy()), torch.tensor(joined["summary_mass"].to_numpy()))
    assert ((summ["lo"] <= summ["estimate"]) & (summ["estimate"] <= summ["hi"])).all()
    assert res.tables["compaction_summary"].filter(pl.col("metric") == "attention_masked_mass")["pair"].unique().sort().to_list() \
        == ["A", "C", "D"]
    res.save(tmp_path)
    meta = pl.read_parquet_metadata(tmp_path / "compaction_attention.parquet")
    assert meta["trajscope_table"] == "compaction_attention"
    off = compaction(model, sessions, max_new_tokens=0, n_boot=50, attention=False)
    assert off.tables["compaction_attention"].is_empty() and "not measured" in off.config["attention_mass"]


def test_summary_intervals_do_not_depend_on_row_order(tiny_models):
    from trajscope.studies.compaction.summary import summarize

    res = compaction(tiny_models["llama"], short_sessions(12), max_new_tokens=0, n_boot=200)
    t = res.tables
    a = t["compaction_summary"]
    b = summarize(t["compaction_states"].sample(fraction=1.0, shuffle=True, seed=1), t["compaction_next_token"],
                  t["compaction_attention"].sample(fraction=1.0, shuffle=True, seed=2), t["compaction_decode"], n_boot=200)
    assert a.drop("estimate", "lo", "hi").equals(b.drop("estimate", "lo", "hi"))
    for c in ("estimate", "lo", "hi"):  # equal up to the order of float sums within a session
        torch.testing.assert_close(torch.tensor(a[c].to_numpy()), torch.tensor(b[c].to_numpy()), atol=1e-12, rtol=1e-12)
