"""ModelHandle: the one place where trajscope opens a model through nnsight.

A :class:`ModelHandle` wraps an ``nnsight.TransformersModel`` loaded with eager
attention (attention probabilities are only materialised by the eager kernel)
and knows, per architecture *family*, where the transformer blocks, their
attention modules, the final norm and the unembedding live. Everything
downstream of :mod:`trajscope.capture` sees plain tensors and Polars frames.

Sources that :func:`load_model` accepts:

- ``"sample"``: the model trajscope ships in ``sample_data/models/trajscope-tiny``;
- a local directory holding ``config.json`` and weights;
- a Hugging Face name already in the local cache (loaded offline, never downloaded);
- any NDIF-hosted name with ``remote=True`` (needs ``NDIF_API_KEY``), or
  ``remote="local"`` to run nnsight's remote serialisation path in-process.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import threading
from typing import Any

import torch

from trajscope.errors import TrajscopeError

SAMPLE_MODEL = "sample"


def sample_data_dir() -> pathlib.Path:
    """The ``sample_data/`` folder (``$TRAJSCOPE_SAMPLE_DATA`` overrides the repository copy)."""
    env = os.environ.get("TRAJSCOPE_SAMPLE_DATA")
    return pathlib.Path(env) if env else pathlib.Path(__file__).resolve().parents[1] / "sample_data"


@dataclasses.dataclass(frozen=True)
class Family:
    """Where one architecture family keeps its parts (attribute paths from the top module)."""

    name: str
    blocks: str  # ModuleList of transformer blocks
    attn: str  # attention module, relative to a block
    final_norm: str
    unembed: str
    n_layers: str  # config attribute names
    n_heads: str
    context: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


_LLAMA = Family("llama", "model.layers", "self_attn", "model.norm", "lm_head",
                "num_hidden_layers", "num_attention_heads", "max_position_embeddings")
FAMILIES: dict[str, Family] = {
    "gpt2": Family("gpt2", "transformer.h", "attn", "transformer.ln_f", "lm_head",
                   "n_layer", "n_head", "n_positions"),
    "gpt_neox": Family("gpt_neox", "gpt_neox.layers", "attention", "gpt_neox.final_layer_norm",
                       "lm_head", "num_hidden_layers", "num_attention_heads", "max_position_embeddings"),
    **{t: dataclasses.replace(_LLAMA, name=t) for t in
       ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo", "olmo2")},
}


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


class ModelHandle:
    """An opened model: the nnsight wrapper plus what capture needs to know about it.

    Attributes:
        model_id: what was asked for (``"sample"``, a path or a hub name).
        family: the :class:`Family` of the architecture.
        remote: ``False``, ``True`` (NDIF) or ``"local"`` (in-process remote round trip).
        n_layers, n_heads, d_model, vocab_size, context_len: from the config.
        lock: held by :func:`trajscope.capture` while a generation runs, so one
            handle can be shared by several app sessions.
    """

    def __init__(self, nn_model: Any, model_id: str, family: Family, *, remote: bool | str = False,
                 source_path: str | None = None, api_key: str | None = None):
        self.nn = nn_model
        self._api_key = api_key  # NDIF key: used per request, never described, saved or printed
        self.model_id = model_id
        self.family = family
        self.remote = remote
        self.source_path = source_path
        cfg = nn_model.config
        self.config = cfg
        self.n_layers = int(getattr(cfg, family.n_layers))
        self.n_heads = int(getattr(cfg, family.n_heads))
        self.d_model = int(cfg.hidden_size)
        self.vocab_size = int(cfg.vocab_size)
        self.context_len = int(getattr(cfg, family.context, 0) or 0)
        self.tokenizer = nn_model.tokenizer
        self.lock = threading.Lock()

    # -- module access (nnsight envoys) ------------------------------------------------
    def blocks(self) -> Any:
        """Envoy list of the transformer blocks; ``blocks()[l].output`` is the residual after block l."""
        return _get(self.nn, self.family.blocks)

    def attn(self, layer: int) -> Any:
        """Envoy of block ``layer``'s attention; ``.output[1]`` is ``[batch, heads, q, k]`` (eager)."""
        return _get(self.blocks()[layer], self.family.attn)

    def unembed(self) -> Any:
        """Envoy of the unembedding; its output is the logits ``[batch, q, vocab]``."""
        return _get(self.nn, self.family.unembed)

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
        """The underlying Hugging Face module (for reference computations in tests)."""
        return self.nn._module

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
            "device": self.device, "attn_implementation": "eager",
            "remote": self.remote if isinstance(self.remote, str) else bool(self.remote),
        }

    def __repr__(self) -> str:
        return (f"ModelHandle({self.model_id!r}, family={self.family.name}, layers={self.n_layers}, "
                f"heads={self.n_heads}, d_model={self.d_model}, device={self.device})")


