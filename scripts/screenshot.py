"""Screenshots of the app on the sample model: serve it, drive it in headless Chromium like a user, save PNGs.

The README's own screenshots show SmolLM2, the model the app opens on; they are written by
``python benchmarks/app_cards.py --readme-assets assets``. This script takes the same three views
on the tiny sample model:

1. ``assets/screenshot.png``: the Overview tab on the demo run in ``sample_data/runs/demo``
   (``scripts/make_demo_run.py``; when it is missing, the same run is captured into a temporary
   directory first), moved to a mid-decode step so that every cursor is visible.
2. ``assets/screenshot-sae.png`` and ``assets/screenshot-drift.png``: a prompt typed into the
   page and generated there (:data:`PROMPT`, 48 tokens), then the whole SAE features and Drift
   tabs on that run, at the same step.

Pages are 1600 pixels wide. Needs Chromium at ``/usr/bin/chromium`` (Debian package
``chromium``) and Playwright for Python.

Usage: ``python scripts/screenshot.py [--out-dir DIR] [--step 20]``
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


PROMPT = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"


def generate(page, app, prompt: str, n: int) -> None:
    """Type ``prompt``, set max new tokens to ``n``, press Generate and wait until the run is on screen."""
    area = page.locator(".ts-prompt textarea")
    area.fill(prompt)
    area.press("Tab")
    box = page.get_by_label("Max new tokens", exact=True)
    box.fill(str(n))
    box.press("Enter")
    deadline = time.time() + 30
    while (app.state.prompt != prompt or app.state.max_new_tokens != n) and time.time() < deadline:
        time.sleep(0.1)
    before = app.state.trajectory.run_id
    page.locator(".ts-generate button").click()
    deadline = time.time() + 120
    while (app.state.trajectory.run_id == before or app.state.busy) and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(ROOT / "build" / "screenshots-sample"))
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
                out = pathlib.Path(args.out_dir)
                out.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(out / "screenshot.png"))  # Overview tab
                generate(page, app, PROMPT, 48)
                app.state.go(args.step)
                page.set_viewport_size({"width": 1600, "height": 3200})  # whole tabs on screen, all painted
                for tab, name in (("SAE features", "screenshot-sae.png"), ("Drift", "screenshot-drift.png")):
                    page.locator(".bk-tab", has_text=tab).click()
                    time.sleep(6)
                    page.locator(".ts-tabs").first.screenshot(path=str(out / name))  # the tab, top to bottom
                browser.close()
            print(f"saved screenshots in {out}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
