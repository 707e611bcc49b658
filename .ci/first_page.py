"""Open the served app in headless Chromium and check that its first page renders plots.

Used by ``.ci/first_page.sh`` after the README's first command has started
``panel serve`` on a fresh copy: the page must hold rendered Bokeh plots (a
canvas with a non-zero size in each of at least ``--min-plots`` plots) and no
error alert and no script error in the browser console (the server log is
checked for tracebacks by the shell script). Exits 0 when the page renders
cleanly, 1 with one sentence when it does not.

    python .ci/first_page.py --url http://localhost:5006/trajscope --timeout 600 --png first_page.png
"""

from __future__ import annotations

import argparse
import sys
import time

from playwright.sync_api import sync_playwright

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# Plots whose canvas BokehJS has laid out with a size (a blank page has none).
RENDERED = """() => {
  if (typeof Bokeh === 'undefined' || !Bokeh.index) return -1;
  const views = Object.values(Bokeh.index);
  const all = []; const walk = v => { all.push(v); for (const c of (v.child_views || [])) walk(c); };
  views.forEach(walk);
  return all.filter(v => v.model && v.model.type === 'Figure' || (v.model && v.model.constructor.name === 'Figure'))
            .filter(v => v.el && v.el.getBoundingClientRect().width > 0).length;
}"""
TITLES = """() => Bokeh.documents.flatMap(d => [...d.all_models])
    .filter(m => m.title && m.title.text !== undefined).map(m => m.title.text)"""


def _server_failed(log: str | None) -> bool:
    """Whether the server's log already shows a traceback (then waiting longer is pointless)."""
    if not log:
        return False
    try:
        with open(log, errors="replace") as fh:
            return "Traceback" in fh.read()
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://localhost:5006/trajscope")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the plots")
    parser.add_argument("--min-plots", type=int, default=3)
    parser.add_argument("--png", default=None, help="write a screenshot of the page here")
    parser.add_argument("--server-log", default=None, help="stop waiting as soon as this log shows a traceback")
    args = parser.parse_args(argv)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        deadline = time.monotonic() + args.timeout
        while True:
            try:
                page.goto(args.url, wait_until="load", timeout=60_000)
                break
            except Exception:  # the server may still be starting
                if time.monotonic() > deadline:
                    print(f"first page: nothing answered at {args.url} within {args.timeout:.0f} s.")
                    return 1
                time.sleep(2)
        n = -1
        while time.monotonic() < deadline and not _server_failed(args.server_log):
            n = page.evaluate(RENDERED)
            if n >= args.min_plots:
                break
            time.sleep(2)
        page.wait_for_timeout(2000)
        if args.png:
            page.screenshot(path=args.png, full_page=True)
        alerts = [t.strip() for t in page.locator(".alert-danger, .bk-notification-error").all_inner_texts() if t.strip()]
        titles = page.evaluate(TITLES) if n >= 0 else []
        browser.close()
    if n < args.min_plots:
        print(f"first page: {max(n, 0)} rendered plots (at least {args.min_plots} expected); "
              f"page errors: {errors[:3]}.")
        return 1
    if alerts:
        print(f"first page: plots rendered, but the page shows an error: {alerts[:3]}.")
        return 1
    if errors:  # a BokehJS exception can drop the rest of a message: a control left in a stale state
        print(f"first page: plots rendered, but the browser console reported {len(errors)} script error(s): "
              f"{errors[:3]}.")
        return 1
    print(f"first page: {n} rendered plots ({', '.join(t for t in titles[:6] if t)}…), no error on the page or "
          "in the browser console.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
