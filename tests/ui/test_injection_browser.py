"""Text stays text in the served app (headless Chromium): a payload typed into every text field, a feature
label and the prompt, and files in the runs folder with markup in their names or a bad meta.json.

No dialog opens, no injected node appears (searched through every shadow root: Panel and Bokeh draw in
shadow DOM), the payload shows literally, and the comparison, calibration and study reports built from the run
hold it as text.
"""

from __future__ import annotations

import json
import shutil

import pytest

from trajscope.ui import saved_runs

pytestmark = pytest.mark.ui
pw = pytest.importorskip("playwright.sync_api")
from panel.tests.util import wait_until  # noqa: E402
from browser import set_field  # noqa: E402

TIMEOUT = 90_000
PAYLOAD = '<img src=x onerror=alert(1)> <script>alert(1)</script> <svg onload=alert(1)> "><b>x</b> @{x}{safe} $x'
SHOWN = PAYLOAD  # what the page must show, character for character

# every element under the document and its shadow roots, and what an injection would leave there
WALK = """() => {
  const all = [];
  const visit = root => { for (const el of root.querySelectorAll('*')) { all.push(el); if (el.shadowRoot) visit(el.shadowRoot); } };
  visit(document);
  const injected = all.filter(el =>
      (el.tagName === 'IMG' && el.getAttribute('src') === 'x') ||
      (el.tagName === 'SCRIPT' && (el.textContent || '').trim() === 'alert(1)') ||  // the payload's own script
      (el.tagName.toLowerCase() === 'svg' && el.hasAttribute('onload')) ||
      el.hasAttribute('onerror') || el.hasAttribute('onload') ||
      (el.tagName === 'B' && el.textContent === 'x'));
  const text = [];
  const texts = root => { for (const el of root.querySelectorAll('*')) {
      if (!['SCRIPT', 'STYLE'].includes(el.tagName)) for (const n of el.childNodes) if (n.nodeType === 3) text.push(n.textContent);
      if (el.shadowRoot) texts(el.shadowRoot); } };
  texts(document);
  return {injected: injected.map(el => el.outerHTML.slice(0, 120)), text: text.join('\\n')};
}"""


@pytest.fixture
def bad_runs(_runs_dir, short_run):
    """The runs folder holds a run whose directory name and schema version are markup, and a meta.json list."""
    d = _runs_dir / '<img src=x onerror=alert(1)> "><b>x'  # (no "/" in a name)
    short_run.save(d)
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps(dict(meta, schema_version="<svg onload=alert(1)>")))
    (_runs_dir / "listed").mkdir()
    (_runs_dir / "listed" / "meta.json").write_text("[1, 2, 3]")
    return d


@pytest.fixture
def sae_copy(tmp_path):
    from trajscope.ui.views.features import SAMPLE_SAE

    return shutil.copytree(SAMPLE_SAE, tmp_path / "sae")  # labels typed in the test are saved here


def check(page, dialogs, where: str, shows: str | None = None) -> str:
    """No dialog, no injected node; with ``shows``, first wait until the page shows that text literally."""
    if shows is not None:
        try:
            wait_until(lambda: shows in page.evaluate(WALK)["text"], page, timeout=30_000)
        except Exception:
            raise AssertionError(f"{where}: the page does not show {shows!r}") from None
    page.wait_for_timeout(300)  # let the last change render
    found = page.evaluate(WALK)
    assert not dialogs, (where, dialogs)
    assert not found["injected"], (where, found["injected"])
    return found["text"]


