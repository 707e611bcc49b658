"""Benchmark: activation-harvest throughput at batch 1, 4 and 16, as ratios in one run.

:func:`trajscope.studies.harvest.harvest_served` reads every block output of every prompt
position (what an SAE dataset harvest keeps) for the same prompts at each batch size, right
padding. Batch sizes are interleaved round-robin per repetition so drift in machine load
hits them alike; the median time per batch size gives tokens/s (real tokens, padding not
counted) and the ratio to batch 1.

Models: the shipped sample model and a random GPT-2-small-sized model (124M parameters,
built from a config with random weights, never downloaded). Prompts: the held-out code
prompts, cut to ``--max-tokens``. Writes ``benchmarks/results/harvest_batch.txt``.

Run by hand: ``python benchmarks/harvest_batch.py [--prompts 32] [--reps 3] [--threads N]``.
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

from trajscope.model.load import load_model, sample_data_dir
from trajscope.studies.harvest import harvest_served
from trajscope.studies.prompts import encode_prompts, read_prompt_file

BATCHES = (1, 4, 16)
ROOT = pathlib.Path(__file__).resolve().parent


def gpt2_small_dir(tmp: pathlib.Path) -> pathlib.Path:
    """A random 124M GPT-2 (12 layers, d 768, 12 heads, vocab 50257) with the sample tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    path = tmp / "gpt2-small-random"
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config()).save_pretrained(path)
    PreTrainedTokenizerFast.from_pretrained(sample_data_dir() / "models" / "trajscope-tiny").save_pretrained(path)
    return path


def bench(model, prompts, reps: int) -> dict[int, float]:
    """Median seconds per full harvest (all layers) at each batch size."""
    layers = list(range(model.n_layers))
    harvest_served(model, prompts[:4], layers, batch_size=4)  # warm-up
    times: dict[int, list[float]] = {b: [] for b in BATCHES}
    for _ in range(reps):
        for b in BATCHES:
            t0 = time.perf_counter()
            harvest_served(model, prompts, layers, batch_size=b)
            times[b].append(time.perf_counter() - t0)
    return {b: statistics.median(v) for b, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32, help="prompts per harvest")
    ap.add_argument("--max-tokens", type=int, default=64, help="cut each prompt to its first N tokens")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per batch size (median)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--out", default=str(ROOT / "results" / "harvest_batch.txt"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    items = read_prompt_file(sample_data_dir() / "prompts" / "heldout_code.jsonl", args.prompts)
    lines = [f"harvest throughput, batch {'/'.join(map(str, BATCHES))}, right padding, all layers read; "
             f"{len(items)} held-out prompts cut to {args.max_tokens} tokens; median of {args.reps} interleaved reps",
             f"torch {torch.__version__}, {platform.processor() or platform.machine()}, threads {torch.get_num_threads()}, "
             f"cpu fp32, load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", ""]
    with tempfile.TemporaryDirectory() as tmp:
        for label, source in (("sample (5.7M)", "sample"), ("gpt2-124M random", str(gpt2_small_dir(pathlib.Path(tmp))))):
            model = load_model(source, device="cpu", dtype="float32")
            prompts = encode_prompts(model, items, args.max_tokens)
            n_tok = sum(len(ids) for _, ids in prompts)
            med = bench(model, prompts, args.reps)
            base = n_tok / med[1]
            for b in BATCHES:
                tps = n_tok / med[b]
                lines.append(f"{label:18s} batch {b:2d}: {tps:9.0f} tokens/s  ({tps / base:4.2f}x batch 1)")
            lines.append("")
            print("\n".join(lines[-len(BATCHES) - 1:]), file=sys.stderr)
    text = "\n".join(lines).rstrip() + "\n"
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
