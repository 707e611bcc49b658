"""The Compaction card in the served app (headless Chromium): a typed-in session, run, three setups shown.

Serves :func:`trajscope.ui.views.app.default_page` in-process on the shipped demo run, as
``test_eviction_browser.py`` does, drives the card from the page (a bad field first, then a session
edited in the fields) and checks the result on the server against the study run directly
(:func:`trajscope.studies.compaction.compaction` on the same session), and that the page shows it.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from trajscope.studies.compaction.study import compaction
from trajscope.studies.sessions import synthetic_sessions

pytestmark = pytest.mark.ui
pw = pytest.importorskip("playwright.sync_api")
from panel.tests.util import wait_until  # noqa: E402
from browser import TITLES, set_field  # noqa: E402

# the length of each named column in the page's data sources that have one, sorted by column name
COLUMN_LENGTHS = """(cols) => Bokeh.documents.flatMap(d => [...d.all_models])
    .filter(m => m.data !== undefined && cols.some(c => c in m.data))
    .map(m => cols.filter(c => c in m.data).map(c => [c, m.data[c].length])).flat()
    .sort().map(([c, n]) => n)"""

TIMEOUT = 90_000


def test_compaction_fields_show_every_line_of_the_session(app_page):
    page, app = app_page
    page.locator(".bk-tab", has_text="Compaction").click()
    page.locator(".ts-cp-run button").wait_for(timeout=TIMEOUT)
    s = app.study_cards["compaction"].settings
    names = ["sys", "T1", "T2", "summary", "T3", "New tokens"]
    boxes = [page.get_by_label(n, exact=True) for n in names]
    for box in boxes:
        box.wait_for(timeout=TIMEOUT)
    wait_until(lambda: all(b.evaluate("el => el.scrollHeight <= el.clientHeight + 1") for b in boxes[:5]), page,
               timeout=15_000)  # no field hides lines of its segment (sys and T1 had lines out of sight)
    assert s.t1.count("\n") >= 2  # the synthetic session's T1 spans several lines
    rects = [b.bounding_box() for b in boxes]
    for name, upper, lower in zip(names, rects, rects[1:]):
        assert upper["y"] + upper["height"] <= lower["y"], f"the {name} field overlaps the one below it"


def test_compaction_card_runs_a_typed_session_like_the_study(app_page, sample_model):
    page, app = app_page
    s = app.study_cards["compaction"].settings
    page.locator(".bk-tab", has_text="Compaction").click()
    page.locator(".ts-cp-run button").wait_for(timeout=TIMEOUT)
    assert s.session().session_id == "syn0000"  # the synthetic default
    set_field(page, "T2", "", key="Tab")  # bad input: one clear message on the page
    wait_until(lambda: s.t2 == "", page, timeout=TIMEOUT)
    page.locator(".ts-cp-run button").click()
    page.locator(".ts-cp-status", has_text="missing the segment(s) t2").wait_for(timeout=TIMEOUT)
    set_field(page, "T2", "def helper(x):\n    return x + 1\n", key="Tab")
    set_field(page, "T3", "assert user_id ==", key="Tab")
    set_field(page, "New tokens", 6)
    wait_until(lambda: (s.t3, s.max_new_tokens) == ("assert user_id ==", 6) and s.t2.startswith("def helper"),
               page, timeout=TIMEOUT)
    session = s.session()
    assert session.session_id == "typed"
    syn = synthetic_sessions(1)[0]  # the fields not typed in keep their text, newlines included
    assert (session.sys, session.t1, session.summary) == (syn.sys, syn.t1, syn.summary)
    page.locator(".ts-cp-run button").click()
    wait_until(lambda: s.result is not None and not s.busy, page, timeout=TIMEOUT)
    for title in ("T3 hidden states vs the full context C", "Attention of T3's queries on the summary",
                  "Probe of the masked fact by layer"):
        wait_until(lambda: any(title in t for t in page.evaluate(TITLES)), page, timeout=TIMEOUT)
    # the figures are built before any result: their data reach the page with it (a line per setup, a point per layer)
    n_layers = sample_model.n_layers
    wait_until(lambda: page.evaluate(COLUMN_LENGTHS, ["rel_l2", "summary_mass"]) == [n_layers] * 7, page,
               timeout=TIMEOUT)
    page.locator(".ts-cp-summary", has_text="Session typed").wait_for(timeout=TIMEOUT)

    res = s.result.result  # the card's Result of the one session
    ref = compaction(sample_model, [session], probe=False, max_new_tokens=6, n_boot=50)
    key = ["pair", "layer", "t3_index"]
    np.testing.assert_array_equal(res.tables["compaction_states"].sort(key)["rel_l2"].to_numpy(), ref.tables["compaction_states"].sort(key)["rel_l2"].to_numpy())
    np.testing.assert_array_equal(res.tables["compaction_next_token"].sort("pair", "t3_index")["kl"].to_numpy(),
                                  ref.tables["compaction_next_token"].sort("pair", "t3_index")["kl"].to_numpy())
    akey = ["setup", "layer", "t3_index"]
    np.testing.assert_array_equal(res.tables["compaction_attention"].sort(akey)["summary_mass"].to_numpy(),
                                  ref.tables["compaction_attention"].sort(akey)["summary_mass"].to_numpy())
    for r in ref.tables["compaction_decode"].iter_rows(named=True):
        assert (s.result.continuations[r["setup"]], s.result.first_divergence[r["setup"]]) == (r["text"],
                                                                                              r["first_divergence"])
    # the three continuations are on the page, side by side
    for setup in ("A", "B", "C"):
        cont = s.result.continuations[setup]
        text = cont.strip().splitlines()[0].strip() if cont.strip() else ""
        box = page.locator(f".ts-cp-{setup}")
        box.wait_for(timeout=TIMEOUT)
        if text:
            assert text in box.inner_text()
    a_mass = ref.tables["compaction_attention"].filter((pl.col("setup") == "A") & (pl.col("layer") == 5))["summary_mass"].mean()
    assert f"{a_mass:.3f} (A)" in s.summary
