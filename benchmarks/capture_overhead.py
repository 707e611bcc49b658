"""Benchmark: what does capture cost over plain Hugging Face generate?

Variants, interleaved round-robin in one process so drift in machine load hits
them alike; round r starts at the r-th variant, so each variant runs in each place of the order
equally often (in a fixed order, the variant after ``generate(eager)`` ran 3–5% slower than the
same work elsewhere in the round: ``capture`` 1.10× while ``capture+resid``, a superset, 1.06×):

- ``generate``: plain Hugging Face ``generate`` (greedy, KV cache) with the model's
  *default* attention (SDPA), on a model loaded by ``transformers`` itself — no nnsight, not even
  the envoys nnsight installs on a loaded model's modules (those alone cost ~1% per step:
  ``docs/capture_overhead.md``) — the baseline of every ratio;
- ``generate(eager)``: the same with eager attention, reported beside it;
- ``trace(empty)``: an nnsight ``generate`` trace with an empty body on the capture's model, with
  the capture's forward (the rows attention as a capture runs it: SDPA at decode, each decode query
  left in a ``RowSink``; nnsight's envoys on every module): the floor under any capture that runs
  inside one nnsight trace, as DESIGN.md's one engine does;
- ``trace(reads)``: the capture's own generation trace (``ModelHandle.generation``: the ``tracer.iter``
  loop reading the streamer, every block's output and the logits at every step, each layer's rows
  taken from the sink; the prefill's reads dropped layer by layer, as a capture reduces them) with a
  step function that keeps nothing: what the capture's reads cost before any telemetry is computed;
- ``capture``: :func:`trajscope.capture` with telemetry only (tokens, attention and
  activations tables for every layer), on the default ``attn="rows"`` model (SDPA
  forward, attention rows from q and K: every decode row, the last 32 prefill rows);
- ``capture(eager)``: the same capture on an eager-attention model (every row materialised);
- ``capture+resid``: the same plus residual vectors of all layers kept as tensors;
- ``capture+probe``: telemetry plus an online drift probe scoring every layer at every step;
- ``capture+sae``: telemetry plus a TopK SAE (16× width, k 32) encoding a middle layer at every
  position (the shipped SAE for the sample model, a random one for the 124M model), top-16
  features per position into the ``features`` table.

Each ratio is given twice: the ratio of the medians, and the median of the per-round ratios (a
variant's run over the ``generate`` run of the same round) with a distribution-free interval
(order statistics; with 7 rounds, the full range, 98% coverage).
Every case that runs ``trace(reads)`` also gives each variant's per-round ratio to it
(``vs_trace_reads_*`` in the JSON; capture's is printed under the table): what trajscope adds to its
own trace, issue 32's target ≤ 1.03×. On the 124M model alone that is
``python benchmarks/capture_overhead.py --only short --short-reps 20 --no-memory`` (the sample and
124M short-context cases; writes ``benchmarks/results/capture_overhead_short.json``) and
``--only long --reps 9 --no-memory`` for P = 1,024 and 2,048 (``capture_overhead_long.json``).

Cases: the shipped sample model and a random GPT-2-small-sized model (124M
parameters, built from a config, never downloaded) at short context, and the
124M model at long context (P = 1,024 and 2,048 prompt tokens, 16 new tokens;
its position table is widened to 2,112 so both fit). Prints tokens/s and the
ratio of each variant's median time to ``generate``'s, and for the long-context
case at the longest prompt the peak resident memory of one run of each variant in a fresh process
(median of --memory-reps processes each), as a ratio to ``generate``'s, twice: with glibc's
default allocator settings, and with its mmap threshold fixed at 1 MiB for every variant alike
(``MALLOC_MMAP_THRESHOLD_``). By default glibc raises that threshold as large blocks are freed, so
later blocks of the same size come from the heap, which keeps freed memory mapped: the same run's
peak then moves by ±150 MiB from process to process with the order of allocations, the baseline's
included. With the threshold fixed, each tensor of 1 MiB or more is mapped and unmapped on its own,
and the peak measures what the run keeps alive (repeatable to a few MiB). Writes
``benchmarks/results/capture_overhead.json``.

Run by hand: ``python benchmarks/capture_overhead.py [--reps 3] [--short-reps 15] [--quick] [--device cuda]
[--only short|long]``.

``--clock cpu`` times each run by the process's CPU time (``time.process_time``) instead of the wall
clock: on a machine shared with other jobs, time spent waiting for the core is left out (contention for
caches and memory is not). With ``--threads 1`` that is the run's own computation.

``--smollm2`` runs issue 32's cases on SmolLM2-135M-Instruct (``trajscope.load_model("smollm2")``; the
baseline loads the same dequantised weights with ``transformers``): a chat prompt (one user turn, 47
tokens) with 64 new tokens, and P = 1,024 and 4,096 with 16 new tokens, each with ``generate``,
``trace(reads)`` and ``capture``, plus capture over ``trace(reads)`` per round (what trajscope adds to its
own trace); then peak resident memory at P = 8,176 (with the 16 new tokens, all 8,192 positions) in fresh processes with the mmap threshold fixed.
Each case records the 1-minute load average before and after it. Writes
``benchmarks/results/capture_overhead_smollm2.json``:
``python benchmarks/capture_overhead.py --smollm2 --threads 1 --reps 5 --short-reps 9 --memory-reps 3``.
Issue 32's targets: capture ≤ 1.10× generate for the chat case and at P = 1,024 and 4,096; peak memory
at P = 8,192 ≤ 1.2× generate's; capture ≤ 1.03× trace(reads).
Targets (issue 16): capture ≤ 1.10× default generate at P = 1,024 and 2,048; ≤ 1.05× on the
124M model at short context; ≤ 1.3× on the sample model; peak memory at P = 2,048 ≤ 1.2×.
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
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import trajscope as ts
from trajscope.model import ModelHandle

PROMPT = "def fibonacci(n):\n    "
RESULTS = pathlib.Path(__file__).parent / "results"
LONG = (1024, 2048)
CLOCK = time.perf_counter  # --clock cpu: time.process_time (this process's CPU time; see main)


def gpt2_small_dir(tmp: pathlib.Path, n_positions: int = 1024) -> pathlib.Path:
    """A random 124M GPT-2 (12 layers, d 768, 12 heads, vocab 50257) with the sample tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    path = tmp / f"gpt2-small-random-{n_positions}"
    if not (path / "config.json").exists():
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config(n_positions=n_positions)).save_pretrained(path)
        PreTrainedTokenizerFast.from_pretrained(ts.model.sample_data_dir() / "models" / "trajscope-tiny").save_pretrained(path)
    return path


