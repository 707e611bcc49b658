"""Benchmark: a card's first opening in a fresh session, with the app's drawing changes and without them.

What a user meets when they first open a card is the browser building its views in one or more main-thread
tasks; a task over 200 ms is a visible stall (issue 32). Two changes aim at it: cards drawn a part at a time
(``trajscope/ui/views/staged.py``) and BokehJS's CSS-variable reads skipped (``trajscope/ui/views/css_reads.py``).
This serves the app in-process on ``--model`` and, in ``--sessions`` fresh sessions per variant (the variants
alternate, session by session), waits for the page's first run, then opens each card in ``--cards`` from the
Overview once and records the longest main-thread task from the click until the card is ready and 1 s more
(``PerformanceObserver`` ``longtask`` entries, as ``app_cards.py``). Variant ``plain`` turns both changes
off in this process (the staged layouts draw whole, the page keeps BokehJS's reads); ``current`` is the app
as shipped. Prints per card and variant the median and range of the longest task, and the count over 200 ms.

Run: ``python benchmarks/card_open.py [--model sample] [--sessions 4] [--cards "SAE features" Drift]
[--out benchmarks/results/card_open_MODEL.json]``. On the sample model about a minute per session and variant.
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

VARIANTS = ("plain", "current")


@contextlib.contextmanager
def variant(name: str):
    """The app's drawing changes on (``current``) or off (``plain``) for the sessions made inside."""
    from trajscope.ui.views import css_reads, staged

    if name == "current":
        yield
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
    ap.add_argument("--port", type=int, default=5119)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from playwright.sync_api import sync_playwright

    ac.load_model(args.model)
    server, apps = ac.serve_pages(args.model, args.port, title="card_open")
    longest = {v: {c: [] for c in args.cards} for v in VARIANTS}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ac.ARGS)
            for s in range(args.sessions):
                for name in (VARIANTS if s % 2 == 0 else VARIANTS[::-1]):
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
                    print(f"session {s + 1}, {name}: " + ", ".join(f"{c} {longest[name][c][-1]} ms" for c in args.cards),
                          flush=True)
            browser.close()
    finally:
        server.stop()
    summary = {v: {c: {"median_ms": statistics.median(xs), "min_ms": min(xs), "max_ms": max(xs),
                       "n_over_200ms": sum(x > 200 for x in xs), "longest_ms": xs} for c, xs in cards.items()}
               for v, cards in longest.items()}
    for card in args.cards:
        print(f"{card}: " + "; ".join(f"{v} median {summary[v][card]['median_ms']:.0f} ms "
                                      f"[{summary[v][card]['min_ms']}, {summary[v][card]['max_ms']}], "
                                      f"{summary[v][card]['n_over_200ms']} of {args.sessions} over 200 ms"
                                      for v in VARIANTS))
    out = pathlib.Path(args.out or pathlib.Path(__file__).parent / "results" / f"card_open_{args.model}.json")
    out.write_text(json.dumps({"model": args.model, "machine": platform.platform(), "date": time.strftime("%Y-%m-%d %H:%M"),
                               "sessions": args.sessions, "cards": args.cards, "variants": summary}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
