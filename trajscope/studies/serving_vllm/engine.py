"""One vLLM engine of the serving-vllm study, run in a process of its own.

``python -m trajscope.studies.serving_vllm.engine SPEC.json`` starts ``vllm.LLM`` on the model
directory with the spec's engine settings (float32, eager, in this process:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and the trajscope plugin (:mod:`trajscope.vllm.plugin`),
then runs the spec's calls in order. A call is one ``LLM.generate`` of one or more requests,
greedy, ``ignore_eos``: vLLM's scheduler co-schedules the requests of a call (continuous
batching). A request with a ``run_id`` asks the plugin to keep the monitored layer's residual
rows; it is written as a trajscope run under the spec's ``out`` directory. A request with a
``salt`` gets vLLM's ``cache_salt``: requests of different salts never share prefix-cache blocks.

It writes ``engine.json`` into ``out``: per run id the generated token ids and vLLM's own
``num_cached_tokens`` (the prompt tokens served from the prefix cache), and the engine's start
and run times. Progress goes to stdout as ``PROGRESS done total`` lines. Each engine gets its own
process because one process cannot start a second vLLM engine after the first.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time


def main(spec_path: str) -> None:
    spec = json.loads(pathlib.Path(spec_path).read_text())
    out = pathlib.Path(spec["out"])
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", TRAJSCOPE_VLLM_OUT=str(out))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from trajscope.vllm.plugin import register

    register()  # idempotent: vLLM also loads it from the entry point
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(model=spec["model"], dtype="float32", enforce_eager=True, seed=0, **spec["engine"])
    started = time.perf_counter() - t0
    runs: dict[str, dict] = {}
    calls = spec["calls"]
    for n, call in enumerate(calls):
        prompts = [TokensPrompt(prompt_token_ids=r["ids"], **({"cache_salt": r["salt"]} if r.get("salt") else {}))
                   for r in call]
        params = [SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True,
                                 extra_args={"trajscope_run_id": r["run_id"], "trajscope_layer": spec["layer"],
                                             "trajscope_residuals": 1} if r.get("run_id") else None) for r in call]
        for r, o in zip(call, llm.generate(prompts, params, use_tqdm=False)):
            if r.get("run_id"):
                runs[r["run_id"]] = {"output_ids": [int(i) for i in o.outputs[0].token_ids],
                                     "num_cached_tokens": int(o.num_cached_tokens or 0)}
        print(f"PROGRESS {n + 1} {len(calls)}", flush=True)
    import vllm

    (out / "engine.json").write_text(json.dumps({"runs": runs, "start_seconds": started, "engine": spec["engine"],
                                                 "run_seconds": time.perf_counter() - t0 - started,
                                                 "vllm": vllm.__version__}))


if __name__ == "__main__":
    main(sys.argv[1])
