"""The vLLM side: a ``vllm.general_plugins`` entry point that puts :class:`~trajscope.vllm.monitor.Monitor` in the worker.

``pip install`` of trajscope registers :func:`register` under vLLM's ``vllm.general_plugins``
group (``pyproject.toml``); vLLM calls it in every process it starts, the model worker
included. It wraps three methods of vLLM's V1 model runner (``GPUModelRunner``, which the
CPU runner subclasses), once per process:

- ``_model_forward`` (vLLM's documented override point for model execution): before the
  forward, new requests whose ``SamplingParams.extra_args`` carry trajscope keys are
  planned (:func:`trajscope.vllm.request.plan_request`), and the batch is mapped with the
  runner's per-batch metadata (``input_batch.req_ids``, ``query_start_loc``, the positions);
  forward hooks on the decoder layers record and steer (:meth:`Monitor.on_layer`);
- ``model.compute_logits``: the next-token distribution of each tracked request;
- ``_update_states``: a request that the scheduler reports finished is handed to a writer
  thread, which saves it as a run directory under ``$TRAJSCOPE_VLLM_OUT`` (default
  ``runs/vllm``; written atomically, so a reader never sees half a run) and adds it to the
  Prometheus series of :mod:`trajscope.vllm.metrics`. So is a request whose output reached
  ``max_tokens`` or a stop token, right after the step that sampled it (:meth:`sample_tokens`),
  so the last request of a batch is written without waiting for the next one. The engine's step
  never waits for Parquet: building and saving a run (about 13 ms for a 70-position SmolLM2
  request on one core) runs beside the next forwards. :func:`flush` waits until every finished
  request is on disk and counted.

A request without trajscope keys costs one dictionary lookup per forward; the layer hooks
return at once when no tracked request is in the batch. ``TRAJSCOPE_VLLM=0`` turns the plugin
off, as does :func:`set_enabled`. A request the worker cannot plan (the admission check of
:mod:`trajscope.vllm.admission` was not installed) is served plainly, with one warning.
Supported: vLLM's V1 model runner (the default on CPU), decoder models whose layers live at
``model.model.layers`` and return ``(hidden, residual)`` (Llama, Mistral, Qwen2 families),
no speculative decoding, no pipeline parallelism.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import pathlib
from typing import Any

from trajscope.errors import TrajscopeError

log = logging.getLogger("trajscope.vllm")
ENV_OUT = "TRAJSCOPE_VLLM_OUT"
ENV_ENABLE = "TRAJSCOPE_VLLM"
_STATE: dict[str, Any] = {"patched": False, "enabled": True, "workers": []}
_PENDING: set[concurrent.futures.Future] = set()  # run directories handed to a writer thread, not yet on disk


def flush(timeout: float | None = None) -> bool:
    """Wait until every finished request handed to a writer thread in this process is saved; True when
    none is left pending (False after ``timeout`` seconds)."""
    return not concurrent.futures.wait(list(_PENDING), timeout=timeout).not_done


def set_enabled(enabled: bool) -> None:
    """Turn trajscope on or off in this process's workers: off removes the layer hooks and the logits wrapper,
    so the runner does exactly what plain vLLM does plus one flag check per forward (the overhead
    benchmark's plain arm; with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` the worker is in this process)."""
    _STATE["enabled"] = bool(enabled)
    for ts in _STATE["workers"]:
        ts.attach() if enabled else ts.detach()


def register() -> None:
    """The ``vllm.general_plugins`` entry point: patch vLLM's model runner (once per process)."""
    if os.environ.get(ENV_ENABLE, "1") == "0" or _STATE["patched"]:
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    forward, update, sample = GPUModelRunner._model_forward, GPUModelRunner._update_states, GPUModelRunner.sample_tokens

    def _model_forward(self, input_ids=None, positions=None, *args, **kwargs):
        ts = _worker(self) if _STATE["enabled"] else None  # disabled: plain vLLM
        if ts is not None and positions is not None:
            try:
                ts.begin_forward(self, input_ids, positions)
            except Exception as exc:  # trajscope must never take the engine down: this forward runs plain
                log.warning("trajscope skipped a forward: %s: %s", type(exc).__name__, exc)
                ts.monitor.end()
        return forward(self, input_ids, positions, *args, **kwargs)

    def _update_states(self, scheduler_output):
        ts = getattr(self, "_trajscope", None)
        if ts is not None:
            ts.monitor.end()
            for rid in scheduler_output.finished_req_ids:
                ts.finish(self, rid, "finished")
                ts.seen.pop(rid, None)
        return update(self, scheduler_output)

    def sample_tokens(self, *args, **kwargs):
        out = sample(self, *args, **kwargs)
        ts = getattr(self, "_trajscope", None)
        if ts is not None and ts.monitor.tracked:
            ts.monitor.end()
            try:
                ts.finish_done(self)
            except Exception as exc:
                log.warning("trajscope could not check finished requests: %s: %s", type(exc).__name__, exc)
        return out

    GPUModelRunner._model_forward = _model_forward
    GPUModelRunner._update_states = _update_states
    GPUModelRunner.sample_tokens = sample_tokens
    _STATE["patched"] = True


def _worker(runner: Any) -> "WorkerState | None":
    ts = getattr(runner, "_trajscope", None)
    if ts is None:
        try:
            ts = runner._trajscope = WorkerState(runner)
        except TrajscopeError as exc:
            log.warning("trajscope is off in this worker: %s", exc)
            runner._trajscope = None
            set_enabled(False)
            return None
    return ts


class WorkerState:
    """The monitor of one model runner, its layer hooks and the requests it has seen."""

    def __init__(self, runner: Any):
        from trajscope.vllm.catalogue import Catalogue
        from trajscope.vllm.monitor import Monitor

        model = runner.model
        layers = getattr(getattr(model, "model", None), "layers", None)
        if layers is None:
            raise TrajscopeError(f"{type(model).__name__} has no model.layers; trajscope reads decoder layers there.")
        hf = runner.model_config.hf_config
        self.n_layers, self.d_model = int(hf.num_hidden_layers), int(hf.hidden_size)
        self.monitor = Monitor(Catalogue.from_env(), self.n_layers, self.d_model)
        self.out_dir = pathlib.Path(os.environ.get(ENV_OUT) or "runs/vllm")
        self.seen: dict[str, bool] = {}
        self.model_info = {"model_id": str(runner.model_config.model), "family": type(model).__name__,
                           "revision": None, "n_layers": self.n_layers, "d_model": self.d_model,
                           "n_heads": int(hf.num_attention_heads), "vocab_size": int(hf.vocab_size),
                           "context_len": int(runner.model_config.max_model_len),
                           "dtype": str(runner.model_config.dtype).replace("torch.", ""),
                           "device": str(runner.device), "attn_implementation": "vllm", "remote": False}
        import vllm

        self.engine = {"engine": f"vllm {vllm.__version__}",
                       "prefix_caching": bool(runner.cache_config.enable_prefix_caching),
                       "chunked_prefill": bool(runner.scheduler_config.enable_chunked_prefill)}
        self._tokenizer = None
        self._writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="trajscope-writer")
        self._metrics = None
        self.model, self.layers, self.handles = model, layers, []
        self.attach()
        _STATE["workers"].append(self)

    def attach(self) -> None:
        """Register the layer hooks and wrap ``compute_logits`` (idempotent)."""
        if self.handles:
            return
        self.handles = [layer.register_forward_hook(self._hook(i)) for i, layer in enumerate(self.layers)]
        compute = type(self.model).compute_logits.__get__(self.model)

        def compute_logits(*args, **kwargs):
            logits = compute(*args, **kwargs)
            if self.monitor.view is not None and logits is not None and logits.shape[0] == self.monitor.view_reqs:
                self.monitor.on_logits(logits)
            return logits

        self.model.compute_logits = compute_logits

    def detach(self) -> None:
        """Remove the hooks and the ``compute_logits`` wrapper."""
        for h in self.handles:
            h.remove()
        self.handles = []
        self.model.__dict__.pop("compute_logits", None)
        self.monitor.end()

    def _hook(self, i: int):
        monitor = self.monitor

        def hook(module, args, out):
            if monitor.view is None or not isinstance(out, tuple):
                return None
            try:
                new = monitor.on_layer(i, out[0], out[1])
            except Exception as exc:  # never take the engine down: the rest of this forward runs plain
                log.warning("trajscope stopped recording a forward at layer %d: %s: %s", i, type(exc).__name__, exc)
                monitor.end()
                return None
            return None if new is None else (new, *out[1:])
        return hook

    def begin_forward(self, runner: Any, input_ids: Any, positions: Any) -> None:
        """Plan the batch's new requests and map its tokens (:meth:`Monitor.begin`)."""
        batch = runner.input_batch
        n = batch.num_reqs
        req_ids = batch.req_ids[:n]
        for rid in req_ids:
            if rid not in self.seen:
                self.seen[rid] = self._plan(runner, rid)
        self.monitor.view_reqs = n
        if not any(self.seen.get(r) for r in req_ids):
            self.monitor.view = None
            return
        self.monitor.begin(req_ids, runner.query_start_loc.np[:n + 1], positions.cpu(),
                           None if input_ids is None else input_ids.cpu())

    def _plan(self, runner: Any, rid: str) -> bool:
        from trajscope.vllm.request import plan_request, wants_trajscope

        state = runner.requests.get(rid)
        sp = getattr(state, "sampling_params", None)
        args = getattr(sp, "extra_args", None)
        if not wants_trajscope(args):
            return False
        try:
            plan = plan_request(args, self.monitor.catalogue, self.n_layers, self.d_model, sp.max_tokens)
        except TrajscopeError as exc:
            log.warning("trajscope skips request %s: %s", rid, exc)
            return False
        sampling = {"temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k, "seed": sp.seed,
                    "max_new_tokens": sp.max_tokens}
        self.monitor.track(rid, plan, list(state.prompt_token_ids), sampling)
        return True

    def finish_done(self, runner: Any) -> None:
        """Write every tracked request whose output reached ``max_tokens`` or a stop token."""
        for rid in list(self.monitor.tracked):
            state = runner.requests.get(rid)
            if state is None:
                continue
            out = list(state.output_token_ids)
            sp = state.sampling_params
            if not out or out[-1] < 0:
                continue
            if len(out) >= (sp.max_tokens or 1 << 30):
                self.finish(runner, rid, "max_new_tokens")
            elif not sp.ignore_eos and out[-1] in (sp.all_stop_token_ids or ()):
                self.finish(runner, rid, "eos")

    def finish(self, runner: Any, rid: str, reason: str) -> None:
        """Write the run of request ``rid`` (a no-op for requests not tracked or already written)."""
        self.seen[rid] = False
        t = self.monitor.pop(rid)
        if t is None:
            return
        from trajscope.vllm import runs

        state = runner.requests.get(rid)
        out = [int(i) for i in (state.output_token_ids if state is not None else []) if int(i) >= 0]
        try:
            thr = self.monitor.threshold(t.plan.profile, t.plan.layer) if t.plan.profile else None
            tok = self.tokenizer(runner)
        except Exception as exc:  # a run that cannot be written must not take the server down
            log.warning("trajscope could not write the run of request %s: %s", rid, exc)
            return

        def write() -> None:  # on the writer thread: `t` left the monitor, so nothing else touches it
            try:
                traj = runs.trajectory(t, out, tok, self.model_info, reason, thr, self.engine)
                runs.save(traj, self.out_dir)
            except Exception as exc:
                log.warning("trajscope could not write the run of request %s: %s", rid, exc)
                return
            try:
                width = int(self.monitor.catalogue.sae(t.plan.sae).cfg.d_sae) if t.plan.sae else None
                self.metrics().observe(traj, width)
            except Exception as exc:
                log.warning("trajscope could not update its metrics for request %s: %s", rid, exc)

        fut = self._writer.submit(write)
        _PENDING.add(fut)
        fut.add_done_callback(_PENDING.discard)

    def metrics(self) -> Any:
        """The worker's :class:`trajscope.vllm.metrics.RunMetrics` (created at the first written run)."""
        if self._metrics is None:
            from trajscope.vllm.metrics import RunMetrics

            self._metrics = RunMetrics()
        return self._metrics

    def tokenizer(self, runner: Any) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            mc = runner.model_config
            self._tokenizer = AutoTokenizer.from_pretrained(mc.tokenizer, revision=mc.tokenizer_revision)
        return self._tokenizer
