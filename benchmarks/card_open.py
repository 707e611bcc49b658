"""Benchmark: the page's opening and a card's first opening in a fresh session, with the app's drawing changes and
without them.

What a user meets when they first open a card is the browser building its views in one or more main-thread
tasks; a task over 200 ms is a visible stall (issue 32). Two changes aim at it: cards drawn a part at a time
(``trajscope/ui/views/staged.py``) and BokehJS's CSS-variable reads skipped (``trajscope/ui/views/css_reads.py``).
This serves the app in-process on ``--model`` and, in ``--sessions`` fresh sessions per variant (the variants
alternate, session by session), waits for the page's first run, then opens each card in ``--cards`` from the
Overview once and records the longest main-thread task from the click until the card is ready and 1 s more
(``PerformanceObserver`` ``longtask`` entries, as ``app_cards.py``). The page's opening is recorded the same way,
from the navigation until the first run is drawn and 1.5 s more: its longest task and its tasks over 200 ms.
Variants (``--variants``): ``plain`` turns both changes off in this process (the staged layouts draw whole,
the page keeps BokehJS's reads); ``page_whole`` draws the step bar and the Overview whole at page open, as
before they were staged, and is otherwise as shipped; ``current`` is the app as shipped. Prints per card and
variant the median and range of the longest task, and the count over 200 ms.

Run: ``python benchmarks/card_open.py [--model sample] [--sessions 4] [--cards "SAE features" Drift]
[--variants plain current] [--out benchmarks/results/card_open_MODEL.json]``; ``--cards`` with no name
times the page's opening alone. On the sample model about a minute per session and variant.
"""

from __future__ import annotations

import argparse
import contextlib
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
os.environ.setdefault("TRAJSCOPE_RUNS_DIR", tempfile.mkdtemp(prefix="card_open_"))

import app_cards as ac  # noqa: E402  (the browser helpers: long tasks, readiness)

VARIANTS = ("plain", "page_whole", "current")


@contextlib.contextmanager
def variant(name: str):
    """The app's drawing changes on (``current``), off (``plain``), or off for the page's opening alone
    (``page_whole``), for the sessions made inside."""
    import panel as pn

    from trajscope.ui.views import app, css_reads, staged, telemetry

    if name == "current":
        yield
        return
    if name == "page_whole":  # the step bar (app.py) and the Overview (telemetry.py) as plain columns
        def whole(*objects, first=1, **params):
            return pn.Column(*objects, **params)

        app.StagedColumn = telemetry.StagedColumn = whole
        try:
            yield
        finally:
            app.StagedColumn = telemetry.StagedColumn = staged.StagedColumn
        return
    draw, needed = staged.Staged._get_objects, css_reads.needed
    staged.Staged._get_objects = lambda self, *a, **kw: super(staged.Staged, self)._get_objects(*a, **kw)
    css_reads.needed = lambda *a, **kw: False
    try:
        yield
    finally:
        staged.Staged._get_objects, css_reads.needed = draw, needed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="sample")
    ap.add_argument("--sessions", type=int, default=4, help="fresh sessions per variant")
    ap.add_argument("--cards", nargs="*", default=["Attention", "SAE features", "Drift"])
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=["plain", "current"])
    ap.add_argument("--port", type=int, default=5119)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from playwright.sync_api import sync_playwright

    ac.load_model(args.model)
    server, apps = ac.serve_pages(args.model, args.port, title="card_open")
    variants = args.variants
    longest = {v: {c: [] for c in ["page open", *args.cards]} for v in variants}
    over = {v: [] for v in variants}  # the page's opening: its tasks over 200 ms, per session
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ac.ARGS)
            for s in range(args.sessions):
                for name in (variants if s % 2 == 0 else variants[::-1]):
                    with variant(name):
                        page = browser.new_page(viewport={"width": 1500, "height": 2400})
                        page.add_init_script(ac.LONGTASKS)
                        n0 = len(apps)
                        page.goto(f"http://localhost:{args.port}/", timeout=300_000)
                        page.locator(".ts-generate").wait_for(timeout=300_000)
                        ac.wait(lambda: len(apps) > n0 and apps[-1].state.trajectory is not None
                                and ac.settled(apps[-1]), timeout=600)
                        app = apps[-1]
                        time.sleep(1.5)
                        opening = [d for _, d in page.evaluate("() => window.__longtasks")]
                        longest[name]["page open"].append(round(max(opening, default=0)))
                        over[name].append([round(d) for d in opening if d > 200])
                        for card in args.cards:
                            t0 = page.evaluate("() => performance.now()")
                            left = page.evaluate(ac.POLL)["plots"]
                            page.locator(".bk-tab", has_text=card).first.click()
                            ac.ready_at(app, page, card, 0.3, timeout=120, left=left)
                            time.sleep(1.0)
                            tasks = [d for start, d in page.evaluate("() => window.__longtasks") if start >= t0]
                            longest[name][card].append(round(max(tasks, default=0)))
                            page.locator(".bk-tab", has_text="Overview").first.click()
                            ac.ready_at(app, page, "Overview", 0.3, timeout=120)
                            time.sleep(0.5)
                        page.close()
                    print(f"session {s + 1}, {name}: " + ", ".join(f"{c} {xs[-1]} ms" for c, xs in longest[name].items())
                          + f" (page open, tasks over 200 ms: {over[name][-1]})", flush=True)
            browser.close()
    finally:
        server.stop()
    summary = {v: {c: {"median_ms": statistics.median(xs), "min_ms": min(xs), "max_ms": max(xs),
                       "n_over_200ms": sum(x > 200 for x in xs), "longest_ms": xs} for c, xs in cards.items()}
               for v, cards in longest.items()}
    for v in variants:
        summary[v]["page open"]["over_200ms_per_session"] = over[v]
    for card in ["page open", *args.cards]:
        print(f"{card}: " + "; ".join(f"{v} median {summary[v][card]['median_ms']:.0f} ms "
                                      f"[{summary[v][card]['min_ms']}, {summary[v][card]['max_ms']}], "
                                      f"{summary[v][card]['n_over_200ms']} of {args.sessions} over 200 ms"
                                      for v in variants))
    out = pathlib.Path(args.out or pathlib.Path(__file__).parent / "results" / f"card_open_{args.model}.json")
    out.write_text(json.dumps({"model": args.model, "machine": platform.platform(), "date": time.strftime("%Y-%m-%d %H:%M"),
                               "sessions": args.sessions, "cards": args.cards, "variants": summary}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
