"""Benchmark: exporting and reporting at scale — 1,000 runs, and one 100,000-step trajectory.

Synthetic inputs, written once under ``--work`` (default ``/tmp/trajscope-scale``):

- 1,000 run directories, copies of a real 64-step capture of the sample model with their
  own ``run_id`` (tables rewritten, so each run is distinct data);
- one run directory holding a 100,000-step trajectory of the sample model's shape
  (6 layers × 4 heads: 2.4M attention rows, 600k activation rows), built from repeated
  rows of a real capture with positions and steps renumbered.

Measured: wall time and the peak resident memory of a child process doing ``export`` (Hive
dataset, one run streamed at a time) and ``compare(...).save`` (HTML report). Results go to
``benchmarks/results/export_scale.json``.

Run by hand: ``python benchmarks/export_scale.py [--runs 1000] [--steps 100000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = pathlib.Path(__file__).parent / "results"


def make_inputs(work: pathlib.Path, n_runs: int, n_steps: int) -> tuple[list[pathlib.Path], pathlib.Path]:
    import polars as pl

    import trajscope as ts
    from trajscope.trajectory import parquet_metadata

    runs_dir, long_dir = work / "runs", work / "long"
    if (runs_dir / f"r{n_runs - 1:04d}" / "meta.json").exists() and (long_dir / "meta.json").exists():
        return sorted(runs_dir.iterdir()), long_dir
    shutil.rmtree(work, ignore_errors=True)
    model = ts.load_model("sample")
    base = ts.capture(model, "def fibonacci(n):\n    ", max_new_tokens=64, stop_at_eos=False, run_id="r")
    src = base.save(work / "template")
    for i in range(n_runs):
        rid = f"r{i:04d}"
        d = runs_dir / rid
        d.mkdir(parents=True)
        for name in ("tokens", "attention", "activations"):
            df = pl.read_parquet(src / f"{name}.parquet").with_columns(pl.lit(rid).alias("run_id"))
            df.write_parquet(d / f"{name}.parquet", metadata=parquet_metadata(name))
        meta = json.loads((src / "meta.json").read_text())
        meta.update(run_id=rid, tensors=[])
        (d / "meta.json").write_text(json.dumps(meta))
    # one long trajectory: decode rows repeated and renumbered to n_steps steps
    P = base.prompt_len
    long_dir.mkdir(parents=True)
    reps = -(-n_steps // base.n_steps)
    for name in ("tokens", "attention", "activations"):
        df = pl.read_parquet(src / f"{name}.parquet")
        dec = df.filter(pl.col("step") >= 1)
        pre = df.filter(pl.col("step") == 0) if name != "tokens" else df.filter(pl.col("phase") == "prefill")
        blocks = [dec.with_columns((pl.col("step") + k * (base.n_steps - 1)).alias("step"),
                                   (pl.col("pos") + k * (base.n_steps - 1)).alias("pos")) for k in range(reps)]
        out = pl.concat([pre, *blocks]).filter(pl.col("step") <= n_steps)
        out.with_columns(pl.lit("long").alias("run_id")).write_parquet(long_dir / f"{name}.parquet",
                                                                       metadata=parquet_metadata(name))
    meta = json.loads((src / "meta.json").read_text())
    meta.update(run_id="long", tensors=[], n_steps=n_steps + 1, n_generated=n_steps)
    (long_dir / "meta.json").write_text(json.dumps(meta))
    return sorted(runs_dir.iterdir()), long_dir


CHILD = """
import json, resource, sys, time
import trajscope as ts
task, out, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
t = time.perf_counter()
if task == "export":
    ts.export(runs, out, progress=False)
else:
    ts.compare(runs).save(out)
print(json.dumps({"seconds": time.perf_counter() - t,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(task: str, out: pathlib.Path, runs: list[pathlib.Path]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    res = subprocess.run([sys.executable, "-c", CHILD, task, str(out), *map(str, runs)], capture_output=True,
                         text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if res.returncode != 0:
        return {"error": res.stderr.strip().splitlines()[-1] if res.stderr else "failed"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--work", default="/tmp/trajscope-scale")
    args = ap.parse_args()
    work = pathlib.Path(args.work)
    runs, long_dir = make_inputs(work, args.runs, args.steps)
    input_mb = sum(f.stat().st_size for r in runs for f in r.iterdir()) / 2**20
    long_mb = sum(f.stat().st_size for f in long_dir.iterdir()) / 2**20
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "runs": len(runs), "runs_input_mb": round(input_mb, 1),
           "long_steps": args.steps, "long_input_mb": round(long_mb, 1),
           f"export_{len(runs)}_runs": measure("export", work / "ds", runs),
           "export_long": measure("export", work / "ds-long", [long_dir]),
           f"report_{len(runs)}_runs": measure("report", work / "report.html", runs),
           "report_long": measure("report", work / "report-long.html", [long_dir])}
    print(json.dumps(out, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "export_scale.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
