"""Benchmark: capture throughput at batch 1, 4 and 16, as ratios in one run.

Batch 1 is :func:`trajscope.capture` (one KV-cached generation trace per prompt, the engine
``capture_batch(batch_size=1)`` runs); batches 4 and 16 are :func:`trajscope.capture.batch.capture_batch`
(greedy decode of the padded batch with the KV cache, reading what every step computed).
A fourth line runs the batched engine on batches of one prompt, which
separates what the engine change buys from what batching buys. Every run records the
default tables (tokens, attention telemetry with the 32-row prefill window, activation
statistics of every layer), greedy, ``max_new_tokens`` steps, EOS ignored, left padding.
Settings are interleaved round-robin per repetition so drift in machine load hits them
alike; tokens/s counts generated tokens (``n_prompts × max_new_tokens``) over the median time.

Models: the shipped sample model and a random GPT-2-small-sized model (124M parameters,
never downloaded). Prompts: the held-out code prompts, cut to ``--max-tokens``. Writes
``benchmarks/results/capture_batch.txt``.

Run by hand: ``python benchmarks/capture_batch.py [--prompts 16] [--new 32] [--reps 3] [--threads N]``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from harvest_batch import gpt2_small_dir
from trajscope.capture import CaptureConfig, capture
from trajscope.capture.batch import _capture_group, capture_batch
from trajscope.model.load import load_model, sample_data_dir
from trajscope.studies.prompts import encode_prompts, read_prompt_file

ROOT = pathlib.Path(__file__).resolve().parent
SETTINGS = ("capture, batch 1", "engine, batch 1", "batch 4", "batch 16")


def run(model, prompts, cfg, setting: str) -> None:
    if setting == "capture, batch 1":
        for p in prompts:
            capture(model, p, cfg)
    elif setting == "engine, batch 1":  # the batched engine on batches of one prompt
        for p in prompts:
            _capture_group(model, [p], cfg, "left", [None])
    else:
        capture_batch(model, prompts, cfg, batch_size=int(setting.split()[-1]), padding_side="left")


def bench(model, prompts, cfg, reps: int) -> dict[str, float]:
    """Median seconds to capture every prompt, per setting."""
    for s in SETTINGS:  # warm-up
        run(model, prompts[:2], cfg.replace(max_new_tokens=2), s)
    times: dict[str, list[float]] = {s: [] for s in SETTINGS}
    for _ in range(reps):
        for s in SETTINGS:
            t0 = time.perf_counter()
            run(model, prompts, cfg, s)
            times[s].append(time.perf_counter() - t0)
    return {s: statistics.median(v) for s, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16, help="prompts per capture set")
    ap.add_argument("--max-tokens", type=int, default=64, help="cut each prompt to its first N tokens")
    ap.add_argument("--new", type=int, default=32, help="new tokens per prompt")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per setting (median)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--models", default="sample,gpt2", help="comma list among sample, gpt2")
    ap.add_argument("--out", default=str(ROOT / "results" / "capture_batch.txt"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    items = read_prompt_file(sample_data_dir() / "prompts" / "heldout_code.jsonl", args.prompts)
    cfg = CaptureConfig(max_new_tokens=args.new, stop_at_eos=False)
    lines = [f"capture throughput: capture at batch 1 vs capture_batch at 4/16 (left padding, greedy, default tables); "
             f"{len(items)} held-out prompts cut to {args.max_tokens} tokens, {args.new} new tokens each; "
             f"median of {args.reps} interleaved reps",
             f"torch {torch.__version__}, {platform.processor() or platform.machine()}, threads {torch.get_num_threads()}, "
             f"cpu fp32, load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", ""]
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"sample": ("sample (5.7M)", "sample"),
                   "gpt2": ("gpt2-124M random", lambda: str(gpt2_small_dir(pathlib.Path(tmp))))}
        for key in args.models.split(","):
            label, source = sources[key]
            model = load_model(source() if callable(source) else source, device="cpu", dtype="float32")
            prompts = [ids for _, ids in encode_prompts(model, items, args.max_tokens)]
            med = bench(model, prompts, cfg, args.reps)
            n_tok = len(prompts) * args.new
            base = n_tok / med[SETTINGS[0]]
            for s in SETTINGS:
                tps = n_tok / med[s]
                lines.append(f"{label:18s} {s:17s}: {tps:8.0f} tokens/s  ({tps / base:5.2f}x capture)")
            lines.append("")
            print("\n".join(lines[-len(SETTINGS) - 1:]), file=sys.stderr)
    text = "\n".join(lines).rstrip() + "\n"
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
