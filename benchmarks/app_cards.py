"""Benchmark and walk-through: a chat question on a real model in the served app, then every card.

Serves the app in-process on ``--model`` (default ``smollm2``) and drives headless Chromium
(``/usr/bin/chromium``) as a user would:

1. waits for the first page's own run (the page captures the demo prompt as it opens);
2. types ``--question`` into the prompt box (the Chat box is on: it is sent as a user message
   through the model's chat template), sets max new tokens, presses **Generate** and times, in the
   browser, the click to the first frame painted after the status reads "Done", and the save of the
   run that follows it (server-side);
3. presses → / ← ``--presses`` times and times each keypress to the frame where the step readout
   changed (p50 / p95);
4. opens every tab in order and times the click to the card **settled**: no ``trajscope-*`` worker
   thread alive on the server, the session not busy, no visible status line ending in "…", and two
   animation frames painted after that, or the last change in the number of rendered plots if that
   comes later (it is watched until it holds still for 0.6 s). A card that starts no work within 1 s
   reads about 1 s or more: for those the figure is an upper bound.
   Cards whose result needs a button (Steering: *Steer*; Eviction and Compaction: *Run*) get it
   pressed, and the time runs to the end of that work. Each card's screenshot goes to ``--shots``;
   a card showing an error alert is reported with the alert's text.

The page and the server share the machine's cores (the browser's CPU is not separated here).

Run: ``python benchmarks/app_cards.py [--model smollm2] [--out benchmarks/results/app_cards_smollm2.json]
[--shots /tmp/cards] [--readme-assets assets]`` (the last writes the README's screenshots).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import statistics
import sys
import tempfile
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from app_generate import ARGS, CLICK_TO_DONE  # noqa: E402  (the click → "Done" timer, one copy)
from app_load import READOUT  # noqa: E402  (the step readout as the page shows it)

MEASURE = """async (before) => {
  const read = %s;
  const t0 = window.__key;
  while (read() === before) { await new Promise(r => requestAnimationFrame(r)); if (performance.now() - t0 > 10000) return -1; }
  return performance.now() - t0;
}""" % READOUT
# plots BokehJS has laid out with a size (the visible tab's, the step bar's and the token strip's)
RENDERED = """() => {
  if (typeof Bokeh === 'undefined' || !Bokeh.index) return -1;
  const all = []; const walk = v => { all.push(v); for (const c of (v.child_views || [])) walk(c); };
  Object.values(Bokeh.index).forEach(walk);
  return all.filter(v => v.model && (v.model.type === 'Figure' || v.model.constructor.name === 'Figure'))
            .filter(v => v.el && v.el.getBoundingClientRect().width > 0).length;
}"""
FRAMES = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(performance.now()))))"
ACTIONS = {"Steering": "Steer", "Eviction": "Run", "Compaction": "Run"}  # a card's button that produces its result


def wait(cond, timeout: float = 600.0) -> None:
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            raise TimeoutError("timed out")
        time.sleep(0.02)


def settled(app) -> bool:
    """No trajscope worker thread is alive (the model's warm-up aside) and the session is not busy."""
    busy = [t for t in threading.enumerate() if t.name.startswith("trajscope-") and t.name != "trajscope-warm-up"]
    return not busy and not app.state.busy


def working(page) -> list[str]:
    """Visible texts that say work is under way (the cards' status lines end with an ellipsis)."""
    loc = page.get_by_text(re.compile(r"…\s*$"))
    return [t for t in (loc.nth(i).inner_text() for i in range(loc.count()) if loc.nth(i).is_visible()) if t.strip()]


def card_settled(app, page) -> bool:
    """:func:`settled` on the server, still so 0.3 s later, and no visible status line ending in "…"."""
    if not settled(app):
        return False
    time.sleep(0.3)
    return settled(app) and not working(page)


def started(app, page, within: float = 1.0) -> None:
    """Wait until the card's work has visibly started (a worker thread or a status line ending in "…"), at most
    ``within`` seconds: a card that needs no work shows neither."""
    t0 = time.time()
    while time.time() - t0 < within and settled(app) and not working(page):
        time.sleep(0.05)


def drawn(page, still: float = 0.6, timeout: float = 60.0) -> tuple[int, float]:
    """Wait until the number of rendered plots has not changed for ``still`` seconds; return it and the
    ``time.perf_counter()`` of its last change."""
    t0, last, since = time.perf_counter(), None, time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        n = page.evaluate(RENDERED)
        if n != last:
            last, since = n, time.perf_counter()
        elif time.perf_counter() - since >= still:
            break
        time.sleep(0.1)
    return (last if last is not None else -1), since


def alerts(page) -> list[str]:
    return [t.strip() for t in page.locator(".alert-danger").all_inner_texts() if t.strip()]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


README_SHOTS = {"Overview": "screenshot.png", "SAE features": "screenshot-sae.png", "Drift": "screenshot-drift.png"}


def crop_to_content(src: pathlib.Path, dst: pathlib.Path) -> None:
    """Save ``src`` cut below its last row of content in the main column (the page's tail is empty)."""
    import numpy as np
    from PIL import Image

    im = Image.open(src).convert("RGB")
    a = np.asarray(im).astype(int)[:, 400:-50, :]
    rows = np.where((np.abs(a - a[-5, 5, :]).sum(axis=2) > 30).any(axis=1))[0]
    bottom = min(im.height, int(rows.max()) + 20) if len(rows) else im.height
    im.crop((0, 0, im.width, bottom)).save(dst, optimize=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--question", default="What is a good way to learn to cook rice?")
    ap.add_argument("--tokens", type=int, default=64, help="max new tokens of the Generate")
    ap.add_argument("--presses", type=int, default=40)
    ap.add_argument("--out", default=None, help="JSON results (default benchmarks/results/app_cards_MODEL.json)")
    ap.add_argument("--shots", default=None, help="folder for one screenshot per card")
    ap.add_argument("--readme-assets", default=None, help="also write the README's three screenshots (Overview, SAE "
                    "features, Drift; cut to their content) into this folder, e.g. assets")
    ap.add_argument("--port", type=int, default=5097)
    args = ap.parse_args()
    out_path = pathlib.Path(args.out or ROOT / "benchmarks" / "results" / f"app_cards_{args.model}.json")
    shots = pathlib.Path(args.shots) if args.shots else (pathlib.Path(tempfile.mkdtemp(prefix="trajscope-shots-"))
                                                          if args.readme_assets else None)
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRAJSCOPE_RUNS_DIR", tempfile.mkdtemp(prefix="trajscope-cards-runs-"))
    import panel as pn
    import torch
    from playwright.sync_api import sync_playwright

    from trajscope.ui import runner, saved_runs
    from trajscope.ui.views.app import default_page

    save_times: list[float] = []
    save = saved_runs.save_run

    def timed_save(*a, **k):  # the app saves each generated run off the event loop once Generate ends
        t = time.perf_counter()
        try:
            return save(*a, **k)
        finally:
            save_times.append(time.perf_counter() - t)

    saved_runs.save_run = timed_save

    t0 = time.perf_counter()
    loading = threading.Thread(target=runner.get_model, args=(args.model,))  # as the app's warm-up does
    loading.start()
    loading.join()
    result = {"model": args.model, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
              "date": time.strftime("%Y-%m-%d %H:%M"), "model_load_s": time.perf_counter() - t0,
              "question": args.question, "tokens": args.tokens, "cards": {}}
    apps = []

    def make():
        tpl = default_page(model=args.model)
        apps.append(tpl._trajscope)
        return tpl

    server = pn.serve(make, port=args.port, show=False, threaded=True, title="trajscope")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 2400})
            t_open = time.perf_counter()
            page.goto(f"http://localhost:{args.port}/", timeout=300_000)
            page.locator(".ts-generate").wait_for(timeout=300_000)
            wait(lambda: apps and apps[0].state.trajectory is not None and settled(apps[0]))
            result["first_page_run_s"] = time.perf_counter() - t_open
            app = apps[0]
            # 2. the chat question
            area = page.locator(".ts-prompt textarea")
            area.fill(args.question)
            area.press("Tab")
            box = page.get_by_label("Max new tokens", exact=True)
            box.fill(str(args.tokens))
            box.press("Enter")
            wait(lambda: app.state.max_new_tokens == args.tokens and app.state.prompt == args.question)
            time.sleep(0.5)
            before = app.state.trajectory.run_id
            button = page.locator(".ts-generate button").element_handle()
            status = page.locator(".ts-status").first.element_handle()
            page.evaluate(CLICK_TO_DONE, [button, status])
            button.click()
            wait(lambda: app.state.trajectory.run_id != before and not app.state.busy)
            wait(lambda: page.evaluate("() => window.__t_done") is not None)
            wait(lambda: "Saved to" in app.state.status, timeout=120)
            traj = app.state.trajectory
            result["generate"] = {"save_s": save_times[-1], "click_to_done_s": page.evaluate("() => (window.__t_done - window.__t_click) / 1000"),
                                  "steps": traj.n_steps, "prompt_tokens": traj.prompt_len,
                                  "segments": sorted(set(traj.tokens["segment"].to_list()))
                                  if "segment" in traj.tokens.columns else [],
                                  "answer": "".join(traj.tokens["text"].to_list()[traj.prompt_len:])}
            print(f"Generate: {result['generate']['click_to_done_s']:.2f} s for {traj.n_steps} steps; "
                  f"answer: {result['generate']['answer'][:120]!r}")
            # 3. stepping
            page.evaluate("() => document.addEventListener('keydown', () => { window.__key = performance.now(); }, true)")
            times = []
            for i in range(args.presses):
                page.evaluate("() => document.activeElement && document.activeElement.blur()")
                before = page.evaluate(READOUT)
                page.keyboard.press("ArrowLeft" if i % 2 else "ArrowRight")
                times.append(page.evaluate(MEASURE, before))
            ok = [t for t in times if t >= 0]
            result["keypress_to_readout_ms"] = {"p50": statistics.median(ok), "p95": pct(ok, 0.95), "n": len(times),
                                                "timed_out": len(times) - len(ok)}
            print(f"keypress → readout: p50 {statistics.median(ok):.0f} ms, p95 {pct(ok, 0.95):.0f} ms")
            # 4. every card
            names = [name for name, _ in app._cards]
            for name in names:
                t_click = time.perf_counter()
                page.locator(".bk-tab", has_text=name).first.click()
                started(app, page)
                wait(lambda: card_settled(app, page))
                action = ACTIONS.get(name)
                if action:
                    btn = page.get_by_role("button", name=action, exact=True)
                    visible = [b for b in btn.all() if b.is_visible()]
                    if visible:
                        visible[0].click()
                        started(app, page)
                        wait(lambda: card_settled(app, page), timeout=900)
                page.evaluate(FRAMES)
                t_settled = time.perf_counter()
                n_plots, t_plots = drawn(page)
                took = max(t_settled, t_plots) - t_click
                found = alerts(page)
                result["cards"][name] = {"open_s": took, "action": action, "alerts": found, "plots_on_page": n_plots}
                if shots:
                    shot = shots / f"{len(result['cards']):02d}_{name.replace(' ', '_')}.png"
                    page.screenshot(path=str(shot), full_page=True)
                    if args.readme_assets and name in README_SHOTS:
                        crop_to_content(shot, pathlib.Path(args.readme_assets) / README_SHOTS[name])
                print(f"{name}: {took:.2f} s{' (after ' + action + ')' if action else ''}"
                      f"{'; ALERT: ' + ' | '.join(found) if found else ''}")
            browser.close()
    finally:
        server.stop()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
