"""The Eviction card shows, for the run on screen, the per-step vs accumulated split and passkey retrieval:
the split's two arms as the split module computes them on this run, the model's shipped needle table, and on a
passkey prompt each policy's masked answer."""

from __future__ import annotations

import importlib

import numpy as np
import polars as pl
from bokeh.document import Document

import trajscope as ts
from trajscope.metrics import eviction as ev
from trajscope.studies.eviction import needle as nd
from trajscope.studies.eviction.split import split_steps
from trajscope.studies.eviction.state import passkey_of, shipped_needle
from trajscope.ui.state import AppState

card_mod = importlib.import_module("trajscope.studies.eviction.card")  # the package's `card` is its card() function


def _view(traj, model):
    state = AppState()
    state.set_trajectory(traj, step=0)
    v = card_mod.EvictionView(state=state, model_loader=lambda source: model)
    v.__panel__().get_root(Document())
    return v


def _texts(obj) -> str:
    """Every visible Markdown/HTML text and Bokeh figure title under a Panel object."""
    import panel as pn

    out = []
    hidden = {id(h) for c in obj.select(lambda x: not x.visible) for h in c.select()}
    for o in obj.select(lambda x: isinstance(x, (pn.pane.Markdown, pn.pane.HTML, pn.pane.Bokeh))):
        if id(o) in hidden:
            continue
        if isinstance(o, pn.pane.Bokeh):
            out.append(o.object.title.text)
        elif isinstance(o.object, str):
            out.append(o.object)
    return "\n".join(out)


def test_card_shows_the_split_of_this_run(short_run, sample_model):
    v = _view(short_run, sample_model)
    v.settings.param.update(policy="snapkv", budget=0.5, window=3)
    v.run()
    res = v.settings.result
    assert res is not None, v.settings.status
    P = short_run.prompt_len
    sel_mask = torch_mask(res, sample_model, P)
    ref = split_steps(sample_model, short_run.token_ids, P, ev.key_mask(sel_mask, len(short_run.token_ids)))
    sp = res.table("eviction_split").sort("step")
    np.testing.assert_allclose(sp["kl_per_step"], ref["kl_per_step"], atol=1e-6)
    np.testing.assert_allclose(sp["kl_accumulated"], ref["kl_accumulated"], atol=1e-6)
    lines = v.split.lines.data  # the card's figure draws both arms at their steps
    assert list(lines["step"]) == sp["step"].to_list()
    np.testing.assert_allclose(lines["kl_per_step"], sp["kl_per_step"])
    np.testing.assert_allclose(lines["kl_accumulated"], sp["kl_accumulated"])
    bands = v.split.bands.data  # each depth band's mean of each arm, over that band's steps
    summ = res.table("eviction_split_summary")
    assert sorted(bands["y"]) == sorted(summ["kl_per_step"].to_list() + summ["kl_accumulated"].to_list())
    assert v.split.figure.title.text == "Per-step vs accumulated damage — snapkv, budget 0.5"
    shown = _texts(v.__panel__())
    assert "Per-step vs accumulated damage — snapkv, budget 0.5" in shown
    assert "Per-step vs accumulated, this run" in shown and "one prompt: no interval" in shown
    assert "carried (paired)" in shown


def torch_mask(res, model, P):
    """The Selection the card's result kept, rebuilt from its ``eviction_kept`` table."""
    import torch

    kept = res.table("eviction_kept").sort("layer", "head")
    L, H = model.n_layers, model.n_heads
    mask = torch.zeros(L, H, P, dtype=torch.bool)
    for r in kept.iter_rows(named=True):
        mask[r["layer"], r["head"], r["kept_pos"]] = True
    return ev.Selection("snapkv", 0.5, float(mask.sum(-1).float().mean()), True, 3, mask)


