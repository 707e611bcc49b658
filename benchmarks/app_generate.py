"""Benchmark: the app's Generate against a plain capture, and keypress-to-plots latency, in one run.

1. **Generate vs capture.** Serves the app in-process, drives it in headless
   Chromium (``/usr/bin/chromium``) like a user: types a prompt, sets max new
   tokens, clicks Generate and waits until the browser shows "Done". The same
   prompt is then captured with :func:`trajscope.capture` and the very config the
   app's job resolved (same layers kept, same rows computed): what the CLI runs.
   Reports the ratio app / capture for 64 and 300 tokens (target ≤ 1.5×). The
   model is loaded before either is timed.
2. **Keypress to all plots updated.** On the finished 300-step run, presses →
   or ← and measures in the browser, from the ``keydown`` event to the frame
   where every step cursor of the visible tab (token strip, telemetry curves, or
   the attention heatmap's row box) sits at the new step — the values the server
   computes for that step. Reports p50 / p95 over the presses for the Overview and
   Attention tabs (target p95 ≤ 250 ms on the 2-core CI machine).

Run: ``python benchmarks/app_generate.py [--presses 60] [--out benchmarks/results/app_generate.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = pathlib.Path(__file__).resolve().parents[1]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PROMPT = "class Stack:\n    def push(self, x):\n"
# resolves with ms from the last keydown to the first frame where every model has the expected properties
MEASURE = """async (expected) => {
  const models = Bokeh.documents.map(d => d).flatMap(d => Object.keys(expected).map(id => [id, d.get_model_by_id(id)]))
      .filter(([id, m]) => m);
  const ok = () => models.every(([id, m]) => Object.entries(expected[id]).every(([k, v]) => Math.abs(m[k] - v) < 1e-6));
  while (!ok()) { await new Promise(r => requestAnimationFrame(r)); if (performance.now() - window.__key > 10000) return -1; }
  await new Promise(r => requestAnimationFrame(r));  // the frame that paints it
  return performance.now() - window.__key;
}"""
KEYTIME = "() => { window.__key = 0; document.addEventListener('keydown', () => { window.__key = performance.now(); }, true); }"


def wait(cond, timeout=300.0):
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            raise TimeoutError("timed out")
        time.sleep(0.02)


def cursors(app, tab: str) -> list:
    """The step cursors drawn on ``tab``."""
    if tab == "Overview":
        return [app.tokens.cursor, *app.telemetry.cursors.values()]
    return [app.tokens.cursor, app.attention.row_cursor]


def expected(cs, step: int) -> dict:
    out = {}
    for c in cs:
        if c is None:
            continue
        props = c.props(step)
        for anns in c.annotations:
            for a, p in zip(anns, props):
                if a.document is not None:
                    out[a.id] = {k: v for k, v in p.items() if isinstance(v, (int, float)) and k != "visible"}
    return {k: v for k, v in out.items() if v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presses", type=int, default=60, help="key presses per tab")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "app_generate.json"))
    ap.add_argument("--port", type=int, default=5093)
    args = ap.parse_args()
    os.environ.setdefault("TRAJSCOPE_RUNS_DIR", tempfile.mkdtemp(prefix="trajscope-bench-runs-"))
    import panel as pn
    import torch
    from playwright.sync_api import sync_playwright

    import trajscope as ts
    from trajscope.ui import runner
    from trajscope.ui.views.app import default_page

    model = runner.get_model("sample")  # loaded once, shared by the app and the capture
    apps = []

    def make():
        tpl = default_page()
        apps.append(tpl._trajscope)
        return tpl

    server = pn.serve(make, port=args.port, show=False, threaded=True, title="trajscope")
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                         f"{torch.get_num_threads()} threads", "date": time.strftime("%Y-%m-%d %H:%M"),
              "generate": {}, "keypress_ms": {}}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.goto(f"http://localhost:{args.port}/", timeout=120_000)
            page.locator(".ts-generate").wait_for(timeout=120_000)
            wait(lambda: apps and apps[0].state.trajectory is not None)
            app = apps[0]
            time.sleep(2)
            for n in (64, 300):
                area = page.locator(".ts-prompt textarea")
                area.fill(PROMPT)
                area.press("Tab")
                box = page.get_by_label("Max new tokens", exact=True)
                box.fill(str(n))
                box.press("Enter")
                wait(lambda: app.state.max_new_tokens == n and app.state.prompt == PROMPT)
                before = app.state.trajectory.run_id
                t0 = time.perf_counter()
                page.locator(".ts-generate button").click()
                wait(lambda: app.state.trajectory.run_id != before and not app.state.busy)
                wait(lambda: "Done" in page.locator(".ts-status").first.evaluate(
                    "el => (el.shadowRoot || el).textContent"))
                t_app = time.perf_counter() - t0
                traj, config = app.state.trajectory, app.controls.job.config
                ids = traj.token_ids[: traj.prompt_len]
                t1 = time.perf_counter()
                ref = ts.capture(model, PROMPT, config)
                t_cap = time.perf_counter() - t1
                assert ref.token_ids[: len(ids)] == ids and ref.n_steps == traj.n_steps
                result["generate"][str(n)] = {"steps": traj.n_steps, "app_s": t_app, "capture_s": t_cap,
                                              "ratio": t_app / t_cap, "target": "≤ 1.5",
                                              "app_job": dict(app.controls.job.timings)}
                print("   job:", app.controls.job.timings)
                print(f"{n} tokens: app {t_app:.2f} s, capture {t_cap:.2f} s, ratio {t_app / t_cap:.2f}")
            page.evaluate(KEYTIME)
            last = app.state.n_steps - 1
            for tab in ("Overview", "Attention"):
                page.locator(".bk-tab", has_text=tab).click()
                time.sleep(3)
                page.evaluate("() => document.activeElement && document.activeElement.blur()")
                times = []
                for _ in range(args.presses):
                    key = "ArrowLeft" if app.state.step > 0 else "ArrowRight"
                    target = app.state.step + (-1 if key == "ArrowLeft" else 1)
                    exp = expected(cursors(app, tab), target)
                    page.keyboard.press(key)
                    ms = page.evaluate(MEASURE, exp)
                    wait(lambda: app.state.step == target)
                    if ms >= 0:
                        times.append(ms)
                times.sort()
                p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
                result["keypress_ms"][tab] = {"n": len(times), "p50": statistics.median(times), "p95": p95,
                                              "cursors": len(exp), "target_p95": "≤ 250", "run_steps": last + 1}
                print(f"keypress → plots ({tab}, {len(exp)} cursors): p50 {statistics.median(times):.0f} ms, "
                      f"p95 {p95:.0f} ms over {len(times)}")
            browser.close()
    finally:
        server.stop()
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
