"""The SAE card without a browser: the chosen feature's contexts, density and label; cursors, decode line, axes."""

from __future__ import annotations

import html
import json
import shutil

import holoviews as hv
import polars as pl
import pytest
from bokeh.document import Document

import trajscope as ts
from trajscope.features.index import FeatureIndex
from trajscope.escaping import md_text
from trajscope.features.labels import LABELS_FILE
from trajscope.ui import feature_plots as fp
from trajscope.ui.state import AppState
from trajscope.ui.views.features import SAMPLE_SAE, FeaturesView


@pytest.fixture(scope="module")
def run(sample_model):
    return ts.capture(sample_model, "def fibonacci(n):\n    ", max_new_tokens=8, residual_layers=[3])


@pytest.fixture
def sae_copy(tmp_path):
    """A writable copy of the shipped SAE with its index (inside the test's data directories)."""
    return shutil.copytree(SAMPLE_SAE, tmp_path / "sae", ignore=shutil.ignore_patterns("*.csv"))


def view_of(run, path=SAMPLE_SAE) -> FeaturesView:
    state = AppState()
    state.set_trajectory(run, step=0)
    view = FeaturesView(state=state, sae_path=str(path))
    view.__panel__().get_root(Document())
    return view


def test_clicking_a_top_feature_shows_its_contexts_and_density(run):
    view = view_of(run)
    index = FeatureIndex.load(SAMPLE_SAE)
    rows = view._top_rows
    assert len(rows) > 3 and view.top_table.value["name"].tolist() == [f"f{f}" for f in rows["feature"]]
    view.top_table.selection = [2]  # what a click on the third row sends
    f = int(rows["feature"][2])
    assert view.card.feature == f and view.chooser.value == f
    page = view.card.contexts(f, view.card.index)
    ex = index.contexts(f)
    assert len(ex) == 8 and page.count("<tr>") == 1 + len(ex)
    for r in ex.iter_rows(named=True):
        assert f"<mark title='pos {r['pos']}'>{html.escape(r['token'].replace(chr(10), '↵')).replace(' ', '·')}</mark>" in page
        assert f"<td>{r['value']:.3g}</td>" in page
    d = index.density_of(f)
    text = view.card.density(f, view.card.index, view.card.run_density)
    assert f"({d['active_prefill']} of {d['n_prefill']})" in text and f"({d['active_decode']} of {d['n_decode']})" in text
    # this run's counts: a direct count over the run's encoded positions
    P = run.prompt_len
    act = view._enc["f"][:, f] > 0
    assert f"prefill {100 * act[:P].float().mean():.2g}% ({int(act[:P].sum())} of {P})" in text
    # the select widget chooses too
    other = next(v for v in view.chooser.options.values() if v != f)
    view.chooser.value = other
    assert view.card.feature == other and "<mark" in view.card.contexts(other, view.card.index)


def test_labels_are_saved_beside_the_sae_and_shown_with_every_id(run, sae_copy):
    view = view_of(run, sae_copy)
    f = int(view._top_rows["feature"][0])
    view.choose(f)
    view.card.label_text = "for-loop header"
    assert json.loads((sae_copy / LABELS_FILE).read_text()) == {str(f): "for-loop header"}
    name = f"f{f} · for-loop header"
    assert "Saved" in view.card.message and view.card.header(f, 0) == f"### {md_text(name)}"
    assert name in view.chooser.options and view.top_table.value["name"][0] == name
    g = int(view.timeline(view.message).opts.get().kwargs["yticks"][0][1][1:])  # the timeline's first feature
    view.choose(g)
    view.card.label_text = "indent"
    assert f"f{g} · indent" == view.timeline(view.message).opts.get().kwargs["yticks"][0][1]
    again = view_of(run, sae_copy)  # loaded with the SAE
    again.choose(f)
    assert again.card.label_text == "for-loop header"


