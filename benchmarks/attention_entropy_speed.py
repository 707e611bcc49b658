"""Micro-benchmark: the attention entropy of a capture's rows, ``torch.special.entr`` against the kernel's log.

``kernels.attention_stats`` takes the entropy ``−Σ a log a`` of every attention row a capture keeps statistics
of: at prefill the last 32 prompt queries of every layer and head, at decode each chunk's rows. Two ways, timed
interleaved (each rep alternating which goes first) on the same rows:

- ``entr``: ``torch.special.entr(a).sum(-1)``, the kernel before commit c842a4b;
- ``log``: ``kernels._entropy(a)``, the kernel now: the log of the weights clamped to float32's smallest
  normal number, multiplied in place.

The rows are SmolLM2-135M-Instruct's own: one capture of P tokens of real text (``capture_overhead.long_ids``)
and 16 new tokens, with every row that ``attention_stats`` receives recorded (30 prefill layers, and the decode
chunks). Prints the time per capture's rows of each (median over reps), the per-rep ratio log ÷ entr with a
distribution-free interval (``capture_overhead.paired``), and the largest difference between the two.
Writes ``benchmarks/results/attention_entropy_speed.json``.

Run: ``OMP_NUM_THREADS=1 python benchmarks/attention_entropy_speed.py --reps 15 --threads 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import capture_overhead as co  # noqa: E402

import trajscope as ts  # noqa: E402
from trajscope.capture import kernels  # noqa: E402


def smollm2_rows(P: int) -> list[torch.Tensor]:
    """Every row tensor ``attention_stats`` receives in one SmolLM2 capture of P tokens and 16 new ones."""
    model = co.load_models("smollm2", "cpu", ("rows",))["rows"]
    seen: list[torch.Tensor] = []
    real = kernels.attention_stats

    def spy(a, *args, **kw):
        seen.append(a.detach().float().clone())
        return real(a, *args, **kw)

    kernels.attention_stats = spy
    try:
        ts.capture(model, co.long_ids(model, P), max_new_tokens=16, stop_at_eos=False)
    finally:
        kernels.attention_stats = real
    return seen


WAYS = {"entr": lambda a: torch.special.entr(a).sum(-1), "log": kernels._entropy}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--P", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = smollm2_rows(args.P)
    diff = max(float((WAYS["entr"](a) - WAYS["log"](a)).abs().max()) for a in rows)
    times: dict = {k: [] for k in WAYS}
    for rep in range(args.reps):
        for name in (list(WAYS) if rep % 2 == 0 else list(WAYS)[::-1]):
            t0 = time.perf_counter()
            for a in rows:
                WAYS[name](a)
            times[name].append(time.perf_counter() - t0)
    ratio = co.paired(times["log"], times["entr"])
    out = {"P": args.P, "reps": args.reps, "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "load_average_1min": os.getloadavg()[0], "rows": [list(a.shape) for a in rows],
           "values": sum(a.numel() for a in rows), "max_abs_difference": diff, "times_s": times,
           "log_over_entr": ratio}
    lo, hi = ratio["paired_interval"]
    print(f"{out['values']:,} weights in {len(rows)} row tensors (P = {args.P}, 16 new tokens); per capture's rows: "
          f"entr {statistics.median(times['entr']) * 1e3:.1f} ms, log {statistics.median(times['log']) * 1e3:.1f} ms; "
          f"log ÷ entr per rep {ratio['paired_ratio']:.2f} [{lo:.2f}, {hi:.2f}] ({ratio['paired_coverage']:.0%}); "
          f"largest difference {diff:.1e}")
    (HERE / "results" / "attention_entropy_speed.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
