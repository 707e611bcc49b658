"""Benchmark: server-side time from a step change to updated plots, on a 1,000-step run.

Captures one run of the sample model with ``max_new_tokens=1000`` (full attention
rows of layer 0, the layer the app shows first) and caches it under
``/tmp/trajscope-bench-1000`` (delete it to recapture). Then renders the whole
:class:`trajscope.TrajScope` app into a Bokeh document, as a served session
would, and times ``state.step = s`` for random steps: that assignment runs every
watcher synchronously (cursor annotations, layer × head grid, top keys, readout)
and leaves the Bokeh models updated, ready to be sent. Reports median and p95.

Run: ``python benchmarks/ui_step.py [--n 200]``. Target: median ≤ 100 ms.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CACHE = pathlib.Path("/tmp/trajscope-bench-1000")


def long_run():
    import trajscope as ts

    if (CACHE / "meta.json").exists():
        return ts.Trajectory.load(CACHE)
    model = ts.load_model("sample")
    t0 = time.perf_counter()
    traj = ts.capture(model, "import os\nimport sys\n\n\nclass ", max_new_tokens=1000, stop_at_eos=False,
                      attention_layers=[0])
    print(f"captured {traj.n_steps} steps in {time.perf_counter() - t0:.1f} s")
    traj.save(CACHE)
    return traj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="step changes to time")
    args = ap.parse_args()
    from bokeh.document import Document

    import trajscope as ts

    traj = long_run()
    app = ts.TrajScope(trajectory=traj)
    doc = Document()
    t0 = time.perf_counter()
    app.__panel__().get_root(doc)
    print(f"run: {traj.n_steps} steps, {len(traj.tokens)} tokens; first render {1000 * (time.perf_counter() - t0):.0f} ms")
    rng = random.Random(0)
    n_steps = app.state.n_steps
    times = []
    for i in range(args.n):
        step = rng.randrange(n_steps) if i % 2 else min(n_steps - 1, app.state.step + 1)  # jumps and Next presses
        t = time.perf_counter()
        app.state.step = step
        times.append(1000 * (time.perf_counter() - t))
    times.sort()
    p95 = times[int(0.95 * (len(times) - 1))]
    print(f"step change → updated plots: median {statistics.median(times):.1f} ms, p95 {p95:.1f} ms, "
          f"max {times[-1]:.1f} ms over {len(times)} changes (target median ≤ 100 ms)")


if __name__ == "__main__":
    main()
