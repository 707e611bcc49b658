"""Take the README screenshot: serve the app, open it in headless Chromium, save ``assets/screenshot.png``.

Uses the demo run in ``sample_data/runs/demo`` (``scripts/make_demo_run.py``);
when it is missing, captures the same run into a temporary directory first.
The page is captured at a 1600-pixel width after moving to a mid-decode step
so that every cursor is visible. Needs Chromium at ``/usr/bin/chromium``
(Debian package ``chromium``) and Playwright for Python.

(A second picture of the SAE features and Drift tabs is not taken yet: a full-page capture of those
tabs timed out in headless Chromium on this machine.)

Usage: ``python scripts/screenshot.py [--out assets/screenshot.png] [--step 20]``
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def demo_run_dir(tmp: str) -> pathlib.Path:
    from trajscope.model import sample_data_dir

    demo = sample_data_dir() / "runs" / "demo"
    if (demo / "meta.json").exists():
        return demo
    import trajscope as ts

    model = ts.load_model("sample")
    traj = ts.capture(model, "def fibonacci(n):\n    ", max_new_tokens=64, attention_layers="all", run_id="demo")
    return traj.save(pathlib.Path(tmp) / "demo")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "assets" / "screenshot.png"))
    ap.add_argument("--step", type=int, default=20, help="step to show")
    ap.add_argument("--port", type=int, default=5077)
    args = ap.parse_args()
    import panel as pn
    from playwright.sync_api import sync_playwright

    from trajscope.ui.views.app import default_page

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = demo_run_dir(tmp)
        apps = []

        def make():
            tpl = default_page(run_dir)
            apps.append(tpl._trajscope)
            return tpl

        server = pn.serve(make, port=args.port, show=False, threaded=True, title="trajscope")
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1600, "height": 1500})
                page.goto(f"http://localhost:{args.port}/", wait_until="networkidle", timeout=120_000)
                page.wait_for_function("() => document.querySelectorAll('*').length > 50", timeout=60_000)
                deadline = time.time() + 90
                while not apps and time.time() < deadline:
                    time.sleep(0.2)
                page.locator(".bk-tab", has_text="Overview").wait_for(timeout=120_000)  # drawn after connecting
                time.sleep(3)
                app = apps[0]
                app.state.go(args.step)
                time.sleep(3)
                out = pathlib.Path(args.out)
                out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(out))  # Overview tab
                browser.close()
            print(f"saved {out}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
