"""The SAE card without a browser: the chosen feature's contexts, density and label; cursors, decode line, axes."""

from __future__ import annotations

import html
import json
import shutil

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
    rows = view.timeline_fig.figure.yaxis.major_label_overrides
    g = int(rows[0][1:])  # the timeline's first feature
    view.choose(g)
    view.card.label_text = "indent"
    assert view.timeline_fig.figure.yaxis.major_label_overrides[0] == f"f{g} · indent"
    assert f"f{g} · indent" in view.timeline_fig.source.data["feature"]  # the hover too
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
    from bokeh.models import Span

    view = view_of(run)
    P = run.prompt_len
    spans = [a[0] for c in view.cursors.values() for a in c.annotations]  # on the figures
    assert len(spans) == 2 and all(s.location == 0 for s in spans)
    view.state.step = 5
    assert all(s.location == 5 for s in spans)
    for fig in (view.error_fig.figure, view.timeline_fig.figure):
        assert fig.xaxis[0].axis_label == "step (0 = prefill)"
        dashed = [a for a in fig.center if isinstance(a, Span) and a.dimension == "height" and a.line_dash]
        assert [a.location for a in dashed] == [0.5]  # decode starts between step 0 and step 1
    tl = view.timeline_fig
    rects = tl.source.data
    assert min(rects["step"]) == 0 and max(rects["step"]) == run.n_steps - 1
    # each rectangle is an active (step, feature) of the encoding, at the feature's row
    rows = {name: i for i, name in tl.figure.yaxis.major_label_overrides.items()}
    f = view._enc["f"]
    for s, name, y0, a in zip(rects["step"], rects["feature"], rects["y0"], rects["activation"]):
        assert y0 == rows[name] - 0.5
        assert f[P - 1 + int(s), int(name[1:])].item() == pytest.approx(a)
    hovers = [t for t in tl.figure.tools if t.__class__.__name__ == "HoverTool"]
    assert len(hovers) == 1 and [k for k, _ in hovers[0].tooltips] == ["step", "feature", "activation"]
    assert tl.mapper.low == pytest.approx(min(rects["activation"])) and tl.figure.y_range.start > tl.figure.y_range.end
    err = view.error_fig.source.data
    assert list(err["step"]) == list(range(run.n_steps))
    assert err["error"][0] == pytest.approx(view._enc["rel_err"][P - 1])
    assert err["error"][3] == pytest.approx(view._enc["rel_err"][P + 2])
    ref = view._enc["rel_err"][1:P]
    band = view.error_fig.band
    assert band.bottom == pytest.approx(ref.mean() - ref.std()) and band.top == pytest.approx(ref.mean() + ref.std())
    top = view._top_rows
    want = view._enc["features"].filter(pl.col("pos") == P + 4).sort("value", descending=True)
    assert top["feature"].to_list() == want["feature"].head(16).to_list()


def test_a_new_run_replaces_the_figures_data_and_creates_no_model(run, sample_model):
    view = view_of(run)
    figs = (view.timeline_fig.figure, view.error_fig.figure)
    before = {id(m) for fig in figs for m in fig.references()}
    other = ts.capture(sample_model, "for i in range(3):\n    print(", max_new_tokens=5, residual_layers=[3])
    view.state.set_trajectory(other, step=0)  # encoded at once without a server session
    assert view._enc["rel_err"].shape[0] == other.residual(3).shape[0]
    assert list(view.error_fig.source.data["step"]) == list(range(other.n_steps))
    assert {id(m) for fig in figs for m in fig.references()} == before


def test_the_summary_shows_the_comparison_and_without_features_a_box_says_why(run, tmp_path):
    from trajscope.ui.views.features import comparison_table

    view = view_of(run)
    assert not view.alert.visible and all(part.visible for part in view._parts)
    shown = fp.display_table(comparison_table(view._enc, run.prompt_len))
    assert shown["fvu"][0] and f"<td>{shown['fvu'][0]}</td>" in view.summary_table.object
    view.sae_path = str(tmp_path / "no-sae-here")
    assert view._enc is None and view.message
    assert view.alert.visible and view.alert.object == md_text(view.message)
    assert not any(part.visible for part in view._parts)


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
