"""ModelHandle: an opened model and the operations that run it.

A :class:`ModelHandle` wraps an ``nnsight.TransformersModel`` loaded with eager
attention (attention probabilities are only materialised by the eager kernel)
and its :class:`~trajscope.model.families.Family`. It is the one object that
runs the model: every operation below takes the handle's lock (re-entrant, so
one operation may call another), so one handle can be shared by several app
sessions and worker threads. The forwards themselves live in
:mod:`trajscope.model.forward` and the generation trace in
:mod:`trajscope.model.generation`; this class is their public face.
"""

from __future__ import annotations

import contextlib
import functools
import pathlib
import threading
from typing import Any, Callable, Iterator, Sequence

import torch

from trajscope.errors import TrajscopeError
from trajscope.model import batch as bt
from trajscope.model import evicted
from trajscope.model import forward as fw
from trajscope.model.attention import collect_rows, prefill_rows
from trajscope.model.families import Family, get_path
from trajscope.model.generation import run_generation
from trajscope.model.forward import ForwardResult


class ModelHandle:
    """An opened model: the nnsight wrapper plus what trajscope needs to know about it.

    Attributes:
        model_id: what was asked for (``"sample"``, a path or a hub name).
        family: the :class:`~trajscope.model.families.Family` of the architecture.
        remote: ``False``, ``True`` (NDIF) or ``"local"`` (in-process remote round trip).
        attn_impl: ``"rows"`` (SDPA + attention rows from q and K), ``"eager"`` or ``"sdpa"`` (no rows).
        n_layers, n_heads, d_model, vocab_size, context_len: from the config.
        tokenizer: the Hugging Face tokenizer.
        lock: re-entrant; held by every operation, so sessions sharing a handle take turns.
    """

    def __init__(self, nn_model: Any, model_id: str, family: Family, *, remote: bool | str = False,
                 source_path: str | None = None, api_key: str | None = None, attn: str = "eager"):
        self.nn = nn_model  # the nnsight wrapper: for this package and for tests only
        self._api_key = api_key  # NDIF key: used per request, never described, saved or printed
        self.model_id = model_id
        self.family = family
        self.remote = remote
        self.source_path = source_path
        self.attn_impl = attn  # "rows", "eager" or "sdpa" (see load_model)
        cfg = nn_model.config
        self.config = cfg
        self.n_layers = int(getattr(cfg, family.n_layers))
        self.n_heads = int(getattr(cfg, family.n_heads))
        self.d_model = int(cfg.hidden_size)
        self.vocab_size = int(cfg.vocab_size)
        self.context_len = int(getattr(cfg, family.context, 0) or 0)
        self.tokenizer = nn_model.tokenizer
        self.lock = threading.RLock()

    # -- nnsight envoys (used by this package's traces and by tests) ------------------------
    def blocks(self) -> Any:
        """Envoy list of the transformer blocks; ``blocks()[l].output`` is the residual after block l."""
        return get_path(self.nn, self.family.blocks)

    def attn(self, layer: int) -> Any:
        """Envoy of block ``layer``'s attention; ``.output[1]`` is ``[batch, heads, q, k]`` (eager)."""
        return get_path(self.blocks()[layer], self.family.attn)

    def unembed(self) -> Any:
        """Envoy of the unembedding; its output is the logits ``[batch, q, vocab]``."""
        return get_path(self.nn, self.family.unembed)

    def remote_options(self) -> dict[str, Any]:
        """Keyword arguments that send an nnsight trace or generation where this model runs.

        Local models: ``{}``; ``remote="local"``: nnsight's in-process round trip; NDIF: a
        backend carrying this handle's API key for this request only (nnsight's process-wide
        ``CONFIG`` is left alone, so sessions with different keys do not see each other's).
        """
        if self.remote is True:
            from nnsight.intervention.backends.remote import RemoteBackend

            return {"backend": RemoteBackend(self.nn.to_model_key(), api_key=self._api_key)}
        return {"remote": self.remote} if self.remote else {}

    def torch_module(self) -> torch.nn.Module:
        """The underlying Hugging Face module: for reference computations in tests only."""
        return self.nn._module

    def _local(self, what: str) -> torch.nn.Module:
        if self.remote is True:
            raise TrajscopeError(f"{what} runs on a local model only; this model runs on NDIF.")
        return self.nn._module

    # -- facts --------------------------------------------------------------------------------
    @property
    def device(self) -> str:
        if self.remote is True:
            return "remote"
        return str(next(self.torch_module().parameters()).device)

    @property
    def dtype(self) -> str:
        if self.remote is True:
            return str(getattr(self.config, "dtype", "unknown")).replace("torch.", "")
        return str(next(self.torch_module().parameters()).dtype).replace("torch.", "")

    @property
    def eos_token_id(self) -> int | None:
        eos = self.config.eos_token_id if self.tokenizer.eos_token_id is None else self.tokenizer.eos_token_id
        return eos[0] if isinstance(eos, list) else eos

    @property
    def sliding_window(self) -> int | None:
        """The sliding attention window in tokens, or None when no layer uses one (right-padded batches
        cannot decode exactly inside one: :func:`trajscope.model.batch.greedy_batch`)."""
        return bt.sliding_window(self.config)

    @functools.cached_property
    def _revision(self) -> str | None:
        if not self.source_path:
            return None
        import hashlib

        h = hashlib.sha256()
        for f in sorted(pathlib.Path(self.source_path).glob("*.safetensors")):
            h.update(f.name.encode())
            h.update(str(f.stat().st_size).encode())
            with open(f, "rb") as fh:
                h.update(fh.read(1 << 20))
        return h.hexdigest()[:16]

    def revision(self) -> str | None:
        """A hash of the weight files (names, sizes, first MiB), computed once; ``None`` when remote."""
        return self._revision

    def describe(self) -> dict[str, Any]:
        """What a run's ``meta.json`` records about the model."""
        return {
            "model_id": self.model_id, "family": self.family.name, "revision": self.revision(),
            "n_layers": self.n_layers, "n_heads": self.n_heads, "d_model": self.d_model,
            "vocab_size": self.vocab_size, "context_len": self.context_len, "dtype": self.dtype,
            "device": self.device, "attn_implementation": self.attn_impl,
            "remote": self.remote if isinstance(self.remote, str) else bool(self.remote),
        }

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a prompt (a string, or ids passed through unchanged).

        Raises:
            TrajscopeError: for an empty prompt.
        """
        if isinstance(prompt, str):
            if not prompt.strip():
                raise TrajscopeError("The prompt is empty; type some text to continue.")
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        else:
            ids = [int(i) for i in prompt]
        if not ids:
            raise TrajscopeError("The prompt is empty; type some text to continue.")
        return ids

    def check_fits(self, n_prompt: int, max_new_tokens: int) -> None:
        """Raise :class:`TrajscopeError` when a prompt plus new tokens exceed the context window."""
        C = self.context_len
        if C and n_prompt + max_new_tokens > C:
            if n_prompt >= C:
                raise TrajscopeError(f"The prompt has {n_prompt} tokens but the model's context window is {C}.")
            raise TrajscopeError(
                f"The prompt ({n_prompt} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the model's context "
                f"window of {C}; ask for at most {C - n_prompt} new tokens.")

    # -- operations -------------------------------------------------------------------------
    def generation(self, ids: Sequence[int], gen_kwargs: dict, step_fn: Callable, step_opts: tuple,
                   steer: Sequence[Sequence[tuple]], max_new_tokens: int,
                   kernels: Any = None, prefill_rows: int | None = None, layer_fn: Callable | None = None) -> tuple:
        """Run one generation trace; see :func:`trajscope.model.generation.run_generation`.

        ``prefill_rows``: with ``attn="rows"``, the prefill computes the attention rows of the last
        ``prefill_rows`` prompt queries (None: all of them, in chunks); eager computes all rows.
        """
        if self.attn_impl == "sdpa":
            raise TrajscopeError("This model was loaded with attn='sdpa', which exposes no attention rows; "
                                 "load it with attn='rows' (the default) or 'eager' to capture.")
        with self.lock, self._prefill_rows(prefill_rows), self._row_sink() as sink:
            return run_generation(self, ids, gen_kwargs, step_fn, step_opts, steer, max_new_tokens, kernels, layer_fn,
                                  sink)

    def _prefill_rows(self, n: int | None):
        if self.attn_impl != "rows" or self.remote is True:
            return contextlib.nullcontext()
        return prefill_rows(self.nn._module.config, n)

    def _row_sink(self):
        """A local trace on the rows attention takes each layer's rows from a RowSink (attention.collect_rows);
        remote traces are serialised, and eager attention has no rows of its own: they read the module."""
        if self.attn_impl != "rows" or self.remote:
            return contextlib.nullcontext()
        return collect_rows(self.nn._module.config)

    def forward(self, token_ids: Sequence[int], *, prompt_len: int | None = None, steering: Sequence[Any] = (),
                layers: Sequence[int] = (), splice: tuple[int, Callable] | None = None,
                key_mask: torch.Tensor | None = None, mask_from: int | None = None, past: Any = None,
                return_cache: bool = False, attention_rows: int = 0, rows_unmasked: bool = False,
                rows_sum: bool = False) -> ForwardResult:
        """Teacher-forced forward over known tokens; see :func:`trajscope.model.forward.forward`."""
        with self.lock:
            return fw.forward(self, token_ids, prompt_len=prompt_len, steering=steering, layers=layers,
                              splice=splice, key_mask=key_mask, mask_from=mask_from, past=past,
                              return_cache=return_cache, attention_rows=attention_rows, rows_unmasked=rows_unmasked,
                              rows_sum=rows_sum)

    def read_residuals(self, prompts: Sequence[str | Sequence[int]], layer: int, position: int = -1) -> torch.Tensor:
        """Block ``layer``'s output at ``position`` of each prompt: ``[n_prompts, d_model]`` float32."""
        with self.lock:
            return fw.read_residuals(self, prompts, layer, position)

    def generate_ids(self, ids: Sequence[int], *, max_new_tokens: int, temperature: float = 0.0,
                     top_p: float | None = None, seed: int | None = None, stop_at_eos: bool = True) -> list[int]:
        """Plain Hugging Face ``generate`` (KV cache): prompt + continuation ids."""
        with self.lock:
            return fw.generate_ids(self, ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                   seed=seed, stop_at_eos=stop_at_eos)

    def prefill_chunks(self, token_ids: Sequence[int], chunk: int, layers: Sequence[int] = ()) -> ForwardResult:
        """Prefill through the KV cache in chunks of ``chunk`` tokens; see :func:`trajscope.model.forward.prefill_chunks`."""
        with self.lock:
            return fw.prefill_chunks(self, token_ids, chunk, layers)

    def prefix_cache(self, prefix_ids: Sequence[int]) -> Any:
        """The KV cache of a prefix, to pass as ``forward(suffix, past=...)`` (reused, never recomputed)."""
        with self.lock:
            return self.forward(prefix_ids, return_cache=True).cache

    def forward_batch(self, batch: Sequence[Sequence[int]], *, padding_side: str = "right", layers: Sequence[int] = (),
                      attention_rows: Sequence[int] | None = None,
                      logits_rows: Sequence[int] | None = None) -> list[ForwardResult]:
        """One padded batch forward; per-sequence results without padding rows (and, when asked, the attention
        rows and logits of each sequence's last positions only); see :func:`trajscope.model.batch.forward_batch`."""
        with self.lock:
            return bt.forward_batch(self, batch, padding_side=padding_side, layers=layers,
                                    attention_rows=attention_rows, logits_rows=logits_rows)

    def greedy_batch(self, batch: Sequence[Sequence[int]], *, max_new_tokens: int, padding_side: str = "left",
                     stop_at_eos: bool = True, reads: Sequence[tuple[int, int]] | None = None) -> Any:
        """Greedy continuations of a padded batch with the KV cache (prompt + continuation ids per prompt; with
        ``reads``, also what each step computed); see :func:`trajscope.model.batch.greedy_batch`."""
        with self.lock:
            return bt.greedy_batch(self, batch, max_new_tokens=max_new_tokens, padding_side=padding_side,
                                   eos_token_id=self.eos_token_id if stop_at_eos else None, reads=reads)

    @contextlib.contextmanager
    def numerics(self, *, tf32: bool | None = None, deterministic: bool | None = None,
                 threads: int | None = None) -> Iterator[dict]:
        """Hold the lock with torch's TF32 / deterministic / thread settings changed for the body; see
        :func:`trajscope.model.forward.numerics` (the settings are process-wide, restored on exit)."""
        with self.lock, fw.numerics(tf32=tf32, deterministic=deterministic, threads=threads) as settings:
            yield settings

    def check_dtype(self, dtype: str | torch.dtype) -> torch.dtype:
        """``dtype`` as a torch dtype if this model's device can run it; else one clear error."""
        return fw.check_dtype("cpu" if self.remote is True else self.device, dtype)

    def masked_decode(self, prompt_ids: Sequence[int], max_new_tokens: int, key_mask: torch.Tensor,
                      mask_from: int | None = None) -> list[int]:
        """Greedy decode with the KV cache while queries from ``mask_from`` (default: the first decode
        query) see only the keys ``key_mask`` keeps; see :func:`trajscope.model.forward.masked_decode`."""
        with self.lock:
            return fw.masked_decode(self, prompt_ids, max_new_tokens, key_mask, mask_from)

    def decode_on_cache(self, prompt_len: int, prefill: ForwardResult, n_new: int, key_mask: torch.Tensor | None,
                        *, rows: bool = False) -> tuple[list[int], torch.Tensor | None]:
        """Greedy decode after a shared prefill with a key mask; see :func:`trajscope.model.evicted.decode_on_cache`."""
        with self.lock:
            return evicted.decode_on_cache(self, prompt_len, prefill, n_new, key_mask, rows=rows)

    def per_step_logits(self, token_ids: Sequence[int], prompt_len: int, key_mask: torch.Tensor) -> torch.Tensor:
        """Each decode query alone on the masked prompt over the full run's history; see
        :func:`trajscope.model.evicted.per_step_logits`."""
        with self.lock:
            return evicted.per_step_logits(self, token_ids, prompt_len, key_mask)

    def __repr__(self) -> str:
        return (f"ModelHandle({self.model_id!r}, family={self.family.name}, layers={self.n_layers}, "
                f"heads={self.n_heads}, d_model={self.d_model}, device={self.device})")
