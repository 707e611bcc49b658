"""Every pane of the app that echoes text shows a payload as text (no Browser): error alerts, status lines,
feature labels, the step readout."""

from __future__ import annotations

import html

import panel as pn
import polars as pl
from bokeh.document import Document
from panel.pane.markup import HTMLBasePane

from trajscope.features.labels import FeatureLabels
from trajscope.ui.views.app import TrajScope

PAYLOAD = "<img src=x onerror=alert(1)> <script>alert(1)</script> <svg onload=alert(1)> \"><b>x</b> @{x}{safe} $x"
MARKUP = ("<img", "<script", "<svg", "<b>")


def pane_html(layouts) -> list[str]:
    """What every HTML-like pane under ``layouts`` sends to the browser (decoded once, as the browser does)."""
    out = []
    for lay in layouts:
        for pane in lay.select(HTMLBasePane):
            obj = pane.object
            if isinstance(obj, str):
                out.append(html.unescape(pane._transform_object(obj)["object"]))
    return out


def test_payloads_in_every_echoing_pane_stay_text(short_run):
    app = TrajScope(trajectory=short_run)
    views = [app.controls, app.player, app.features, app.features.card, app.study_cards["drift"], app.study_cards["steering"], app.study_cards["eviction"],
             app.study_cards["compaction"]]
    layouts = [v.__panel__() for v in views]
    doc = Document()
    for lay in layouts:
        lay.get_root(doc)
    st = app.state
    st.report(f"No model at {PAYLOAD}.")  # the model / open-run / SAE / profile fields echo what was typed
    card = app.features.card
    card.labels = FeatureLabels(None)  # in memory: the shipped SAE's labels.json stays untouched
    card.labels.set(3, PAYLOAD)
    card.param.update(feature=3, message=f"Could not save to {PAYLOAD}.")
    app.features.message = f"No SAE directory at {PAYLOAD}."
    app.study_cards["drift"].settings.param.update(drift=None, message=f"No profile at {PAYLOAD}.")
    app.study_cards["steering"].settings.status = f"Depths {PAYLOAD} are not numbers."
    app.study_cards["eviction"].settings.param.update(status=PAYLOAD, summary=PAYLOAD)
    app.study_cards["compaction"].settings.param.update(status=PAYLOAD, summary=PAYLOAD)
    shown = pane_html(layouts)
    hits = [h for h in shown if "alert(1)" in h]
    assert len(hits) >= 8, hits  # each place above echoed the payload ...
    for h in hits:  # ... as text, never as markup
        assert not any(m in h for m in MARKUP), h
    assert any("### f3 · " in h or "f3 · &lt;img" in h for h in hits)


def test_step_readout_shows_token_text_as_text(short_run):
    from trajscope.ui.views.player import describe_step

    class FakeRun:
        prompt_len = short_run.prompt_len
        tokens = short_run.tokens.with_columns(pl.lit("<b>x</b>`<img src=x onerror=alert(1)>`").alias("text"))

    class FakeState:
        trajectory, step, n_steps = FakeRun(), 3, short_run.n_steps

    out = html.unescape(pn.pane.Markdown(describe_step(FakeState()))._transform_object(describe_step(FakeState()))["object"])
    assert "<img" not in out and "<b>" not in out and "&lt;b&gt;x&lt;/b&gt;`&lt;img·src=x·onerror=alert(1)&gt;`" in out
