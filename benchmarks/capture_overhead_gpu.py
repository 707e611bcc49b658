"""Benchmark and check on a GPU: issue 32's capture cases on SmolLM2's architecture, and capture's numbers on CUDA.

Run on a CUDA machine (this project's was the lent device: one NVIDIA H200), from the repository root::

    python benchmarks/capture_overhead_gpu.py --arch-dir DIR [--reps 9] [--out FILE]

Two parts, both in one process on ``cuda``, float32, TF32 off (``torch.backends.*.allow_tf32 = False``):

1. **Correctness on CUDA.** For each tiny architecture family of the test suite (GPT-2, GPT-NeoX, Llama,
   Mistral, Qwen2; random 2-layer models) a capture on ``cuda`` with every layer's residual and attention rows
   is compared with an independent Hugging Face eager forward without a cache on ``cuda``
   (``output_attentions``, ``output_hidden_states``), as ``tests/test_capture.py`` does on the CPU: the greedy
   tokens equal HF ``generate``'s, and the largest relative L2 difference of the residuals and the largest
   absolute difference of the attention rows are recorded (the CPU test's bounds are 1e-4 and 1e-5).
2. **Speed**, with the CPU benchmark's own variants and statistics (``benchmarks/capture_overhead.py``:
   ``generate`` with default attention, the capture's ``trace(reads)``, ``capture``; interleaved rounds,
   per-round ratios with distribution-free intervals): a chat prompt with 64 new tokens, P = 1,024 and
   4,096 with 16 new tokens; then peak GPU memory (``torch.cuda.max_memory_allocated``) of one run of each
   variant at P = 8,176 + 16 new tokens.

**The model is SmolLM2-135M-Instruct's architecture with random weights** (its ``config.json``, tokenizer and
chat template from ``--arch-dir``; weights drawn by ``from_config`` with seed 0). The dequantised weights
(98 MB as GGUF, 540 MB in float32) do not fit what travels to the lent machine. The forward's cost does
not depend on the weights' values; what does is small: the residual statistics' massive-activation rule
runs on the vectors whose max |x| exceeds 100, which random weights never produce, and greedy text differs
(every run generates exactly its new tokens: EOS is off, as in the CPU benchmark).
Writes JSON (``--out``, default ``benchmarks/results/capture_overhead_cuda_smollm2arch.json``).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import traceback

import torch

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import capture_overhead as co  # noqa: E402  (the CPU benchmark's variants and statistics)

import trajscope as ts  # noqa: E402


def random_arch_dir(src: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """``src``'s architecture, tokenizer and chat template with random weights (seed 0), saved to ``out``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(src)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def check_cuda(tmp: pathlib.Path, dev: str = "cuda") -> dict:
    """Part 1: capture on ``dev`` against an HF eager forward on ``dev``, per tiny family
    (``tests/test_capture_cuda.measure``, the numbers that test asserts on)."""
    from test_capture_cuda import measure
    from tiny import FAMILIES

    out = {}
    for fam in FAMILIES:
        try:
            out[fam] = {**measure(tmp, fam, dev), "device": dev}
            print(f"  {fam:<9} " + "; ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in out[fam].items()), flush=True)
        except Exception as exc:  # one family's failure is reported and the others still run
            traceback.print_exc()
            out[fam] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def speed(arch: pathlib.Path, reps: int, out: dict, dest: pathlib.Path, dev: str = "cuda") -> None:
    """Part 2: the CPU benchmark's SmolLM2 cases on cuda, and peak GPU memory at P = 8,176."""
    variants = ("generate", "trace(reads)", "capture")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # float32 on both sides (load_model's default on CUDA is bfloat16; the baseline's is float32)
    models = {"rows": ts.load_model(str(arch), device=dev, attn="rows", dtype="float32"),
              "hf-sdpa": (AutoModelForCausalLM.from_pretrained(arch, attn_implementation="sdpa", dtype=torch.float32)
                          .to(dev).eval(), AutoTokenizer.from_pretrained(arch))}
    cases = [("chat", co.chat_ids(models["rows"]), 64), ("P = 1024", co.long_ids(models["rows"], 1024), 16),
             ("P = 4096", co.long_ids(models["rows"], 4096), 16)]
    for label, ids, n in cases:
        try:
            res = co.bench(models, ids, n, reps, variants)
        except Exception as exc:  # reported; the other cases still run
            traceback.print_exc()
            out[f"smollm2-arch, {label}"] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        key = f"smollm2-arch, {label}"
        out[key] = {"new_tokens": n, "prompt_tokens": len(ids), "reps": reps, **res}
        co.report(key, n, reps, res)
        dest.write_text(json.dumps(out, indent=2) + "\n")
    if not dev.startswith("cuda"):
        return
    profile_capture(models, co.long_ids(models["rows"], 4096), out)
    P, mem = 8176, {}
    ids = co.long_ids(models["rows"], P)
    for v in variants:
        co.run_variant(models, v, 2, ids, {})
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        co.run_variant(models, v, 16, ids, {})
        torch.cuda.synchronize()
        mem[v] = {"peak_allocated_mib": torch.cuda.max_memory_allocated() / 2**20,
                  "peak_above_start_mib": (torch.cuda.max_memory_allocated() - base) / 2**20}
    for v in variants:
        mem[v]["memory_ratio"] = mem[v]["peak_allocated_mib"] / mem["generate"]["peak_allocated_mib"]
        mem[v]["above_start_ratio"] = mem[v]["peak_above_start_mib"] / mem["generate"]["peak_above_start_mib"]
    out[f"smollm2-arch, GPU memory at P = {P}"] = {"new_tokens": 16, "prompt_tokens": P, **mem}
    print(f"\npeak GPU memory at P = {P} (both models resident: the HF baseline and the capture's):")
    for v, m in mem.items():
        print(f"  {v:<14} peak {m['peak_allocated_mib']:.0f} MiB ({m['memory_ratio']:.2f}× generate); above the "
              f"resident weights {m['peak_above_start_mib']:.0f} MiB ({m['above_start_ratio']:.2f}×)")
    dest.write_text(json.dumps(out, indent=2) + "\n")


def profile_capture(models: dict, ids: list[int], out: dict) -> None:
    """One capture at P = 4,096 under torch's profiler: the operators with the most device and host time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        co.run_variant(models, "capture", 16, ids, {})
        torch.cuda.synchronize()
    avg = prof.key_averages()
    for key in ("cuda_time_total", "cpu_time_total"):
        table = avg.table(sort_by=key, row_limit=18, max_name_column_width=60)
        print(f"\ncapture at P = 4096, 16 new tokens, by {key}:\n{table}")
        out[f"profile_P4096_by_{key}"] = table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch-dir", type=pathlib.Path, required=True,
                    help="a model directory with SmolLM2's config.json and tokenizer (weights are not read)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", type=pathlib.Path, default=co.RESULTS / "capture_overhead_cuda_smollm2arch.json")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--device", default="cuda", help="cuda (the point); cpu only to smoke-test this script")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_grad_enabled(False)
    dev = args.device
    out: dict = {"machine": f"{torch.cuda.get_device_name(0) if dev.startswith('cuda') else 'cpu'}, torch {torch.__version__}, "
                            f"transformers {__import__('transformers').__version__}",
                 "device": dev, "date": time.strftime("%Y-%m-%d %H:%M"),
                 "model": "SmolLM2-135M-Instruct architecture, random weights (seed 0)"}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        if not args.skip_check:
            print("capture on cuda vs Hugging Face eager on cuda (tiny families):", flush=True)
            out["cuda_check"] = check_cuda(tmp, dev)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        speed(random_arch_dir(args.arch_dir, tmp / "smollm2-arch"), args.reps, out, args.out, dev)


if __name__ == "__main__":
    main()
