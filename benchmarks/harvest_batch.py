"""Benchmark: activation-harvest throughput at batch 1, 4 and 16, as ratios in one run.

:func:`trajscope.studies.harvest.harvest_served` reads every block output of every prompt
position (what an SAE dataset harvest keeps) for the same prompts at each batch size, right
padding. Batch sizes are interleaved round-robin per repetition so drift in machine load
hits them alike; the median time per batch size gives tokens/s (real tokens, padding not
counted) and the ratio to batch 1.

Models: the shipped sample model and a random GPT-2-small-sized model (124M parameters,
built from a config with random weights, never downloaded). Prompts: the held-out code
prompts, cut to ``--max-tokens``. Writes ``benchmarks/results/harvest_batch.txt``.

``--smollm2`` measures instead what issue 32 asks of a batched harvest on the real model
(SmolLM2-135M-Instruct, ``trajscope.load_model("smollm2")``): the prefill rows of one middle layer
(block 15 of 30) at batch 16, :func:`~trajscope.studies.harvest.harvest_served` (which stops the
forward after that block) against a plain batched Hugging Face forward of the same padded batches
on a model loaded by ``transformers`` itself (SDPA, no nnsight), stopped after the same block by a
forward hook; beside them, the model boundary's ``forward_batch`` (every block and the logits of
every position: how the batched harvest ran before). Round r starts at the r-th variant, so each
takes each place in the order equally often;
the ratio is tokens/s of the harvest over tokens/s of the plain forward per round, as a median with
a distribution-free interval (``capture_overhead.paired``). Writes
``benchmarks/results/harvest_batch_smollm2.json``.

Run by hand: ``python benchmarks/harvest_batch.py [--prompts 32] [--reps 3] [--threads N]``, or
``python benchmarks/harvest_batch.py --smollm2 [--prompts 64] [--reps 7] [--threads 1]``.
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


class _Stop(Exception):
    pass


def plain_to_layer(hf, batches: list[tuple[torch.Tensor, torch.Tensor]], layer: int) -> list[torch.Tensor]:
    """The baseline: a plain HF forward of each padded batch, stopped by a hook after block ``layer``."""
    out: list[torch.Tensor] = []

    def hook(_m, _i, o):
        out.append((o[0] if isinstance(o, tuple) else o).float())
        raise _Stop

    h = hf.model.layers[layer].register_forward_hook(hook)
    try:
        for ids, att in batches:
            try:
                hf(input_ids=ids, attention_mask=att, position_ids=(att.cumsum(-1) - 1).clamp_min(0), use_cache=False)
            except _Stop:
                pass
    finally:
        h.remove()
    return out


def smollm2(args) -> None:
    """Issue 32's case: harvest of block 15's prefill rows at batch 16 vs a plain HF forward stopped there."""
    sys.path.insert(0, str(ROOT))
    from capture_overhead import paired
    from transformers import AutoModelForCausalLM

    from trajscope.model.batch import _padded

    torch.set_grad_enabled(False)
    model = load_model("smollm2")
    layer, B = model.n_layers // 2, 16
    hf = AutoModelForCausalLM.from_pretrained(model.nn._module.config._name_or_path,  # the dequantised GGUF cache
                                              attn_implementation="sdpa", dtype=torch.float32).eval()
    items = read_prompt_file(sample_data_dir() / "prompts" / "heldout_code.jsonl", args.prompts)
    prompts = encode_prompts(model, items, args.max_tokens)
    n_tok = sum(len(ids) for _, ids in prompts)
    seqs = [ids for _, ids in prompts]
    batches = [_padded(model, seqs[i:i + B], "right") for i in range(0, len(seqs), B)]
    # the harvest and the plain forward agree before anything is timed (same blocks, same padding and positions)
    ours = harvest_served(model, prompts[:B], [layer], batch_size=B).acts[layer]
    ref = plain_to_layer(hf, batches[:1], layer)[0]
    ref = torch.cat([ref[i][batches[0][1][i].bool()] for i in range(ref.shape[0])])
    max_diff = float((ours - ref).abs().max() / ref.abs().max())
    variants = {"plain HF forward to the layer": lambda: plain_to_layer(hf, batches, layer),
                "harvest_served (stops after the layer)": lambda: harvest_served(model, prompts, [layer], batch_size=B),
                "forward_batch (every block and the logits: the harvest before issue 32)":
                    lambda: [model.forward_batch(seqs[i:i + B], layers=[layer]) for i in range(0, len(seqs), B)]}
    names = list(variants)
    times: dict[str, list[float]] = {v: [] for v in names}
    load = [os.getloadavg()[0]]
    for r in range(args.reps):  # round r starts at variant r: each takes each place in the order in turn
        for v in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            variants[v]()
            times[v].append(time.perf_counter() - t0)
        load.append(os.getloadavg()[0])
    base = names[0]
    # tokens/s ratio = time ratio inverted: harvest tokens/s over plain tokens/s per round
    per = paired(times[base], times[names[1]])
    before = paired(times[base], times[names[2]])
    out = {"case": f"SmolLM2-135M-Instruct, block {layer} of {model.n_layers}, prefill rows, batch {B}, right padding",
           "prompts": len(prompts), "tokens": n_tok, "max_tokens": args.max_tokens, "reps": args.reps,
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs shared with other work, torch {torch.__version__}, "
                      f"{torch.get_num_threads()} threads",
           "date": time.strftime("%Y-%m-%d %H:%M"), "load_average_1min": load,
           "agreement_max_rel_diff": max_diff,
           **{v: {"median_s": statistics.median(t), "tokens_per_s": n_tok / statistics.median(t), "times_s": t}
              for v, t in times.items()},
           "tokens_per_s_ratio": {"of_medians": statistics.median(times[base]) / statistics.median(times[names[1]]),
                                  "paired": per["paired_ratio"], "interval": per["paired_interval"],
                                  "coverage": per["paired_coverage"]},
           "tokens_per_s_ratio_before": {"paired": before["paired_ratio"], "interval": before["paired_interval"]},
           "target": ">= 0.9"}
    path = pathlib.Path(args.out if args.out != str(ROOT / "results" / "harvest_batch.txt")
                        else ROOT / "results" / "harvest_batch_smollm2.json")
    path.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32, help="prompts per harvest")
    ap.add_argument("--max-tokens", type=int, default=64, help="cut each prompt to its first N tokens")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per batch size (median)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--out", default=str(ROOT / "results" / "harvest_batch.txt"))
    ap.add_argument("--smollm2", action="store_true", help="issue 32's case on SmolLM2 (see the module docstring)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.smollm2:
        smollm2(args)
        return
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
