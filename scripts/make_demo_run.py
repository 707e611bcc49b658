"""Capture the demo run the app opens with: ``sample_data/runs/demo``.

The sample model continues ``def fibonacci(n):\\n    `` greedily for 64 tokens,
keeping the full attention rows and the residuals of every layer (the heatmap
can show any layer exactly, and the Drift view can score every position). Re-run after retraining the sample model.

Usage: ``python scripts/make_demo_run.py [--out DIR]``
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import trajscope as ts
from trajscope.model import sample_data_dir

PROMPT = "def fibonacci(n):\n    "


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(sample_data_dir() / "runs" / "demo"), help="run directory to write")
    args = ap.parse_args()
    model = ts.load_model("sample")
    traj = ts.capture(model, PROMPT, max_new_tokens=64, temperature=0.0, seed=0, attention_layers="all",
                      residual_layers="all", run_id="demo")
    path = traj.save(args.out)
    print(f"{traj!r} saved to {path}")
    print(repr(traj.text))


if __name__ == "__main__":
    main()