def test_payloads_stay_text_everywhere(bad_runs, sae_copy, app_page, tmp_path):
    page, app = app_page
    st = app.state
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    check(page, dialogs, "a runs folder with markup and a bad meta.json")  # the page is there at all
    # the saved-runs list names both, the bad one with its reason
    options = page.locator(".ts-saved-runs select option").all_text_contents()
    assert any(o.startswith("listed · not readable: meta.json holds a JSON list") for o in options), options
    assert any(o.startswith('<img src=x onerror=alert(1)> "><b>x · ') for o in options), options

    def alert_shows(what: str, expect: str = PAYLOAD) -> None:
        try:
            wait_until(lambda: expect in st.error, page, timeout=20_000)
        except Exception:
            raise AssertionError((what, st.error, st.status, st.busy)) from None
        check(page, dialogs, what, shows=expect)  # shown literally

    # the model box is a dropdown of the operator's models; a model name the page could not offer
    # (a crafted message) is refused by Generate, and the refusal echoes it as text
    st.model_source = PAYLOAD
    page.locator(".ts-generate button").click()
    alert_shows("model field")
    st.model_source = "sample"
    # the open-run field
    typed = str(bad_runs.parent / PAYLOAD.replace("/", "_"))
    set_field(page, "Open a saved run directory", typed)
    page.locator(".ts-open button").click()
    alert_shows("open-run field", typed)
    # keep residuals
    set_field(page, "Keep residuals of layers", PAYLOAD)
    wait_until(lambda: st.keep_residuals == PAYLOAD, page, timeout=TIMEOUT)
    page.locator(".ts-generate button").click()
    alert_shows("keep-residuals field")
    set_field(page, "Keep residuals of layers", "none")
    # the runs picked from the saved-runs list: markup in the name and schema version; the JSON list
    for label in options:
        if label.startswith("<img") or label.startswith("listed"):
            page.locator(".ts-saved-runs select").select_option(label=label)
            wait_until(lambda: bool(st.error) and st.run_path.endswith(label.split(" · ")[0]), page, timeout=TIMEOUT)
            check(page, dialogs, f"saved run {label}")
    check(page, dialogs, "schema version", shows="schema version <svg onload=alert(1)>")  # shown as text

    # generate with the payload as the prompt
    area = page.locator(".ts-prompt textarea")
    area.fill(PAYLOAD)
    area.press("Tab")
    set_field(page, "Max new tokens", 8)
    wait_until(lambda: st.prompt == PAYLOAD and st.max_new_tokens == 8, page, timeout=TIMEOUT)
    demo = st.trajectory.run_id
    page.locator(".ts-generate button").click()
    wait_until(lambda: not st.busy and st.trajectory is not None and st.trajectory.run_id != demo, page, timeout=TIMEOUT)
    run = st.trajectory
    assert run.meta["prompt"] == PAYLOAD
    check(page, dialogs, "generated run")

    # every card; the text fields of each
    for tab in ("Overview", "Attention", "SAE features", "Drift", "Steering", "Eviction", "Compaction", "Export"):
        page.locator(".bk-tab", has_text=tab).first.click()
        page.wait_for_timeout(1500)
        check(page, dialogs, f"{tab} card")
        if tab == "SAE features":
            set_field(page, "SAE", PAYLOAD)
            wait_until(lambda: PAYLOAD in app.features.message, page, timeout=TIMEOUT)
            check(page, dialogs, "SAE field", shows=SHOWN)
            set_field(page, "SAE", str(sae_copy))
            card = app.features.card
            wait_until(lambda: app.features._sae_loaded_from == str(sae_copy) and app.features._enc is not None
                       and card.feature is not None and card.labels.path == sae_copy / "labels.json",
                       page, timeout=TIMEOUT)
            set_field(page, "Label (press Enter to save)", PAYLOAD)
            wait_until(lambda: app.features.card.labels.get(app.features.card.feature) == PAYLOAD, page, timeout=TIMEOUT)
            check(page, dialogs, "feature label", shows=f"f{app.features.card.feature} · {SHOWN}")  # the header
            assert json.loads((sae_copy / "labels.json").read_text())[str(app.features.card.feature)] == PAYLOAD
        if tab == "Drift":
            set_field(page, "Profile", PAYLOAD)
            wait_until(lambda: PAYLOAD in app.study_cards["drift"].settings.message, page, timeout=TIMEOUT)
            check(page, dialogs, "profile field", shows=SHOWN)
        if tab == "Steering":
            set_field(page, "CAA contrast pairs", PAYLOAD)
            page.get_by_role("button", name="Steer", exact=True).click()
            wait_until(lambda: PAYLOAD in app.study_cards["steering"].settings.status, page, timeout=TIMEOUT)
            check(page, dialogs, "pairs field", shows=SHOWN)
            set_field(page, "Sweep depths", PAYLOAD)
            page.get_by_role("button", name="Depth sweep").click()
            wait_until(lambda: "Depths must be" in app.study_cards["steering"].settings.status, page, timeout=TIMEOUT)
            check(page, dialogs, "sweep depths field", shows=f"not '{SHOWN}'")
        if tab == "Export":
            set_field(page, "Compare with run directory (optional)", PAYLOAD)
            page.locator(".ts-download-report button").click()
            wait_until(lambda: PAYLOAD in st.error, page, timeout=TIMEOUT)
            check(page, dialogs, "compare field", shows=SHOWN)

    # the comparison report of that run (and the demo run), opened in the same browser
    from trajscope.model import sample_data_dir
    from trajscope.reports.comparison import compare

    out = compare([run, sample_data_dir() / "runs" / "demo"]).save(tmp_path / "report.html")
    html = out.read_text()
    assert "<img src=x" not in html and "<script>alert(1)" not in html and "<svg onload" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    page.goto(out.as_uri())
    page.wait_for_timeout(2000)
    check(page, dialogs, "comparison report")
    saved = saved_runs.list_runs()
    assert saved  # the generated run was saved and listed beside the bad ones

    # the calibration report on a prompt file made of that run's prompt (payload ids, source file, text and an
    # SAE directory named with markup), and the study report of its study folders, opened in the same browser
    from test_calibrate import TINY
    from trajscope.calibration import calibrate
    from trajscope.reports.studies import study_report

    name = PAYLOAD.replace("/", "_")
    prompts = tmp_path / "payload.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"{PAYLOAD} {i}", "source": f"{name}{i % 2}.txt",
                                           "prompt": run.meta["prompt"]}) + "\n" for i in range(4)))
    sae = shutil.copytree(sae_copy, tmp_path / name)
    out = tmp_path / "calib"
    calibrate("sample", out, prompts=[str(prompts)], saes=[str(sae)],
              settings=TINY, only=("drift", "sae-drift", "steering"))
    for html_file in (out / "report.html", study_report(sorted(p for p in (out / "studies").iterdir()), tmp_path / "s.html")):
        html = html_file.read_text()
        assert "<img src=x" not in html and "<script>alert(1)" not in html and "<svg onload" not in html
        assert "&lt;img src=x onerror=alert(1)&gt;" in html, html_file
        page.goto(html_file.as_uri())
        page.wait_for_timeout(2000)
        check(page, dialogs, html_file.name, shows=name)