def extras(model: ModelHandle, ids: list[int]) -> dict:
    """The SAE and drift probe the ``+sae`` / ``+probe`` variants attach."""
    from trajscope.profile import profile_from_residuals
    from trajscope.sae.model import SAE, SAEConfig

    mid = model.n_layers // 2
    shipped = ts.model.sample_data_dir() / "saes" / "layer3-prefill-only"
    if model.model_id == "sample" and shipped.exists():
        sae = SAE.load(shipped)
    else:
        sae = SAE(SAEConfig(architecture="topk", d_in=model.d_model, d_sae=16 * model.d_model, k=32,
                            hook_name=f"blocks.{mid}.hook_resid_post"))
    res = []
    for p in [ids[: max(4, len(ids) - i)] for i in range(3)]:
        fw = model.forward(p, layers=range(model.n_layers))
        res.append(fw.resid)
    return {"sae": sae, "probe": ts.DriftProbe(profile_from_residuals(res, fpr=0.05))}


def load_models(path: str, device: str, attns=("rows", "eager", "sdpa")) -> dict:
    """``{attn: trajscope handle}`` for "rows" / "eager" (the captures) and ``{"hf-" + attn: (model,
    tokenizer)}`` for "sdpa" / "eager" (the baselines: loaded by ``transformers`` itself, no nnsight)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    models: dict = {a: ts.load_model(path, device=device, attn=a) for a in attns if a in ("rows", "eager")}
    local = str(ts.model.sample_data_dir() / "models" / "trajscope-tiny") if path == "sample" else path
    if path == "smollm2":  # the dequantised GGUF's model directory (a cache hit: no conversion)
        from trajscope.model.gguf_cache import gguf_model_dir, smollm2_gguf_or_raise

        local = str(gguf_model_dir(smollm2_gguf_or_raise(), progress=False))
    for a in attns:
        if a in ("sdpa", "eager"):
            hf = AutoModelForCausalLM.from_pretrained(local, attn_implementation=a, dtype=torch.float32)
            models[f"hf-{a}"] = (hf.to(device).eval(), AutoTokenizer.from_pretrained(local))
    return models


def hf_generate(entry: tuple, ids: list[int], n: int) -> list[int]:
    """Plain ``transformers`` greedy ``generate`` with the KV cache, EOS off (the capture's settings)."""
    hf, tok = entry
    x = torch.tensor([ids], device=hf.device)
    return hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, temperature=None,
                       top_p=None, top_k=None, eos_token_id=[], pad_token_id=tok.pad_token_id)[0].tolist()


