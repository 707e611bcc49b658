"""Benchmark: what the KV-eviction study costs per prompt on the sample model.

Runs :func:`trajscope.studies.eviction.engine.eviction` (the eviction study, a Result) on held-out prompts with the README's settings (7 policies,
budgets 0.2 and 0.5, 32 new tokens, window 4, lookahead 8) and reports seconds per prompt for
the whole study and for its parts: the full capture with every attention row, the policies'
scores and per-step costs, and the masked re-runs (teacher-forced plus free-running greedy for
each policy × budget). Writes ``benchmarks/results/eviction_cost.json``.

Run by hand: ``python benchmarks/eviction_cost.py [--prompts 6]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import trajscope as ts
from trajscope.model import sample_data_dir
from trajscope.studies.eviction import eviction
from trajscope.prompts import read_prompts

RESULTS = pathlib.Path(__file__).parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=6)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    model = ts.load_model("sample", device="cpu")
    items = read_prompts(sample_data_dir() / "prompts" / "heldout_code.jsonl")[: args.prompts]
    kw = dict(budgets=(0.2, 0.5), max_new_tokens=32, window=4, lookahead=8)
    eviction(model, items[:1], **{**kw, "max_new_tokens": 4})  # warm-up
    t0 = time.perf_counter()
    eviction(model, items, rerun=False, **kw)
    no_rerun = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = eviction(model, items, **kw)
    full = time.perf_counter() - t0
    n = len(items)
    out = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
           "date": time.strftime("%Y-%m-%d %H:%M"), "prompts": n, "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()},
           "policies": len(ts.metrics.eviction.POLICIES) if hasattr(ts, "metrics") else 7,
           "seconds_per_prompt": full / n, "seconds_per_prompt_without_reruns": no_rerun / n,
           "masked_reruns_share": 1 - no_rerun / full, "rerun_rows": res.tables["eviction_rerun"].height}
    print(f"{n} prompts: {full / n:.2f} s per prompt ({no_rerun / n:.2f} s without the masked re-runs; "
          f"re-runs are {100 * out['masked_reruns_share']:.0f}% of the time)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "eviction_cost.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
