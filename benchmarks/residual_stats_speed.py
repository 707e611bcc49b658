"""Micro-benchmark: the prefill's residual statistics per layer, before and after fusing their passes.

What a capture computes for each layer's ``[P, d_model]`` block output at prefill
(``kernels.prefill_layer``): ``residual_stats(r, median_abs=pooled_median_abs(r), pooled=True)``. Two
versions run interleaved in one process, each rep alternating which goes first:

- ``before``: ``trajscope/metrics/residual_stats.py`` and ``kernels.pooled_median_abs`` as they stood at
  commit 2011b0a (read with ``git show``, so the command needs the repository's history): about a
  dozen passes over the block, a bool tensor per count (whose sum copies the block to int64);
- ``after``: the installed code: one reused ``[P, d]`` buffer, counts from comparisons written into it,
  the massive-activation rule on the vectors whose max |x| passes its bar only.

The two must return the same bits (checked on every block; the run stops otherwise). Blocks:

- ``--source synthetic`` (default): Student-t(3) values × 0.8 at d = 576 (SmolLM2's width) with a sink
  row like SmolLM2's (every value 30, one −25,000), fresh per layer, 30 layers;
- ``--source smollm2``: SmolLM2-135M-Instruct's real block outputs (all 30 layers) on P tokens of real
  text (``capture_overhead.long_ids``), from a ``transformers`` forward with hooks; loads the model.

Prints, per P, the median per-layer time of each version (median over reps of the mean over layers),
the per-layer time summed over the layers, and the per-rep ratio after ÷ before as a median with a
distribution-free interval (order statistics, ``capture_overhead.paired``). Writes
``benchmarks/results/residual_stats_speed[_smollm2].json``.

Run: ``OMP_NUM_THREADS=1 python benchmarks/residual_stats_speed.py --threads 1 --reps 15`` (synthetic) or
``... --source smollm2`` (issue 32: P = 1,024 and 4,096 on one core).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from capture_overhead import RESULTS, long_ids, paired  # (this folder's)

from trajscope.capture import kernels
from trajscope.metrics.residual_stats import residual_stats

BEFORE = "2011b0a"
REPO = pathlib.Path(__file__).resolve().parent.parent


def before_functions():
    """``(residual_stats, pooled_median_abs)`` as they stood at commit BEFORE, loaded from git."""
    import importlib.util
    import tempfile

    def load(path: str, name: str, folder: pathlib.Path) -> types.ModuleType:
        src = subprocess.run(["git", "-C", str(REPO), "show", f"{BEFORE}:{path}"], check=True,
                             capture_output=True, text=True).stdout
        file = folder / f"{name}.py"
        file.write_text(src)
        spec = importlib.util.spec_from_file_location(name, file)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    with tempfile.TemporaryDirectory() as tmp:
        rs = load("trajscope/metrics/residual_stats.py", "before_residual_stats", pathlib.Path(tmp))
        kn = load("trajscope/capture/kernels.py", "before_kernels", pathlib.Path(tmp))
    kn.residual_stats = rs.residual_stats
    return rs.residual_stats, kn.pooled_median_abs


def synthetic_blocks(P: int, n_layers: int = 30, d: int = 576) -> list[torch.Tensor]:
    torch.manual_seed(P)
    blocks = []
    for _ in range(n_layers):
        x = torch.distributions.StudentT(3.0).sample((P, d)) * 0.8
        x[0] = 30.0
        x[0, 3] = -25_000.0
        blocks.append(x.contiguous())
    return blocks


def smollm2_blocks(P: int) -> list[torch.Tensor]:
    """SmolLM2's 30 block outputs ``[P, 576]`` on P tokens of real text (a plain ``transformers`` forward)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trajscope.model.gguf_cache import gguf_model_dir, smollm2_gguf_or_raise

    local = str(gguf_model_dir(smollm2_gguf_or_raise(), progress=False))
    hf = AutoModelForCausalLM.from_pretrained(local, attn_implementation="sdpa", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(local)
    ids = long_ids((hf, tok), P)
    blocks: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda m, i, o: blocks.append((o[0] if isinstance(o, tuple) else o)[0].clone()))
             for layer in hf.model.layers]
    try:
        with torch.no_grad():
            hf.model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return blocks


def layer_stats(fns, r: torch.Tensor) -> torch.Tensor:
    stats, pooled_median = fns
    return stats(r, median_abs=pooled_median(r), pooled=True)


def bench(blocks: list[torch.Tensor], reps: int) -> dict:
    versions = {"before": before_functions(), "after": (residual_stats, kernels.pooled_median_abs)}
    candidates = [int((r.abs().amax(-1) > 100).sum()) for r in blocks]
    for r in blocks:  # the same bits, and a warm-up
        a, b = layer_stats(versions["before"], r), layer_stats(versions["after"], r)
        if not torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)):
            sys.exit("before and after differ: the fused kernel is not the unfused one")
    times = {v: [] for v in versions}
    for rep in range(reps):
        order = list(versions) if rep % 2 == 0 else list(versions)[::-1]
        for v in order:
            t0 = time.perf_counter()
            for r in blocks:
                layer_stats(versions[v], r)
            times[v].append((time.perf_counter() - t0) / len(blocks))
    ratio = paired(times["after"], times["before"])
    return {"layers": len(blocks), "reps": reps, "vectors_with_max_abs_over_100_per_layer": candidates,
            **{f"{v}_per_layer_ms": [1e3 * t for t in ts] for v, ts in times.items()},
            **{f"{v}_per_layer_median_ms": 1e3 * statistics.median(ts) for v, ts in times.items()},
            "after_over_before": ratio}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", choices=("synthetic", "smollm2"), default="synthetic")
    ap.add_argument("--lengths", type=int, nargs="*", default=[1024, 4096])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    out = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                      f"{torch.get_num_threads()} threads", "date": time.strftime("%Y-%m-%d %H:%M"),
           "source": args.source, "before": f"commit {BEFORE}"}
    for P in args.lengths:
        blocks = synthetic_blocks(P) if args.source == "synthetic" else smollm2_blocks(P)
        load = os.getloadavg()[0]
        res = bench(blocks, args.reps)
        res["load_average_1min"] = [load, os.getloadavg()[0]]
        out[f"P = {P}"] = res
        r = res["after_over_before"]
        b, a = res["before_per_layer_median_ms"], res["after_per_layer_median_ms"]
        print(f"P = {P}, {res['layers']} layers, {args.reps} reps: per layer before {b:.2f} ms, after {a:.2f} ms "
              f"(over the layers: {b * res['layers']:.0f} → {a * res['layers']:.0f} ms); after ÷ before per rep "
              f"{r['paired_ratio']:.3f} [{r['paired_interval'][0]:.3f}, {r['paired_interval'][1]:.3f}] "
              f"({r['paired_coverage']:.0%}); vectors with max |x| > 100 per layer: "
              f"median {statistics.median(res['vectors_with_max_abs_over_100_per_layer'])}", flush=True)
        del blocks
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"residual_stats_speed{'_smollm2' if args.source == 'smollm2' else ''}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
