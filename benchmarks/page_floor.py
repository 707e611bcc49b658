"""Benchmark: the longest main-thread task while a page opens, for the app and for pages that hold almost nothing.

Issue 32 asks that no main-thread task exceed 200 ms. Part of a page's opening is not the app's: the browser
evaluates BokehJS's and Panel's bundles and Panel's template builds its views whatever the page holds. This
serves four pages from one in-process server and opens each in ``--sessions`` fresh pages (the pages
alternate, session by session), recording the ``PerformanceObserver`` ``longtask`` entries from the navigation
until the page is drawn and 1.5 s more (as ``card_open.py``):

- ``panel``: one line of text in a plain Panel column, no template (BokehJS's and Panel's bundles, the same
  extensions; no MathJax, as on the app's page: ``trajscope/ui/views/no_mathjax.py``);
- ``bare``: the app's template (:class:`trajscope.ui.views.app.Page`, the same extensions) with one line of text;
- ``figure``: the same with one Bokeh line figure of 1,000 points beside the text;
- ``app``: the app's page on ``--model`` (its first run included: the page is drawn once that run is).

``panel`` and ``bare`` are floors for any page served this way on the machine: nothing trajscope adds is in
them. Each page opens in a browser context of its own: a first visit, with no cache, so every bundle is fetched
and compiled, and no page shares a renderer's main thread with another. Prints per page the median and range of
the longest task and the sessions with a task over 200 ms.

Run: ``python benchmarks/page_floor.py [--model smollm2] [--sessions 8] [--out benchmarks/results/page_floor_MODEL.json]``.
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
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRAJSCOPE_RUNS_DIR", tempfile.mkdtemp(prefix="page_floor_"))

import app_cards as ac  # noqa: E402  (the browser helpers: long tasks, readiness)

PAGES = ("panel", "bare", "figure", "app")


def serve(model: str, port: int):
    """Serve the four pages; returns ``(server, apps)``, ``apps`` gaining each ``app`` session's TrajScope."""
    import numpy as np
    import panel as pn
    from bokeh.plotting import figure

    from trajscope.ui.views import no_mathjax
    from trajscope.ui.views.app import FONT, TITLE, Page, default_page, ensure_extension

    ensure_extension()
    apps = []

    def floor(*more, template=True):
        """One line of text (and ``more``), in the app's template or in a plain column."""
        no_mathjax.install(pn.state.curdoc)  # the bundles the app's page loads: no MathJax
        main = [pn.pane.Markdown("A page with one line.", css_classes=["ts-floor"]), *more]
        return Page(title=TITLE, font=FONT, main=main) if template else pn.Column(*main)

    def with_figure():
        fig = figure(height=300, sizing_mode="stretch_width")
        x = np.arange(1000)
        fig.line(x, np.sin(x / 50))
        return floor(pn.pane.Bokeh(fig))

    def app():
        tpl = default_page(model=model)
        apps.append(tpl._trajscope)
        return tpl

    pages = {"panel": lambda: floor(template=False), "bare": floor, "figure": with_figure, "app": app}
    server = pn.serve(pages, port=port, show=False, threaded=True, title="page_floor")
    return server, apps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--sessions", type=int, default=8, help="fresh pages per kind of page")
    ap.add_argument("--port", type=int, default=5121)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from playwright.sync_api import sync_playwright

    ac.load_model(args.model)
    server, apps = serve(args.model, args.port)
    longest = {k: [] for k in PAGES}
    over = {k: [] for k in PAGES}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ac.ARGS)
            for s in range(args.sessions):
                for kind in (PAGES if s % 2 == 0 else PAGES[::-1]):
                    context = browser.new_context(viewport={"width": 1500, "height": 2400})
                    page = context.new_page()
                    page.add_init_script(ac.LONGTASKS)
                    n0 = len(apps)
                    page.goto(f"http://localhost:{args.port}/{kind}", timeout=300_000)
                    if kind == "app":
                        page.locator(".ts-generate").wait_for(timeout=300_000)
                        ac.wait(lambda: len(apps) > n0 and apps[-1].state.trajectory is not None
                                and ac.settled(apps[-1]), timeout=600)
                    else:
                        page.locator(".ts-floor").wait_for(timeout=300_000)
                        if kind == "figure":
                            page.locator(".bk-Canvas, canvas").first.wait_for(state="attached", timeout=60_000)
                    time.sleep(1.5)
                    tasks = [d for _, d in page.evaluate("() => window.__longtasks")]
                    longest[kind].append(round(max(tasks, default=0)))
                    over[kind].append([round(d) for d in tasks if d > 200])
                    context.close()
                    print(f"session {s + 1}, {kind}: longest {longest[kind][-1]} ms, over 200 ms {over[kind][-1]}",
                          flush=True)
            browser.close()
    finally:
        server.stop()
    summary = {k: {"median_ms": statistics.median(xs), "min_ms": min(xs), "max_ms": max(xs),
                   "sessions_over_200ms": sum(x > 200 for x in xs), "longest_ms": xs, "over_200ms": over[k]}
               for k, xs in longest.items()}
    for k in PAGES:
        v = summary[k]
        print(f"{k}: longest task median {v['median_ms']:.0f} ms [{v['min_ms']}, {v['max_ms']}], "
              f"{v['sessions_over_200ms']} of {args.sessions} sessions over 200 ms")
    out = pathlib.Path(args.out or pathlib.Path(__file__).parent / "results" / f"page_floor_{args.model}.json")
    out.write_text(json.dumps({"model": args.model, "machine": platform.platform(), "date": time.strftime("%Y-%m-%d %H:%M"),
                               "sessions": args.sessions, "pages": summary}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
