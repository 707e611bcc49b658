"""Benchmark: where capture's peak memory at long context comes from — nnsight's trace or trajscope's reads.

Each variant runs once (16 new tokens after a P-token prompt, the random 124M GPT-2 of
``capture_overhead.py``) in a fresh process with no warm-up, its peak resident memory sampled
every 2 ms (``capture_overhead.peak_during``):

- ``generate(sdpa)``: plain Hugging Face ``generate``, the model's default attention, on a model
  loaded by ``transformers`` itself (no nnsight; ``capture_overhead.load_models``);
- ``generate(rows)``: ``generate`` on the ``attn="rows"`` trajscope model (trajscope's attention; the
  module as nnsight loaded it, no trace);
- ``trace(empty)``: an nnsight ``generate`` trace whose body reads nothing;
- ``capture``: :func:`trajscope.capture` with its defaults.

``--fixed-mmap`` runs every process with glibc's mmap threshold fixed at 1 MiB
(``capture_overhead.FIXED_MMAP``): peaks then measure what each run keeps alive, repeatable to a few
MiB, instead of moving ±150 MiB with the heap's history.

Run by hand: ``python benchmarks/trace_memory.py [--P 2048] [--reps 2] [--fixed-mmap]``; writes
``benchmarks/results/trace_memory.json`` (peak RSS per process, MiB, and the medians as ratios to
``generate(sdpa)``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = pathlib.Path(__file__).resolve().parent
VARIANTS = ("generate(sdpa)", "generate(rows)", "trace(empty)", "capture")


def child(variant: str, path: str, P: int) -> None:
    """One run of ``variant`` in this (fresh) process; prints ``{"before", "peak"}`` in MiB."""
    sys.path.insert(0, str(HERE))
    import torch

    import capture_overhead as bench
    import trajscope as ts
    from trajscope.capture import CaptureConfig, _gen_kwargs

    torch.set_grad_enabled(False)
    if variant == "generate(sdpa)":
        model = bench.load_models(path, "cpu", ("sdpa",))["hf-sdpa"]
    else:
        model = ts.load_model(path, attn="rows")
    ids = bench.long_ids(model, P)

    def run() -> None:
        if variant == "generate(sdpa)":
            bench.hf_generate(model, ids, 16)
        elif variant.startswith("generate"):
            model.generate_ids(ids, max_new_tokens=16, stop_at_eos=False)
        elif variant == "trace(empty)":
            with model.nn.generate(**_gen_kwargs(model, CaptureConfig(max_new_tokens=16, stop_at_eos=False))) as tr:
                with tr.invoke(torch.tensor([ids])):
                    tr.result.save()
        else:
            ts.capture(model, ids, max_new_tokens=16, stop_at_eos=False)

    peak, extra = bench.peak_during(run)
    print(json.dumps({"before": peak - extra, "peak": peak}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, default=2048, help="prompt tokens")
    ap.add_argument("--reps", type=int, default=2, help="fresh processes per variant (interleaved)")
    ap.add_argument("--fixed-mmap", action="store_true", help="glibc's mmap threshold fixed at 1 MiB in every process")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from capture_overhead import FIXED_MMAP, gpt2_small_dir

    with tempfile.TemporaryDirectory() as tmp:
        path = str(gpt2_small_dir(pathlib.Path(tmp), max(2112, args.P + 64)))
        peaks: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(args.reps):
            for v in VARIANTS:
                out = subprocess.run([sys.executable, __file__, "--child", v, path, str(args.P)],
                                     capture_output=True, text=True, check=True,
                                     env={**os.environ, **(FIXED_MMAP if args.fixed_mmap else {})})
                peaks[v].append(json.loads(out.stdout.strip().splitlines()[-1])["peak"])
                print(f"{v:<16} peak {peaks[v][-1]:7.0f} MiB", flush=True)
    base = statistics.median(peaks["generate(sdpa)"])
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "P": args.P, "new_tokens": 16, "reps": args.reps,
              "allocator": "glibc, mmap threshold fixed at 1 MiB" if args.fixed_mmap else "glibc defaults",
              **{v: {"peak_rss_mib": p, "median_ratio": statistics.median(p) / base} for v, p in peaks.items()}}
    for v in VARIANTS:
        print(f"{v:<16} median {statistics.median(peaks[v]):7.0f} MiB  {result[v]['median_ratio']:.2f}× generate(sdpa)")
    out = HERE / "results" / ("trace_memory_fixed_mmap.json" if args.fixed_mmap else "trace_memory.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
