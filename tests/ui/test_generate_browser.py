"""Generate in the served app (headless Chromium): new runs feed every card, Stop, a responsive page.

Each test serves :func:`trajscope.ui.views.app.default_page` in-process on the
shipped demo run, then generates a *new* run from the page, as a user would.
"""

from __future__ import annotations

import pytest


pytestmark = pytest.mark.ui
pw = pytest.importorskip("playwright.sync_api")
from panel.tests.util import wait_until  # noqa: E402
from browser import TITLES, set_field  # noqa: E402

TIMEOUT = 90_000


def generate(page, app, n: int, prompt: str = "class Stack:\n    def push(self, x):\n") -> None:
    area = page.locator(".ts-prompt textarea")
    area.click()
    area.fill("")
    area.press_sequentially(prompt.replace("\n", " "))
    area.press("Tab")  # a change event: the prompt reaches the server
    prompt = prompt.replace("\n", " ")
    set_field(page, "Max new tokens", n)
    try:
        wait_until(lambda: app.state.max_new_tokens == n and app.state.prompt == prompt, page, timeout=TIMEOUT)
    except Exception:
        raise AssertionError((app.state.max_new_tokens, app.state.prompt, page.get_by_label("Max new tokens", exact=True).input_value()))
    page.locator(".ts-generate button").click()


def test_sae_and_drift_show_plots_for_a_new_run(app_page):
    page, app = app_page
    demo = app.state.trajectory.run_id
    generate(page, app, 12)
    wait_until(lambda: not app.state.busy and app.state.trajectory.run_id != demo, page, timeout=TIMEOUT)
    traj = app.state.trajectory
    assert traj.meta["prompt"].startswith("class Stack")
    page.locator(".bk-tab", has_text="SAE features").click()
    wait_until(lambda: app.features._enc is not None and any("Feature timeline" in t for t in page.evaluate(TITLES)),
               page, timeout=TIMEOUT)
    assert app.features._enc is not None and app.features._enc["rel_err"].shape[0] == traj.residual(3).shape[0]
    page.locator(".bk-tab", has_text="Drift").click()
    wait_until(lambda: app.study_cards["drift"].settings.drift is not None
               and any("Residual drift" in t for t in page.evaluate(TITLES)), page, timeout=TIMEOUT)
    assert app.study_cards["drift"].settings.drift["pos"].max() >= traj.prompt_len
    # the step box shows the step on screen
    box = page.locator(".ts-step-box input")
    wait_until(lambda: box.input_value() == str(app.state.step) == str(traj.n_steps - 1), page, timeout=TIMEOUT)


def test_stop_ends_within_one_step_and_keeps_steps(app_page):
    page, app = app_page
    generate(page, app, 300)
    wait_until(lambda: app.controls.job is not None and app.controls.job.steps_done >= 20, page, timeout=TIMEOUT)
    page.locator(".ts-stop button").click()
    wait_until(lambda: not app.state.busy, page, timeout=TIMEOUT)
    job, traj = app.controls.job, app.state.trajectory
    assert traj.meta["stop_reason"] == "cancelled"
    assert job.steps_at_stop is not None and traj.n_steps <= job.steps_at_stop + 1, (job.steps_at_stop, traj.n_steps)
    assert traj.n_steps >= 20 and len(traj.tokens) == traj.prompt_len + traj.n_steps


def test_a_long_run_streams_its_steps_to_the_ticker_and_the_live_figure(app_page):
    """300 steps reach the page while they are generated, not only at the end.

    How long the page's main-thread tasks take meanwhile is measured by ``benchmarks/app_generate.py``
    (its streaming window), not asserted here.
    """
    page, app = app_page
    ticks = set()
    app.controls.ticker.param.watch(lambda e: ticks.add(e.new), "step")
    generate(page, app, 300)
    wait_until(lambda: app.controls.job is not None and app.state.busy, page, timeout=TIMEOUT)
    wait_until(lambda: not app.state.busy, page, timeout=TIMEOUT)
    assert app.state.trajectory.n_steps == 300
    assert len(ticks) >= 3, f"the ticker showed too few intermediate steps: {sorted(ticks)}"
    assert app.live.n_streamed > 0, "the live figure got no steps before the run ended"


READOUT_MS = """async (before) => {
  const deep = () => { let out = ''; const walk = r => r.querySelectorAll('*').forEach(e => {
      if (e.classList && e.classList.contains('ts-step-readout')) out = (e.shadowRoot || e).textContent;
      if (e.shadowRoot) walk(e.shadowRoot); }); walk(document); return out; };
  const t0 = window.__key;
  while (deep() === before) { await new Promise(r => requestAnimationFrame(r)); if (performance.now() - t0 > 5000) return -1; }
  return performance.now() - t0;
}"""


def test_step_changes_move_the_readout_during_a_long_generation(app_page):
    """A 1,000-step generation runs while the user steps through the run on screen: every key press shows.

    Each press must change the step readout (within 5 s); the latency's p95 is measured by
    ``benchmarks/app_generate.py`` (``--presses-generating``), not asserted here.
    """
    page, app = app_page
    page.evaluate("() => document.addEventListener('keydown', () => { window.__key = performance.now(); }, true)")
    generate(page, app, 1000)
    wait_until(lambda: app.controls.job is not None and app.controls.job.steps_done >= 5, page, timeout=TIMEOUT)
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    times = []
    for i in range(24):
        if not app.state.busy:
            break
        before = page.locator(".ts-step-readout").first.evaluate("el => (el.shadowRoot || el).textContent")
        page.keyboard.press("ArrowLeft" if app.state.step > 0 else "ArrowRight")
        times.append(page.evaluate(READOUT_MS, before))
    app.controls.stop()
    wait_until(lambda: not app.state.busy, page, timeout=TIMEOUT)
    assert len(times) >= 10, f"the generation ended before enough key presses: {times}"
    assert min(times) >= 0, f"a key press left the step readout unchanged for 5 s (ms per press): {times}"


def test_a_temperature_out_of_range_is_refused_with_one_sentence(app_page):
    """The field sends what was typed: a bound on the field made the browser keep the old value while showing -1,
    and Generate ran greedy, unsaid."""
    page, app = app_page
    demo = app.state.trajectory.run_id
    set_field(page, "Temperature", -1)
    wait_until(lambda: app.state.temperature == -1, page, timeout=TIMEOUT)
    page.locator(".ts-generate button").click()
    page.locator(".ts-error", has_text="Temperature must be from 0 (greedy) to 5 (it is -1").wait_for(timeout=TIMEOUT)
    assert app.state.trajectory.run_id == demo and not app.state.busy  # nothing ran, the run on screen stays
    set_field(page, "Temperature", 0.7)
    wait_until(lambda: app.state.temperature == 0.7, page, timeout=TIMEOUT)