def empty_trace(model: ModelHandle, ids: list[int], n: int) -> list[int]:
    """An nnsight ``generate`` trace that reads nothing, on the capture's model, settings and forward (the
    decode queries left in a row sink, as in a capture): the floor under any capture that runs inside one
    nnsight trace."""
    from trajscope.model.attention import RowSink, collect_rows

    class Discard(RowSink):
        """A sink that keeps nothing: the trace has no loop to empty it after each step."""

        def add(self, rows):
            pass

        def defer(self, query, key, scaling):
            pass

    with model.lock, collect_rows(model.nn._module.config, Discard()):
        with model.nn.generate(max_new_tokens=n, do_sample=False, eos_token_id=[],
                               pad_token_id=model.tokenizer.pad_token_id) as tracer:
            with tracer.invoke(torch.tensor([ids])):
                pass
            with tracer.invoke():
                out = tracer.result.save()
    return out[0].tolist()


def reads_trace(model: ModelHandle, ids: list[int], n: int) -> list[int]:
    """The capture's generation trace (every read a capture makes) with a step function that keeps nothing."""
    def keep_nothing(step, P, consumed, attn_rows, resid, logits, prev_lp, opts, out):
        return None

    def drop_layer(layer, P, rows, resid, opts):  # each prefill layer's reads dropped as read (a capture reduces them)
        return None

    from trajscope.capture import _gen_kwargs  # the capture's own generate settings, prompt window included

    cfg = ts.CaptureConfig(max_new_tokens=n, stop_at_eos=False)
    final, _, _ = model.generation(ids, _gen_kwargs(model, cfg), keep_nothing, (), [()] * model.n_layers, n,
                                   prefill_rows=cfg.prefill_row_limit, layer_fn=drop_layer)
    return final


def run_variant(models: dict, variant: str, n: int, ids: list[int], extra: dict) -> float:
    t0 = CLOCK()
    if variant.startswith("generate"):
        out = hf_generate(models["hf-eager" if "eager" in variant else "hf-sdpa"], ids, n)
        assert len(out) == len(ids) + n
    elif variant == "trace(empty)":
        assert len(empty_trace(models["rows"], ids, n)) == len(ids) + n
    elif variant == "trace(reads)":
        assert len(reads_trace(models["rows"], ids, n)) == len(ids) + n
    else:
        kw = {"capture+resid": {"residual_layers": "all"}, "capture+probe": {"probe": extra.get("probe")},
              "capture+sae": {"sae": extra.get("sae")}}.get(variant, {})
        m = models["eager" if "eager" in variant else "rows"]
        traj = ts.capture(m, ids, max_new_tokens=n, stop_at_eos=False, **kw)
        assert traj.meta["n_generated"] == n
    return CLOCK() - t0


def bench(models: dict, ids: list[int], n: int, reps: int, variants: tuple[str, ...]) -> dict:
    extra = extras(models["rows"], ids) if any("+" in v for v in variants) else {}
    for v in variants:  # warm-up
        run_variant(models, v, 2, ids, extra)
    times = {v: [] for v in variants}
    for r in range(reps):  # round r starts at variant r: each variant takes each place in the order in turn
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            times[v].append(run_variant(models, v, n, ids, extra))
    base = statistics.median(times["generate"])
    return {v: {"median_s": statistics.median(t), "tokens_per_s": n / statistics.median(t),
                "ratio": statistics.median(t) / base, "times_s": t, **paired(t, times["generate"])}
            for v, t in times.items()}


