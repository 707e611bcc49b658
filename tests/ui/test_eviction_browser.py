"""The Eviction card in the served app (headless Chromium): pick a policy and budget, run, see the plots.

Serves :func:`trajscope.ui.views.app.default_page` in-process on the shipped demo run, as
``test_generate_browser.py`` does, and drives the card from the page; the result on the server
is checked against :func:`trajscope.studies.eviction.engine.eviction` run directly on the same prompt.
"""

from __future__ import annotations

import numpy as np
import pytest

from trajscope.studies.eviction.engine import eviction

pytestmark = pytest.mark.ui
pw = pytest.importorskip("playwright.sync_api")
from panel.tests.util import wait_until  # noqa: E402
from browser import TITLES, set_field  # noqa: E402

TIMEOUT = 90_000


def test_eviction_card_runs_the_study_and_draws(app_page, sample_model):
    page, app = app_page
    s = app.study_cards["eviction"].settings
    page.locator(".bk-tab", has_text="Eviction").click()
    page.locator(".ts-ev-run button").wait_for(timeout=TIMEOUT)
    page.get_by_label("Policy", exact=True).select_option(label="H2O")
    set_field(page, "Window", 3)
    set_field(page, "Budget (fraction of prompt)", 2)  # bad input: one clear message on the page
    wait_until(lambda: s.budget == 2, page, timeout=TIMEOUT)
    page.locator(".ts-ev-status", has_text="Budget must be a fraction").wait_for(timeout=TIMEOUT)
    set_field(page, "Budget (fraction of prompt)", 0.5)
    wait_until(lambda: (s.policy, s.budget, s.window, s.status) == ("h2o", 0.5, 3, ""), page, timeout=TIMEOUT)
    page.locator(".ts-ev-run button").click()
    wait_until(lambda: s.result is not None and not s.busy, page, timeout=TIMEOUT)
    for title in ("Kept prompt keys — h2o, budget 0.5", "Decode attention vs the kept set — h2o, budget 0.5",
                  "Masked re-run vs full cache — h2o, budget 0.5"):
        wait_until(lambda: any(title in t for t in page.evaluate(TITLES)), page, timeout=TIMEOUT)
    page.locator(".ts-ev-summary", has_text="h2o, budget 0.5").wait_for(timeout=TIMEOUT)

    traj = app.state.trajectory
    P = traj.prompt_len
    ref = eviction(sample_model, [{"prompt": traj.token_ids[:P], "id": traj.run_id}], policies=["h2o"],
                   budgets=[0.5], max_new_tokens=len(traj.token_ids) - P, window=3)
    res = s.result
    assert res.tables["eviction_kept"]["kept_pos"].to_list() == ref.tables["eviction_kept"]["kept_pos"].to_list()
    np.testing.assert_allclose(res.tables["eviction_steps"]["evicted_mass"].to_numpy(), ref.tables["eviction_steps"]["evicted_mass"].to_numpy())
    np.testing.assert_allclose(res.tables["eviction_rerun"]["kl_to_full"].to_numpy(), ref.tables["eviction_rerun"]["kl_to_full"].to_numpy(), atol=1e-6)
    assert res.tables["eviction_rerun"]["token_agrees"].to_list() == ref.tables["eviction_rerun"]["token_agrees"].to_list()
    # the step cursor follows the app's step (set from the page's step box)
    box = page.locator(".ts-step-box input")
    box.fill("5")
    box.press("Enter")
    wait_until(lambda: app.state.step == 5, page, timeout=TIMEOUT)
    spans = [a[0] for a in app.study_cards["eviction"].cursor.annotations]
    wait_until(lambda: len(spans) >= 2 and all(sp.location == 5.0 for sp in spans), page, timeout=TIMEOUT)
    ids = [sp.id for sp in spans]
    wait_until(lambda: page.evaluate("""(ids) => Bokeh.documents.flatMap(d => [...d.all_models])
        .filter(m => ids.includes(m.id)).map(m => m.location)""", ids) == [5] * len(ids), page, timeout=TIMEOUT)
