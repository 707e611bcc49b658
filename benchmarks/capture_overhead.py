"""Benchmark: what does capture cost over plain Hugging Face generate?

Variants, interleaved round-robin in one process so drift in machine load hits
them alike:

- ``generate``: ``model.generate`` (greedy, KV cache, eager attention), no nnsight;
- ``capture``: :func:`trajscope.capture` with telemetry only (tokens, attention and
  activations tables for every layer);
- ``capture+resid``: the same plus residual vectors of all layers kept as tensors;
- ``capture+probe``: telemetry plus an online drift probe scoring every layer at every step;
- ``capture+sae``: telemetry plus a TopK SAE (16× width, k 32) encoding a middle layer at every
  position (the shipped SAE for the sample model, a random one for the 124M model), top-16
  features per position into the ``features`` table.

Models: the shipped sample model and a random GPT-2-small-sized model (124M
parameters, built from a config, never downloaded). Prints tokens/s and the
ratio of each variant's median time to ``generate``'s and writes them to
``benchmarks/results/capture_overhead.json``.

Run by hand: ``python benchmarks/capture_overhead.py [--reps 5] [--quick]``.
Targets (issue 2): ≤ 1.10× on the 124M model with telemetry, ≤ 1.5× on the sample model.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import trajscope as ts

PROMPT = "def fibonacci(n):\n    "
RESULTS = pathlib.Path(__file__).parent / "results"


def gpt2_small_dir(tmp: pathlib.Path) -> pathlib.Path:
    """A random 124M GPT-2 (12 layers, d 768, 12 heads, vocab 50257) with the sample tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    path = tmp / "gpt2-small-random"
    if not (path / "config.json").exists():
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config()).save_pretrained(path)
        PreTrainedTokenizerFast.from_pretrained(ts.model.sample_data_dir() / "models" / "trajscope-tiny").save_pretrained(path)
    return path


def extras(model: ts.ModelHandle, ids: torch.Tensor) -> dict:
    """The SAE and drift probe the ``+sae`` / ``+probe`` variants attach."""
    from trajscope.sae.model import SAE, SAEConfig

    mid = model.n_layers // 2
    shipped = ts.model.sample_data_dir() / "saes" / "layer3-prefill-only"
    if model.model_id == "sample" and shipped.exists():
        sae = SAE.load(shipped)
    else:
        sae = SAE(SAEConfig(architecture="topk", d_in=model.d_model, d_sae=16 * model.d_model, k=32,
                            hook_name=f"blocks.{mid}.hook_resid_post"))
    prompts = [ids[0].tolist()[: max(4, ids.shape[1] - i)] for i in range(3)]
    res = []
    for p in prompts:
        t = ts.capture(model, p, max_new_tokens=1, residual_layers="all")
        res.append({layer: t.residual(layer) for layer in range(model.n_layers)})
    profile = ts.profile.profile_from_residuals(res, fpr=0.05)
    return {"sae": sae, "probe": ts.DriftProbe(profile)}


def run_variant(model: ts.ModelHandle, variant: str, n: int, ids: torch.Tensor, extra: dict) -> float:
    t0 = time.perf_counter()
    if variant == "generate":
        with torch.no_grad():
            out = model.torch_module().generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None,
                                                pad_token_id=model.tokenizer.pad_token_id)
        assert out.shape[1] == ids.shape[1] + n
    else:
        kw = {"capture+resid": {"residual_layers": "all"}, "capture+probe": {"probe": extra["probe"]},
              "capture+sae": {"sae": extra["sae"]}}.get(variant, {})
        traj = ts.capture(model, ids[0].tolist(), max_new_tokens=n, stop_at_eos=False, **kw)
        assert traj.meta["n_generated"] == n
    return time.perf_counter() - t0


def bench(model: ts.ModelHandle, n: int, reps: int) -> dict:
    ids = model.tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    variants = ("generate", "capture", "capture+resid", "capture+probe", "capture+sae")
    extra = extras(model, ids)
    for v in variants:  # warm-up
        run_variant(model, v, 4, ids, extra)
    times = {v: [] for v in variants}
    for _ in range(reps):
        for v in variants:
            times[v].append(run_variant(model, v, n, ids, extra))
    base = statistics.median(times["generate"])
    return {v: {"median_s": statistics.median(t), "tokens_per_s": n / statistics.median(t),
                "ratio": statistics.median(t) / base, "times_s": t} for v, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer tokens (smoke run)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    out: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                            f"{torch.get_num_threads()} threads", "date": time.strftime("%Y-%m-%d %H:%M")}
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("sample (5.7M)", lambda: ts.load_model("sample", device="cpu"), 32 if args.quick else 128),
                 ("gpt2-small random (124M)", lambda: ts.load_model(str(gpt2_small_dir(pathlib.Path(tmp))), device="cpu"),
                  16 if args.quick else 64)]
        for name, load, n in cases:
            model = load()
            res = bench(model, n, args.reps)
            out[name] = {"new_tokens": n, **res}
            print(f"\n{name}, {n} new tokens, median of {args.reps} interleaved runs")
            print(f"  {'variant':<15}{'tokens/s':>10}{'× generate':>12}")
            for v, r in res.items():
                print(f"  {v:<15}{r['tokens_per_s']:>10.1f}{r['ratio']:>12.3f}")
            del model
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "capture_overhead.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwritten to {RESULTS / 'capture_overhead.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