def family_for(config: Any) -> Family:
    """Pick the :class:`Family` for a Hugging Face config (by ``model_type``)."""
    model_type = getattr(config, "model_type", None)
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    known = ", ".join(sorted(FAMILIES))
    raise TrajscopeError(f"Unsupported architecture '{model_type}': trajscope knows the families {known}.")


def _resolve_local(source: str) -> pathlib.Path | None:
    """A local directory for ``source``, or None when it names something else."""
    if source == SAMPLE_MODEL:
        path = sample_data_dir() / "models" / "trajscope-tiny"
        if not (path / "config.json").exists():
            raise TrajscopeError(f"The sample model is missing from {path}; run scripts/train_sample_model.py.")
        return path
    path = pathlib.Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise TrajscopeError(f"'{source}' is a directory but holds no config.json, so it is not a model directory.")
        return path
    if path.suffix in {".json", ".safetensors", ".bin"} or source.startswith((".", "/", "~")):
        raise TrajscopeError(f"No model directory at '{source}'.")
    return None


def _cached_snapshot(name: str) -> pathlib.Path | None:
    """The local Hugging Face cache snapshot of ``name``, without touching the network."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return None
    try:
        hit = try_to_load_from_cache(name, "config.json")
    except Exception:  # an invalid repo id raises; it is then simply not cached
        return None
    return pathlib.Path(hit).parent if isinstance(hit, str) else None


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(source: str = SAMPLE_MODEL, *, remote: bool | str = False, device: str | None = None,
               dtype: str | torch.dtype | None = None, api_key: str | None = None) -> ModelHandle:
    """Open a causal LM for capture.

    Args:
        source: ``"sample"``, a local model directory, a Hugging Face name in the local
            cache, or (with ``remote=True``) a model that NDIF hosts.
        remote: ``True`` runs on NDIF (needs ``NDIF_API_KEY``); ``"local"`` loads the
            weights here but sends every capture through nnsight's remote
            serialisation round trip (used to test the NDIF path offline).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``…; default CUDA when present.
        dtype: ``"float32"`` (default on CPU), ``"bfloat16"`` (default on CUDA), ``"float16"``.
        api_key: NDIF key for ``remote=True`` (default: ``$NDIF_API_KEY``); kept on the handle
            and sent with each request only, never written to a run, an export or a log.

    Returns:
        A :class:`ModelHandle`.

    Raises:
        TrajscopeError: one sentence saying what is wrong (unknown name, directory
            without a model, remote without a key, unsupported architecture).
    """
    from nnsight import TransformersModel

    if not isinstance(source, str) or not source.strip():
        raise TrajscopeError("A model source is needed: 'sample', a model directory, a cached Hugging Face name, or an NDIF model.")
    source = source.strip()
    if remote is True:
        key = api_key or os.environ.get("NDIF_API_KEY")
        if not key:
            raise TrajscopeError("Remote (NDIF) models need an API key: pass api_key= or set NDIF_API_KEY (get one at ndif.us).")
        nn_model = TransformersModel(source, task="text-generation", attn_implementation="eager")
        return ModelHandle(nn_model, source, family_for(nn_model.config), remote=True, api_key=key)

    path = _resolve_local(source)
    if path is None:
        path = _cached_snapshot(source)
        if path is None:
            raise TrajscopeError(
                f"Unknown model '{source}': it is not 'sample', not a local directory, and not in the local "
                "Hugging Face cache (trajscope never downloads). Download it on a machine with internet, "
                "or use remote=True for an NDIF-hosted model.")
    device = device or _default_device()
    if dtype is None:
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
    elif isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise TrajscopeError(f"Unknown dtype '{dtype}': use float32, bfloat16 or float16.")
        dtype = getattr(torch, dtype)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as exc:
        raise TrajscopeError(f"Cannot read the model config in '{path}': {exc}") from None
    family = family_for(config)
    try:
        nn_model = TransformersModel(str(path), task="text-generation", attn_implementation="eager",
                                     dispatch=True, dtype=dtype)
        nn_model._module.to(device)
    except Exception as exc:
        raise TrajscopeError(f"Cannot load the model in '{path}': {str(exc).splitlines()[0]}") from None
    nn_model._module.eval()
    tok = nn_model.tokenizer
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    return ModelHandle(nn_model, source, family, remote=remote, source_path=str(path))
