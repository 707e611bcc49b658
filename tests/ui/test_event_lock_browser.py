"""A browser event that Panel handles without the document lock still redraws the app's figures.

Typing a feature label and pressing Enter sends the label's debounced value and an Enter event together;
Panel applies both in one callback without Bokeh's document lock (see :mod:`trajscope.ui.views.unlocked`).
The label must reach the SAE timeline's row names, and Bokeh's process-wide ``curdoc()`` stack must be left
empty (a failed change leaves a stale document there, which breaks ``bokeh.embed`` later in the process).
"""

from __future__ import annotations

import logging
import shutil

import pytest


pytestmark = pytest.mark.ui
pw = pytest.importorskip("playwright.sync_api")
from panel.tests.util import wait_until  # noqa: E402
from browser import serve_app, set_field  # noqa: E402

TIMEOUT = 90_000


def row_names(app) -> list:
    """The SAE timeline's row names, as its y axis shows them."""
    return list(app.features.timeline_fig.figure.yaxis[0].major_label_overrides.values())


def test_a_label_typed_with_enter_redraws_the_timeline_and_leaves_no_stale_document(page, sample_model, fresh_models,
                                                                                     tmp_path, caplog):
    from bokeh.io import doc as bokeh_doc

    from trajscope.ui import runner
    from trajscope.ui.views.app import default_page
    from trajscope.ui.views.features import SAMPLE_SAE

    runner._MODELS[("sample", False, None)] = sample_model
    sae = shutil.copytree(SAMPLE_SAE, tmp_path / "sae")  # the label is saved beside the SAE
    app = serve_app(page, default_page)
    page.locator(".bk-tab", has_text="SAE features").first.click()
    set_field(page, "SAE", str(sae))
    card = app.features.card
    wait_until(lambda: app.features._sae_loaded_from == str(sae) and app.features._enc is not None
               and card.feature is not None, page, timeout=TIMEOUT)
    # the label goes on a feature the timeline shows: its first row, chosen in the page's feature chooser
    # (chosen again if the chooser's options were being replaced as it was chosen)
    first = row_names(app)[0]
    for _ in range(10):
        page.get_by_label("Feature", exact=True).select_option(label=first)
        page.wait_for_timeout(500)
        if card.feature is not None and card.feature_name(card.feature) == first:
            break
    assert card.feature_name(card.feature) == first, (card.feature, first)
    caplog.set_level(logging.ERROR)
    for label in ("first label", "second label"):
        set_field(page, "Label (press Enter to save)", label)
        wait_until(lambda: card.labels.get(card.feature) == label, page, timeout=TIMEOUT)
        wait_until(lambda: any(label in str(n) for n in row_names(app)), page, timeout=TIMEOUT)
    assert not [r for r in caplog.records if "_pending_writes" in r.getMessage()], [r.getMessage() for r in caplog.records]
    assert bokeh_doc._PATCHED_CURDOCS == []