def paired(times: list[float], base: list[float], level: float = 0.95) -> dict:
    """The ratio to ``generate`` per round (each run against the generate run of its own round), as a
    median with a distribution-free interval: order statistics ``(j, n + 1 − j)`` of the n ratios, with
    the largest j whose coverage ``1 − 2·P(Binomial(n, ½) ≤ j − 1)`` is still ≥ ``level`` (j = 1 when
    even the full range covers less; the coverage is reported)."""
    from math import comb

    r = sorted(t / b for t, b in zip(times, base))
    n = len(r)

    def coverage(j: int) -> float:
        return 1 - 2 * sum(comb(n, i) for i in range(j)) / 2 ** n

    j = 1
    while j + 1 <= n // 2 and coverage(j + 1) >= level:
        j += 1
    return {"paired_ratio": statistics.median(r), "paired_interval": [r[j - 1], r[n - j]],
            "paired_coverage": coverage(j)}


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_during(run) -> tuple[float, float]:
    """(peak RSS while ``run()`` runs, peak minus the RSS before it), MiB, sampled every 2 ms."""
    import gc
    import threading

    gc.collect()
    before = _rss_mib()
    peak, done = [before], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mib())
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        run()
    finally:
        done.set()
        t.join()
    return peak[0], peak[0] - before


def measure_peak(models: dict, variant: str, n: int, ids: list[int]) -> tuple[float, float]:
    """:func:`peak_during` one run of ``variant``."""
    return peak_during(lambda: run_variant(models, variant, n, ids, {}))


FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}  # glibc: every block of 1 MiB or more mapped on its own


