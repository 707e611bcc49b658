"""Benchmark: one capture against another, from two source trees, paired round by round.

Two worker processes, each importing ``trajscope`` from its own tree (``--old``, e.g. an earlier commit
unpacked with ``git archive <commit> | tar -x -C DIR``; ``--new``, this checkout), load SmolLM2 and run
``trace(reads)`` and ``capture`` (``benchmarks/capture_overhead.py``'s variants) on the same prompt,
one run at a time, in a rotating order: round r starts at the r-th of the four (tree, variant) pairs.
Each run is timed by its worker's CPU time (``time.process_time``; one torch thread), so time spent
waiting for a shared core is left out; with ``--device cuda`` (and ``--model-dir``, SmolLM2's architecture
with random weights as ``benchmarks/capture_overhead_gpu.py`` makes it) by the wall clock between two device
syncs, on the float32 model. Prints and writes (``--out``) the per-round ratios new ÷ old of
each variant and capture ÷ trace(reads) of each tree, as medians with distribution-free intervals
(``capture_overhead.paired``)::

    git archive 7fe8b8f | tar -x -C /tmp/old
    taskset -c 1 python benchmarks/capture_ab.py --old /tmp/old --case chat --rounds 9

Both trees run this file's copy of ``capture_overhead.py``'s variants only if ``--old`` has the same
benchmark file (copy it there when it predates ``--clock``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def worker(tree: str, case: str, device: str = "cpu", model_dir: str = "") -> None:
    """Load the model from ``tree``'s trajscope, then run each variant named on stdin; print its time (CPU time
    on the CPU, wall-clock time after a device sync on a GPU)."""
    sys.path.insert(0, os.path.join(tree, "benchmarks"))
    import torch

    torch.set_grad_enabled(False)
    import capture_overhead as b
    import trajscope as ts

    if not ts.__file__.startswith(tree):
        raise SystemExit(f"trajscope was imported from {ts.__file__}, not from {tree}")
    if device == "cpu":
        torch.set_num_threads(1)
        m = b.load_models("smollm2", "cpu", ("rows",))
        clock, sync = time.process_time, lambda: None
    else:  # a GPU: SmolLM2's architecture from --model-dir, float32 as benchmarks/capture_overhead_gpu.py loads it
        torch.backends.cuda.matmul.allow_tf32 = False
        m = {"rows": ts.load_model(model_dir, device=device, attn="rows", dtype="float32")}
        clock, sync = time.perf_counter, torch.cuda.synchronize
    ids = b.chat_ids(m["rows"]) if case == "chat" else b.long_ids(m["rows"], int(case))
    n = 64 if case == "chat" else 16
    for v in ("trace(reads)", "capture"):
        b.run_variant(m, v, 2, ids, {})
    print("ready", flush=True)
    for line in sys.stdin:
        sync()
        t0 = clock()
        b.run_variant(m, line.strip(), n, ids, {})
        sync()
        print(json.dumps(clock() - t0), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the tree to compare against (its trajscope and benchmarks/)")
    ap.add_argument("--new", default=str(HERE.parent), help="default: this checkout")
    ap.add_argument("--case", default="chat", help="'chat' (64 new tokens) or a prompt length (16 new tokens)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default=None, help="JSON file (default: benchmarks/results/capture_ab_<case>.json)")
    ap.add_argument("--device", default="cpu", help="cpu (CPU time, one thread) or cuda (wall clock)")
    ap.add_argument("--model-dir", default="", help="on a GPU: a directory with SmolLM2's architecture "
                    "(benchmarks/capture_overhead_gpu.py's random weights)")
    ap.add_argument("--worker", nargs=2, metavar=("TREE", "CASE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(*args.worker, args.device, os.path.abspath(args.model_dir) if args.model_dir else "")
    sys.path.insert(0, str(HERE))
    from capture_overhead import paired

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    trees = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    extra = ["--device", args.device] + (["--model-dir", os.path.abspath(args.model_dir)] if args.model_dir else [])
    procs = {k: subprocess.Popen([sys.executable, __file__, "--old", "-", "--worker", t, args.case, *extra],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env={**env, "PYTHONPATH": os.pathsep.join([t, os.environ.get("PYTHONPATH", "")])})
             for k, t in trees.items()}
    for k, p in procs.items():
        if p.stdout.readline().strip() != "ready":
            raise SystemExit(f"the {k} worker ({trees[k]}) did not start")
    order = [(t, v) for v in ("trace(reads)", "capture") for t in ("old", "new")]
    times: dict = {o: [] for o in order}
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for t, v in order[r % 4:] + order[:r % 4]:
            procs[t].stdin.write(v + "\n")
            procs[t].stdin.flush()
            times[(t, v)].append(json.loads(procs[t].stdout.readline()))
        print(r, {f"{t} {v}": round(x[-1], 2) for (t, v), x in times.items()}, flush=True)
    load.append(os.getloadavg()[0])
    for p in procs.values():
        p.stdin.close()
        p.wait()
    clock = "process CPU time" if args.device == "cpu" else f"wall clock, synchronised ({args.device})"
    out = {"case": args.case, "rounds": args.rounds, "trees": trees, "clock": clock, "device": args.device,
           "date": time.strftime("%Y-%m-%d %H:%M"), "load_average_1min": load,
           "times_s": {f"{t} {v}": x for (t, v), x in times.items()}}
    for v in ("trace(reads)", "capture"):
        out[f"new/old {v}"] = paired(times[("new", v)], times[("old", v)])
    for t in ("old", "new"):
        out[f"{t} capture/trace(reads)"] = paired(times[(t, "capture")], times[(t, "trace(reads)")])
    for k, v in out.items():
        if isinstance(v, dict) and "paired_ratio" in v:
            lo, hi = v["paired_interval"]
            print(f"{k}: {v['paired_ratio']:.3f} [{lo:.3f}, {hi:.3f}] ({v['paired_coverage']:.0%})")
    path = pathlib.Path(args.out or HERE / "results" / f"capture_ab_{args.case}.json")
    path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
