"""Benchmark and walk-through: a chat question on a real model in the served app, then every card.

Serves the app in-process on ``--model`` (default ``smollm2``) and drives headless Chromium
(``/usr/bin/chromium``) as a user would:

1. waits for the first page's own run (the page captures the demo prompt as it opens);
2. types ``--question`` into the prompt box (the Chat box is on: it is sent as a user message
   through the model's chat template), sets max new tokens, presses **Generate** and times, in the
   browser, the click to the first frame painted after the status reads "Done", and the save of the
   run that follows it (server-side);
3. presses → / ← ``--presses`` times and times each keypress to the frame where the step readout
   changed (p50 / p95), on the Overview (``keypress_to_readout_ms``); with ``--step-tabs`` (e.g.
   ``--step-tabs Export``), then again on each tab named, opened and ready first (``keypress_to_readout_ms_by_tab``,
   the Overview's reading included; phases "stepping on …"), and back to the Overview (phase "back to Overview
   after stepping") before step 4;
4. for every card in tab order (issue 32: "every card ready ≤ 2 s after Generate ends"): goes back to
   Overview, presses **Generate** again, and in the page, in the frame where the status reads "Done",
   clicks the card's tab (the Overview card is on screen already). The card's readiness is timed in the
   browser from that frame to the first observation of the card **ready**: its tab active, no
   ``trajscope-*`` worker thread alive on the server, the session not busy, no visible status line ending
   in "…", the tab's content drawn (not the placeholder of a dynamic tab the server has not sent yet), and the
   set of rendered, visible plots (Bokeh model ids) unchanged since and not the Overview's (with the Overview
   inside the dynamic Tabs, its plots stayed on screen until the server sent the new tab; the page now hides
   it in the browser as the tab changes), with all of that still holding ``--hold``
   seconds later (the hold only confirms; it is not counted, and a later change starts the stretch
   again). The state is polled every ~30 ms (each poll waits for an animation frame), so a reading is
   late by at most about one poll. There is no fixed wait: a card that needs no work reads the time its
   plots take to be drawn.
   Cards whose result needs a button (Steering: *Steer*; Eviction and Compaction: *Run*) then get it
   pressed, and the time from the press to the card ready again is reported apart (``action_s``). Each
   card's screenshot goes to ``--shots``; a card showing an error alert is reported with the alert's text.
4b. goes back to the Overview and times ``--presses`` keypresses again (``keypress_to_readout_ms_by_tab``:
   "Overview, after every card"; phase "stepping after every card"): the state a user is in after looking
   at each card, and the reading that shows work a hidden card does on each step;
5. **Main-thread long tasks** (issue 32: "no main-thread task > 200 ms"): a ``PerformanceObserver`` for
   ``longtask`` entries (Chromium reports every main-thread task over 50 ms) is installed before the page
   loads; each task is assigned to the phase it started in (page open, Generate, stepping, and per card:
   the return to Overview, its Generate, the card, its action), and the JSON gives per phase the count, the longest and the
   count over 200 ms, and every task over 200 ms. The summary line counts every phase after the page opened.

The page and the server share the machine's cores (the browser's CPU is not separated here).

Run: ``python benchmarks/app_cards.py [--model smollm2] [--out benchmarks/results/app_cards_smollm2.json]
[--shots /tmp/cards] [--readme-assets assets]`` (the last writes the README's screenshots). Issue 32's
readings on SmolLM2: ``python benchmarks/app_cards.py --model smollm2`` (about 3 minutes on this machine);
a smoke run on the sample model: ``python benchmarks/app_cards.py --model sample --presses 4``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from app_generate import ARGS, CLICK_TO_DONE, load_model, serve_pages  # noqa: E402  (the click → "Done" timer, the served app: one copy)
from app_load import READOUT  # noqa: E402  (the step readout as the page shows it)

MEASURE = """async (before) => {
  const read = %s;
  const t0 = window.__key;
  while (read() === before) { await new Promise(r => requestAnimationFrame(r)); if (performance.now() - t0 > 10000) return -1; }
  return performance.now() - t0;
}""" % READOUT
# the ids of the plots BokehJS has laid out with a size and that are not hidden (the visible tab's, the step
# bar's and the token strip's; checkVisibility() is false under display: none or content-visibility: hidden,
# how the page hides the Overview while another tab is active; asked first, as a size asked of a hidden element
# would lay it out): ids, not a count, so that one card's plots replacing another's as many is seen as a change
RENDERED = """() => {
  if (typeof Bokeh === 'undefined' || !Bokeh.index) return [];
  const all = []; const walk = v => { all.push(v); for (const c of (v.child_views || [])) walk(c); };
  Object.values(Bokeh.index).forEach(walk);
  return all.filter(v => v.model && (v.model.type === 'Figure' || v.model.constructor.name === 'Figure'))
            .filter(v => v.el && (!v.el.checkVisibility || v.el.checkVisibility()) && v.el.getBoundingClientRect().width > 0)
            .map(v => v.model.id).sort();
}"""
# whether a Tabs' active panel still holds the placeholder of a dynamic tab not drawn yet (Panel's Spacer
# tagged "hidden"), i.e. the server has not sent the tab just opened
PLACEHOLDER = """() => {
  if (typeof Bokeh === 'undefined' || !Bokeh.index) return false;
  let found = false;
  const walk = v => {
    const m = v.model;
    if (m && Array.isArray(m.tabs) && typeof m.active === 'number') {
      const panel = m.tabs[m.active];
      if (panel && panel.child && (panel.child.tags || []).includes('hidden')) found = true;
    }
    for (const c of (v.child_views || [])) walk(c);
  };
  Object.values(Bokeh.index).forEach(walk);
  return found;
}"""
# installed before the page's own scripts: every main-thread task over 50 ms, and the phase marks
LONGTASKS = """(() => {
  window.__longtasks = []; window.__marks = [];
  try {
    new PerformanceObserver(list => { for (const e of list.getEntries()) window.__longtasks.push([e.startTime, e.duration]); })
      .observe({type: 'longtask', buffered: true});
    window.__longtask_observer = PerformanceObserver.supportedEntryTypes.includes('longtask');
  } catch (e) { window.__longtask_observer = false; }
})();"""
MARK = "(name) => { const t = performance.now(); window.__marks.push([name, t]); return t; }"
# one observation of the page, after an animation frame: its time, the rendered plots, the active tab's
# title, and the visible texts that end in "…" (a card's status line while it works), shadow roots included
POLL = """async () => {
  await new Promise(r => requestAnimationFrame(r));
  const t = performance.now();
  const working = []; let active = '';
  const walk = root => {
    const it = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let n = it.nextNode(); n; n = it.nextNode()) {
      const text = n.data.trim();
      // on screen: laid out (getClientRects) and not hidden by CSS visibility or opacity (checkVisibility)
      const el = n.parentElement, seen = el && el.getClientRects().length &&
        (!el.checkVisibility || el.checkVisibility({visibilityProperty: true, opacityProperty: true}));
      if (text.endsWith('…') && seen) working.push(text);
    }
    root.querySelectorAll('*').forEach(e => {
      if (e.classList && e.classList.contains('bk-tab') && e.classList.contains('bk-active') && !active)
        active = e.textContent.trim();
      if (e.shadowRoot) walk(e.shadowRoot);
    });
  };
  walk(document);
  return {t, plots: (%s)(), placeholder: (%s)(), working, active};
}""" % (RENDERED, PLACEHOLDER)
# Generate's end as CLICK_TO_DONE sees it (the first frame whose status reads "Done" after the click), and
# then at once, in that frame, a click on the tab ``tab`` (null: stay on the tab on screen)
DONE_THEN_TAB = """([button, status, tab, name]) => {
  window.__t_click = null; window.__t_done = null;
  button.addEventListener('click', () => { window.__t_click = performance.now(); }, {once: true});
  const root = status.shadowRoot || status;
  let left = false;
  const tick = () => {
    const text = root.textContent;
    if (window.__t_click !== null) {
      if (!text.includes('Done')) left = true;
      else if (left) {
        window.__t_done = performance.now();
        window.__marks.push(['card ' + name, window.__t_done]);
        if (tab) tab.click();
        return;
      }
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""
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


def ready_at(app, page, tab: str, hold: float, timeout: float = 900.0, left=None) -> tuple[float, dict]:
    """The browser time of the first observation of ``tab`` ready (see the module's step 4), once it has held
    for ``hold`` seconds, and that observation. ``left``: the rendered plots of the tab the click left; while
    exactly those are on screen, the new tab's content has not arrived and it is not ready."""
    t_wall, start, last = time.perf_counter(), None, None
    while time.perf_counter() - t_wall < timeout:
        server = settled(app)
        obs = page.evaluate(POLL)
        ok = (server and settled(app) and not obs["working"] and obs["active"] == tab and not obs["placeholder"]
              and (left is None or obs["plots"] != left))
        if not ok or start is None or obs["plots"] != last["plots"]:
            start = obs if ok else None
        last = obs
        if start is not None and (obs["t"] - start["t"]) / 1000 >= hold:
            return start["t"], start
        time.sleep(0.02)
    raise TimeoutError(f"the {tab} card was not ready within {timeout:.0f} s")


def long_tasks(page) -> dict:
    """The main thread's long tasks, by the phase (mark) each started in."""
    tasks, marks = page.evaluate("() => [window.__longtasks, window.__marks]")
    marks = [["page open", 0.0]] + sorted(marks, key=lambda m: m[1])
    phases: dict[str, list[float]] = {}
    over = []
    for start, dur in tasks:
        phase = [name for name, t in marks if t <= start][-1]
        phases.setdefault(phase, []).append(dur)
        if dur > 200:
            over.append({"phase": phase, "start_ms": start, "duration_ms": dur})
    after_open = [d for ph, ds in phases.items() if ph != "page open" for d in ds]
    return {"observer": page.evaluate("() => window.__longtask_observer"),
            "after_page_open": {"n": len(after_open), "max_ms": max(after_open, default=0.0),
                                "n_over_200ms": sum(d > 200 for d in after_open)},
            "phases": {ph: {"n": len(ds), "max_ms": max(ds), "n_over_200ms": sum(d > 200 for d in ds)}
                       for ph, ds in phases.items()},
            "over_200ms": over, "marks": marks}


def alerts(page) -> list[str]:
    return [t.strip() for t in page.locator(".alert-danger").all_inner_texts() if t.strip()]


def step_times(page, presses: int, label: str) -> dict:
    """Press ← and → in turn, ``presses`` times; each keypress's time to the frame where the step readout changed.
    ← first: a Generate leaves the page at its last step, where → changes nothing (every run before this
    order recorded that press as timed out)."""
    times = []
    for i in range(presses):
        page.evaluate("() => document.activeElement && document.activeElement.blur()")
        before = page.evaluate(READOUT)
        page.keyboard.press("ArrowRight" if i % 2 else "ArrowLeft")
        times.append(page.evaluate(MEASURE, before))
    ok = [t for t in times if t >= 0]
    print(f"keypress → readout on {label}: p50 {statistics.median(ok):.0f} ms, p95 {pct(ok, 0.95):.0f} ms")
    return {"p50": statistics.median(ok), "p95": pct(ok, 0.95), "n": len(times), "timed_out": len(times) - len(ok)}


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
    ap.add_argument("--step-tabs", nargs="*", default=[], help="also time the keypresses with each of these tabs "
                    "(titles) active, e.g. Export: the Overview's step cursors then move while it is hidden")
    ap.add_argument("--out", default=None, help="JSON results (default benchmarks/results/app_cards_MODEL.json)")
    ap.add_argument("--shots", default=None, help="folder for one screenshot per card")
    ap.add_argument("--readme-assets", default=None, help="also write the README's three screenshots (Overview, SAE "
                    "features, Drift; cut to their content) into this folder, e.g. assets")
    ap.add_argument("--cards", nargs="*", default=None, help="only these cards (tab titles), in tab order")
    ap.add_argument("--hold", type=float, default=1.0,
                    help="seconds a card's ready state must hold to count (confirmation only, not counted)")
    ap.add_argument("--port", type=int, default=5097)
    args = ap.parse_args()
    out_path = pathlib.Path(args.out or ROOT / "benchmarks" / "results" / f"app_cards_{args.model}.json")
    shots = pathlib.Path(args.shots) if args.shots else (pathlib.Path(tempfile.mkdtemp(prefix="trajscope-shots-"))
                                                          if args.readme_assets else None)
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRAJSCOPE_RUNS_DIR", tempfile.mkdtemp(prefix="trajscope-cards-runs-"))
    import torch
    from playwright.sync_api import sync_playwright

    from trajscope.ui import saved_runs

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
    load_model(args.model)
    result = {"model": args.model, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
              "date": time.strftime("%Y-%m-%d %H:%M"), "model_load_s": time.perf_counter() - t0,
              "question": args.question, "tokens": args.tokens, "cards": {}}
    server, apps = serve_pages(args.model, args.port)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 2400})
            page.add_init_script(LONGTASKS)
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
            page.evaluate(MARK, "generate")
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
            by_tab = result["keypress_to_readout_ms_by_tab"] = {}
            for step_tab in ["Overview", *args.step_tabs]:
                if step_tab != "Overview":
                    page.locator(".bk-tab", has_text=step_tab).first.click()
                    ready_at(app, page, step_tab, args.hold)
                page.evaluate(MARK, "stepping" if step_tab == "Overview" else f"stepping on {step_tab}")
                by_tab[step_tab] = step_times(page, args.presses, step_tab)
            result["keypress_to_readout_ms"] = by_tab["Overview"]
            if args.step_tabs:
                page.evaluate(MARK, "back to Overview after stepping")
                page.locator(".bk-tab", has_text="Overview").first.click()
                ready_at(app, page, "Overview", args.hold)
            # 4. every card, opened as Generate ends
            names = [name for name, _ in app._cards if args.cards is None or name in args.cards]
            for name in names:
                page.evaluate(MARK, f"back to Overview before {name}")
                page.locator(".bk-tab", has_text="Overview").first.click()
                _, overview = ready_at(app, page, "Overview", args.hold)
                page.evaluate("() => document.activeElement && document.activeElement.blur()")
                button = page.locator(".ts-generate button").element_handle()
                status = page.locator(".ts-status").first.element_handle()
                tab = None if name == "Overview" else page.locator(".bk-tab", has_text=name).first.element_handle()
                page.evaluate(DONE_THEN_TAB, [button, status, tab, name])
                page.evaluate(MARK, f"generate for {name}")
                button.click()
                wait(lambda: page.evaluate("() => window.__t_done") is not None)
                t_done = page.evaluate("() => window.__t_done")
                generate_s = (t_done - page.evaluate("() => window.__t_click")) / 1000
                t_ready, obs = ready_at(app, page, name, args.hold, left=None if name == "Overview" else overview["plots"])
                rec = {"ready_after_generate_s": (t_ready - t_done) / 1000, "generate_s": generate_s,
                       "plots_on_page": len(obs["plots"])}
                action = ACTIONS.get(name)
                if action:
                    btn = page.get_by_role("button", name=action, exact=True)
                    visible = [b for b in btn.all() if b.is_visible()]
                    if visible:
                        t_press = page.evaluate(MARK, f"action {name}")
                        visible[0].click()
                        t_end, _ = ready_at(app, page, name, args.hold)
                        rec.update(action=action, action_s=(t_end - t_press) / 1000)
                rec["alerts"] = alerts(page)
                result["cards"][name] = rec
                if shots:
                    shot = shots / f"{len(result['cards']):02d}_{name.replace(' ', '_')}.png"
                    page.screenshot(path=str(shot), full_page=True)
                    if args.readme_assets and name in README_SHOTS:
                        crop_to_content(shot, pathlib.Path(args.readme_assets) / README_SHOTS[name])
                extra = f"; {action}: {rec['action_s']:.2f} s" if "action_s" in rec else ""
                extra += ("; ALERT: " + " | ".join(rec["alerts"])) if rec["alerts"] else ""
                print(f"{name}: ready {rec['ready_after_generate_s']:.2f} s after Generate ended "
                      f"(Generate {generate_s:.2f} s){extra}", flush=True)
            # 4b. stepping again on the Overview, every card having been opened (work a hidden card did on each
            # step would show here)
            page.evaluate(MARK, "back to Overview after every card")
            page.locator(".bk-tab", has_text="Overview").first.click()
            ready_at(app, page, "Overview", args.hold)
            page.evaluate(MARK, "stepping after every card")
            label = "Overview, after every card"
            by_tab[label] = step_times(page, args.presses, label)
            ready = [c["ready_after_generate_s"] for c in result["cards"].values()]
            result["cards_ready_max_s"] = max(ready)
            print(f"every card ready ≤ {max(ready):.2f} s after Generate ended (target ≤ 2 s)")
            # 5. main-thread long tasks
            result["long_tasks"] = lt = long_tasks(page)
            a = lt["after_page_open"]
            print(f"main-thread long tasks after the page opened (observer {'on' if lt['observer'] else 'UNSUPPORTED'}): "
                  f"{a['n']} over 50 ms, longest {a['max_ms']:.0f} ms, {a['n_over_200ms']} over 200 ms (target: none)")
            for t in lt["over_200ms"]:
                if t["phase"] != "page open":
                    print(f"  {t['duration_ms']:.0f} ms during {t['phase']}")
            browser.close()
    finally:
        server.stop()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