def peak_rss(path: str, variant: str, P: int, n: int, device: str, env: dict | None = None) -> tuple[float, float]:
    """:func:`measure_peak` of one variant in a fresh process (so earlier runs leave no high-water mark),
    with ``env`` added to its environment (e.g. :data:`FIXED_MMAP`)."""
    code = (f"import sys; sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r});"
            "import capture_overhead as b, trajscope as ts, torch; torch.set_grad_enabled(False);"
            f"v = {variant!r}; attns = ('eager',) if 'eager' in v else (('sdpa',) if v.startswith('generate') else ('rows',));"
            f"m = b.load_models({path!r}, {device!r}, attns); ids = b.long_ids(next(iter(m.values())), {P});"
            f"b.run_variant(m, v, 2, ids, {{}});"
            f"print(*b.measure_peak(m, v, {n}, ids))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})})
    peak, extra = map(float, out.stdout.strip().splitlines()[-1].split())
    return peak, extra


CHAT = [{"role": "user", "content": "Explain in a few sentences why the sky is blue and why sunsets are red."}]


def chat_ids(model: ModelHandle) -> list[int]:
    """The SmolLM2 chat case's prompt: one user turn through the chat template (47 tokens)."""
    from trajscope.chat import encode_prompt

    return encode_prompt(model, CHAT)[0]


def long_ids(model, P: int) -> list[int]:
    """P token ids of real text (the standard library's source, repeated as needed); ``model`` is a
    trajscope handle or a ``(model, tokenizer)`` baseline entry."""
    import inspect
    import json as _json

    text = inspect.getsource(_json.decoder) + inspect.getsource(_json.encoder)
    ids = model[1](text, add_special_tokens=False)["input_ids"] if isinstance(model, tuple) else model.encode(text)
    while len(ids) < P:
        ids = ids + ids
    return ids[:P]


def report(name: str, n: int, reps: int, res: dict) -> None:
    """Print a case's table; where it ran ``trace(reads)``, first add to each variant its per-round ratio
    to ``trace(reads)`` (``vs_trace_reads_*``: what trajscope adds to its own trace, issue 32's ≤ 1.03×)
    and print capture's."""
    if "trace(reads)" in res:
        for v in res:
            res[v].update({f"vs_trace_reads_{k}": val for k, val in paired(res[v]["times_s"],
                                                                         res["trace(reads)"]["times_s"]).items()})
    print(f"\n{name}, {n} new tokens, median of {reps} interleaved runs")
    cov = next(iter(res.values()))["paired_coverage"]
    print(f"  {'variant':<17}{'tokens/s':>10}{'× generate':>12}   per-round ratio: median [{cov:.0%} interval]")
    for v, r in res.items():
        lo, hi = r["paired_interval"]
        print(f"  {v:<17}{r['tokens_per_s']:>10.1f}{r['ratio']:>12.3f}   {r['paired_ratio']:.3f} [{lo:.3f}, {hi:.3f}]")
    if "trace(reads)" in res and "capture" in res:
        c = res["capture"]
        print(f"  capture / trace(reads) per round: {c['vs_trace_reads_paired_ratio']:.3f} "
              f"[{c['vs_trace_reads_paired_interval'][0]:.3f}, {c['vs_trace_reads_paired_interval'][1]:.3f}] "
              f"({c['vs_trace_reads_paired_coverage']:.0%})")


def smollm2(args, out: dict) -> None:
    """Issue 32's cases on SmolLM2-135M-Instruct: a chat prompt with 64 new tokens, P = 1,024 and 4,096 with
    16 new tokens (generate, trace(reads), capture), and peak memory at P = 8,192 in fresh processes."""
    variants = ("generate", "trace(reads)", "capture")
    models = load_models("smollm2", args.device, ("rows", "sdpa"))
    cases = [("chat", chat_ids(models["rows"]), 64)] * (not args.no_chat) + [(f"P = {P}", long_ids(models["rows"], P), 16)
                                                        for P in args.smollm2_lengths]
    for label, ids, n in cases:
        reps = args.short_reps or args.reps if label == "chat" else args.reps
        load = [os.getloadavg()[0]]
        res = bench(models, ids, n, reps, variants)
        load.append(os.getloadavg()[0])
        key = f"smollm2, {label}"
        out[key] = {"new_tokens": n, "prompt_tokens": len(ids), "reps": reps, "load_average_1min": load, **res}
        report(key, n, reps, res)
        write(out, args)
    del models
    if args.no_memory:
        return
    P = args.memory_length
    runs = {v: [] for v in variants}
    load = [os.getloadavg()[0]]
    for _ in range(args.memory_reps):  # fresh processes, interleaved
        for v in variants:
            runs[v].append(peak_rss("smollm2", v, P, 16, args.device, FIXED_MMAP))
            print(f"  peak RSS at P = {P}, {v}: {runs[v][-1][0]:.0f} MiB", flush=True)
    load.append(os.getloadavg()[0])
    mem = {v: statistics.median(r[0] for r in rs) for v, rs in runs.items()}
    out[f"smollm2, memory at P = {P}"] = {
        "new_tokens": 16, "prompt_tokens": P, "processes_per_variant": args.memory_reps,
        "allocator": "glibc, mmap threshold fixed at 1 MiB (MALLOC_MMAP_THRESHOLD_) in every process",
        "load_average_1min": load,
        **{v: {"peak_rss_mib": mem[v], "memory_ratio": mem[v] / mem["generate"], "peak_rss_runs_mib": runs[v]}
           for v in variants}}
    print(f"  peak RSS at P = {P} (median of {args.memory_reps}): " + ", ".join(
        f"{v} {mem[v]:.0f} MiB ({mem[v] / mem['generate']:.2f}×)" for v in variants))
    write(out, args)


def write(out: dict, args) -> None:
    RESULTS.mkdir(exist_ok=True)
    suffix = ("" if args.device == "cpu" else "_" + args.device.replace(":", "")) + (f"_{args.only}" if args.only else "")
    if args.smollm2:
        suffix += "_smollm2" + ("_long" if args.no_chat else "")
    (RESULTS / f"capture_overhead{suffix}.json").write_text(json.dumps(out, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--short-reps", type=int, default=None,
                    help="rounds for the two short-context cases (default: --reps); more rounds narrow their intervals")
    ap.add_argument("--quick", action="store_true", help="fewer tokens, P = 512 only (smoke run)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", choices=("short", "long"), default=None,
                    help="run only the short- or long-context cases (written to capture_overhead_<only>.json)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    ap.add_argument("--memory-reps", type=int, default=5, help="fresh processes per variant for peak memory (median)")
    ap.add_argument("--smollm2", action="store_true",
                    help="issue 32's SmolLM2 cases instead (capture_overhead_smollm2.json)")
    ap.add_argument("--smollm2-lengths", type=int, nargs="*", default=[1024, 4096], help="long prompts (SmolLM2)")
    ap.add_argument("--no-chat", action="store_true",
                    help="SmolLM2: the long prompts only (written to capture_overhead_smollm2_long.json)")
    ap.add_argument("--memory-length", type=int, default=8176,
                    help="prompt length of the SmolLM2 memory case (8,176 + 16 new tokens fill its 8,192 positions)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time each run by the wall clock (default) or by this process's CPU time "
                         "(time.process_time: on a machine shared with other jobs, time spent waiting for the "
                         "core is left out; with --threads 1 it is the run's own computation)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads in this process and the memory processes (default: torch's)")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the fresh memory processes
    torch.set_grad_enabled(False)
    dev = args.device
    name = torch.cuda.get_device_name(0) if dev.startswith("cuda") else f"{platform.machine()}, {os.cpu_count()} CPUs"
    out: dict = {"machine": f"{name}, torch {torch.__version__}, {torch.get_num_threads()} threads",
                 "device": dev, "date": time.strftime("%Y-%m-%d %H:%M"),
                 "clock": "process CPU time" if args.clock == "cpu" else "wall clock"}
    if args.smollm2:
        out["machine"] += "; shared with other work (load averages per case)"
        smollm2(args, out)
        return
    short = ("generate", "generate(eager)", "trace(empty)", "trace(reads)", "capture", "capture(eager)", "capture+resid", "capture+probe", "capture+sae")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        cases = [("sample (5.7M)", "sample", 32 if args.quick else 128),
                 ("gpt2-small random (124M)", str(gpt2_small_dir(tmp)), 16 if args.quick else 64)]
        for label, path, n in cases if args.only != "long" else []:
            models = load_models(path, dev)
            ids = models["rows"].encode(PROMPT)
            reps = args.short_reps or args.reps
            res = bench(models, ids, n, reps, short)
            out[label] = {"new_tokens": n, "prompt_tokens": len(ids), "reps": reps, **res}
            report(label, n, reps, res)
            del models
        long_path = str(gpt2_small_dir(tmp, 2112))
        models = load_models(long_path, dev) if args.only != "short" else {}
        lengths = ((512,) if args.quick else LONG) if args.only != "short" else ()
        for P in lengths:
            memory = not args.no_memory and P == max(lengths)  # the target is at the longest prompt
            ids = long_ids(models["rows"], P)
            variants = ("generate", "generate(eager)", "trace(empty)", "trace(reads)", "capture", "capture(eager)")
            res = bench(models, ids, 16, args.reps, variants)
            label = f"gpt2-small random (124M), P = {P}"
            if memory:
                for prefix, env in (("", None), ("fixed_mmap_", FIXED_MMAP)):
                    runs = {v: [] for v in variants}
                    for _ in range(args.memory_reps):  # fresh processes, interleaved
                        for v in variants:
                            runs[v].append(peak_rss(long_path, v, P, 16, dev, env))
                    mem = {v: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
                           for v, rs in runs.items()}
                    for v in variants:
                        res[v].update({f"{prefix}peak_rss_mib": mem[v][0], f"{prefix}run_extra_mib": mem[v][1],
                                       f"{prefix}peak_rss_runs_mib": runs[v],
                                       f"{prefix}memory_ratio": mem[v][0] / mem["generate"][0],
                                       f"{prefix}run_extra_ratio": mem[v][1] / max(mem["generate"][1], 1e-9)})
            out[label] = {"new_tokens": 16, "prompt_tokens": P, "reps": args.reps, **res}
            report(label, 16, args.reps, res)
            if memory:
                for prefix, what in (("", "glibc defaults"), ("fixed_mmap_", "mmap threshold fixed at 1 MiB")):
                    print(f"  peak RSS during the run, {what}, MiB (× generate; the run's own growth in MiB): " + ", ".join(
                        f"{v} {res[v][prefix + 'peak_rss_mib']:.0f} ({res[v][prefix + 'memory_ratio']:.2f}×; "
                        f"+{res[v][prefix + 'run_extra_mib']:.0f})" for v in variants))
    RESULTS.mkdir(exist_ok=True)
    suffix = ("" if dev == "cpu" else "_" + dev.replace(":", "")) + (f"_{args.only}" if args.only else "")
    (RESULTS / f"capture_overhead{suffix}.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwritten to {RESULTS / f'capture_overhead{suffix}.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