def test_card_shows_the_shipped_needle_table(short_run, sample_model, monkeypatch):
    table = shipped_needle("smollm2")
    assert table is not None and {"policy", "budget", "accuracy", "lo", "hi", "n"} <= set(table.columns)
    assert shipped_needle("../etc") is None and shipped_needle("no-such-model") is None
    v = _view(short_run, sample_model)
    assert "ships no needle table" in _texts(v.__panel__())  # the sample model has none
    assert "Passkey retrieval vs budget" not in _texts(v.__panel__())
    asked = []
    monkeypatch.setattr(card_mod, "shipped_needle", lambda model_id: asked.append(model_id) or table)
    model_id = short_run.meta["model"]["model_id"]
    v._needle["model_id"] = "another model"  # the next run is of another model, as far as the card knows
    v.state.set_trajectory(short_run, step=0)
    shown = _texts(v.__panel__())
    assert "Passkey retrieval vs budget" in shown and "shipped needle study (24 prompts)" in shown
    assert "Passkey retrieval accuracy shipped with this model" in shown and "ships no needle table" not in shown
    fig = v._needle["figure"]
    # each policy's line and whiskers are its rows of the table, by budget
    for policy in ("snapkv", "streamingllm_rolling"):
        rows = table.filter(pl.col("policy") == policy).sort("budget")
        src = [r.data_source for r in fig.renderers if getattr(r.data_source, "data", {}).get("policy", [None])[0] == policy]
        assert src, policy
        data = src[0].data
        for col in ("budget", "accuracy", "lo", "hi", "n"):
            np.testing.assert_allclose(data[col], rows[col])
    whiskers = [w for w in fig.center if type(w).__name__ == "Whisker"]
    assert len(whiskers) == table["policy"].n_unique() - 1  # every policy but 'full'
    full = table.filter(pl.col("policy") == "full").row(0, named=True)
    band = [b for b in fig.center if type(b).__name__ == "BoxAnnotation"][0]
    assert (band.bottom, band.top) == (full["lo"], full["hi"])
    ref = [r for r in fig.renderers if r.glyph.line_dash == [6]]  # the full cache's dashed line
    assert len(ref) == 1 and list(ref[0].data_source.data["y"]) == [full["accuracy"]] * 2
    assert fig.xaxis[0].ticker.ticks == sorted(set(table["budget"]))
    labels = {item.label["value"] for item in fig.legend[0].items}
    assert labels == {f"full cache {full['accuracy']:.2f}"} | set(table["policy"]) - {"full"}
    # further runs of the same model keep the figure: no new Bokeh models
    n_asked = len(asked)
    v.state.set_trajectory(short_run, step=0)
    assert v._needle["figure"] is fig and len(asked) == n_asked
    assert model_id == v._needle["model_id"]


def test_card_answers_a_passkey_prompt_under_every_policy(sample_model):
    item = nd.needle_prompts(sample_model, 1, 160, [0.5], seed=2)[0]
    text = sample_model.tokenizer.decode(item["ids"])
    assert passkey_of(text) == item["key"] and passkey_of("no key here") is None
    traj = ts.capture(sample_model, text, max_new_tokens=4)
    v = _view(traj, sample_model)
    assert "This prompt hides a pass key" in _texts(v.__panel__())
    v.settings.param.update(policy="snapkv", budget=0.5, window=8)
    v.run()
    res = v.settings.result
    assert res is not None, v.settings.status
    ans = res.table("needle_answers")
    assert set(ans["policy"]) == {"full", *nd.POLICIES}
    ref = nd.needle_study(sample_model, [{**item, "ids": list(traj.token_ids[:traj.prompt_len]),
                                          "key_pos": nd.key_positions(sample_model.tokenizer,
                                                                      list(traj.token_ids[:traj.prompt_len]),
                                                                      item["key"])}],
                          ["snapkv"], [0.5], window=8, answer_tokens=12)
    got = ans.filter(pl.col("policy") == "snapkv")
    assert got["answer"].to_list() == ref.filter(pl.col("policy") == "snapkv")["answer"].to_list()
    shown = _texts(v.__panel__())
    assert f"This prompt hides pass key {item['key']}" in shown and "retrieves the key" in shown