def test_unwritable_sae_directory_says_so_and_keeps_the_label(run, sae_copy, monkeypatch):
    view = view_of(run, sae_copy)
    f = int(view._top_rows["feature"][0])
    view.choose(f)

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("trajscope.io.tempfile.mkstemp", refuse)
    view.card.label_text = "newline token"
    assert "not writable" in view.card.message and "session only" in view.card.message
    assert not (sae_copy / LABELS_FILE).exists()
    assert view.card.labels.get(f) == "newline token" and f"f{f} · newline token" in view.chooser.options


def test_timeline_and_error_plot_use_steps_with_cursor_and_decode_line(run):
    view = view_of(run)
    P = run.prompt_len
    spans = [a[0] for c in view.cursors.values() for a in c.annotations]  # on the rendered figures
    assert len(spans) == 2 and all(s.location == 0 for s in spans)
    view.state.step = 5
    assert all(s.location == 5 for s in spans)
    for name in ("error", "timeline"):
        plot = getattr(view, "error_plot" if name == "error" else "timeline")(view.message)
        assert plot.opts.get().kwargs["xlabel"] == "step (0 = prefill)"
        lines = [el for el in plot if isinstance(el, hv.VLine)]
        assert [ln.data for ln in lines] == [0.5]  # decode starts between step 0 and step 1
    rects = next(el for el in view.timeline(view.message) if isinstance(el, hv.Rectangles))
    assert rects.opts.get().kwargs["clabel"] == "activation"
    assert rects["step"].min() == 0 and rects["step"].max() == run.n_steps - 1
    assert len(rects.opts.get().kwargs["tools"]) == 1  # one hover, with named fields (no "value: -")
    curve = next(el for el in view.error_plot(view.message) if isinstance(el, hv.Curve))
    assert list(curve["step"]) == list(range(run.n_steps))
    assert curve["relative error"][0] == pytest.approx(view._enc["rel_err"][P - 1])
    assert curve["relative error"][3] == pytest.approx(view._enc["rel_err"][P + 2])
    top = view._top_rows
    want = view._enc["features"].filter(pl.col("pos") == P + 4).sort("value", descending=True)
    assert top["feature"].to_list() == want["feature"].head(16).to_list()


def test_tables_show_integers_and_short_floats():
    df = pl.DataFrame({"n": [9, None], "fvu": [0.123456789, None], "x": [12.0, 0.000123456]})
    out = fp.display_table(df)
    assert out.rows() == [("9", "0.123", "12"), ("", "", "0.000123")]


def test_contexts_escape_token_text():
    ex = pl.DataFrame({"feature": [1], "rank": [0], "value": [2.5], "prompt_id": ["a<b"], "pos": [3], "step": [0],
                       "phase": ["prefill"], "token": ["<script>"], "left": [["x &", "\n"]], "right": [["</td>"]]})
    page = fp.contexts_html(ex)
    assert "<script>" not in page and "&lt;script&gt;" in page and "x &amp;↵" in page and "&lt;/td&gt;" in page
    assert "a&lt;b" in page


def test_a_whitespace_token_is_visible_in_its_context():
    ex = pl.DataFrame({"feature": [1], "rank": [0], "value": [2.5], "prompt_id": ["p"], "pos": [3], "step": [0],
                       "phase": ["prefill"], "token": ["    "], "left": [["def f():", "\n"]], "right": [["return"]]})
    assert "<mark title='pos 3'>····</mark>" in fp.contexts_html(ex)


def test_a_label_with_markup_is_stored_as_text_and_shown_inert(run, sae_copy):
    view = view_of(run, sae_copy)
    f = int(view._top_rows["feature"][0])
    view.choose(f)
    payload = '<img src=x onerror=alert(1)> "><b>x</b>'
    view.card.label_text = payload
    assert json.loads((sae_copy / LABELS_FILE).read_text()) == {str(f): payload}  # plain text on disk
    import panel as pn

    header = pn.pane.Markdown(view.card.header(f, view.card.names_version))
    shown = html.unescape(header._transform_object(header.object)["object"])
    assert "<img" not in shown and "<b>" not in shown and html.escape(payload) in shown
