"""Trajectory: one prompt and its continuation under one configuration, as tables.

A trajectory holds the long-format Polars tables of DESIGN.md and, when asked
for at capture time, tensors:

- ``tokens``: one row per position (prompt and generated). ``logprob`` is
  ``log p(token at pos | tokens before pos)`` (null at pos 0); ``entropy`` and
  ``top_ids`` / ``top_texts`` / ``top_logprobs`` describe the next-token
  distribution computed *at* this position (null for the last token, which no
  step consumed). ``step`` is the forward pass in which the position was a
  query (the query step: 0 for the prompt) and ``produced_at_step`` the pass
  that produced a generated token (null for the prompt); both come from
  :mod:`trajscope.positions`, as does ``segment`` (``system`` / ``user`` /
  ``assistant`` / ``thinking``: the turn a position belongs to; a plain prompt is
  ``user`` and its continuation ``assistant``).
- ``attention``: one row per query position × layer × head (step 0 holds the P
  prompt queries of the prefill pass, step s ≥ 1 the one decode query).
- ``activations``: one row per computed position × layer (block outputs).
- tensors ``residual.{layer}`` ``[n_positions_computed, d_model]`` and
  ``attention.{layer}`` ``[n_heads, n_pos, n_pos]`` (query × key, causal).

A run directory holds ``meta.json``, one Parquet file per table and
``tensors.safetensors``; every write goes to a temporary name first and is
renamed into place, so a directory is either the old run or the new one. Many
run directories under one folder read as one dataset:
``pl.scan_parquet("runs/*/attention.parquet")``.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import platform
import shutil
import tempfile
from typing import Any

import polars as pl
import torch

from trajscope import positions
from trajscope.errors import TrajscopeError

SCHEMA_VERSION = 3  # 2: tokens.produced_at_step; step is always the query step. 3: tokens.segment
READABLE_VERSIONS = (1, 2, 3)  # Trajectory.load upgrades older run directories in memory (upgrade_tokens)
TABLES = ("tokens", "attention", "activations")
OPTIONAL_TABLES = ("features", "probe")  # present when an SAE / a drift probe was attached
TENSOR_FILE = "tensors.safetensors"


def parquet_metadata(table: str) -> dict[str, str]:
    """Key-value metadata stamped into every Parquet file trajscope writes (schema version, table name)."""
    return {"trajscope_schema": str(SCHEMA_VERSION), "trajscope_table": table}


def write_table(df: pl.DataFrame, path: str | os.PathLike, table: str | None = None,
                extra: dict[str, str] | None = None) -> pathlib.Path:
    """Write ``df`` as Parquet with the schema metadata (``table`` defaults to the file's stem) plus ``extra`` keys."""
    path = pathlib.Path(path)
    df.write_parquet(path, metadata={**(extra or {}), **parquet_metadata(table or path.stem)})
    return path


@functools.lru_cache(maxsize=1)
def _versions() -> tuple[tuple[str, str], ...]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("trajscope", "torch", "transformers", "nnsight", "polars"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "unknown"
    return tuple(out.items())


def library_versions() -> dict[str, str]:
    """Versions of the libraries that shape a run's numbers (looked up once per process)."""
    return dict(_versions())


class Trajectory:
    """Tables (and optional tensors) of one captured run.

    Args:
        meta: run settings (``meta.json``); must hold ``run_id`` and ``prompt_len``.
        tokens, attention, activations: the tables described in the module docstring.
        tensors: ``{"residual.{l}": [n, d_model], "attention.{l}": [heads, n, n]}``.
    """

    def __init__(self, meta: dict, tokens: pl.DataFrame, attention: pl.DataFrame,
                 activations: pl.DataFrame, tensors: dict[str, torch.Tensor] | None = None,
                 features: pl.DataFrame | None = None, probe: pl.DataFrame | None = None):
        self.meta = meta
        self.tokens = tokens
        self.attention = attention
        self.activations = activations
        self.features = features
        self.probe = probe
        self.tensors = dict(tensors or {})

    def table_names(self) -> list[str]:
        """The tables this run holds: the three core ones plus any optional ones present."""
        return list(TABLES) + [t for t in OPTIONAL_TABLES if getattr(self, t) is not None]

    # -- basic facts --------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.meta["run_id"]

    @property
    def prompt_len(self) -> int:
        """P, the number of prompt positions."""
        return int(self.meta["prompt_len"])

    @property
    def token_ids(self) -> list[int]:
        """All token ids, prompt then generated."""
        return self.tokens["token_id"].to_list()

    @property
    def n_steps(self) -> int:
        """Captured forward passes: 1 (prefill) + decode steps."""
        return int(self.meta.get("n_steps", 0))

    @property
    def text(self) -> str:
        return "".join(self.tokens["text"].to_list())

    @property
    def generated_text(self) -> str:
        return "".join(self.tokens.filter(pl.col("phase") == "decode")["text"].to_list())

    def residual(self, layer: int) -> torch.Tensor:
        """Block output of ``layer`` at every computed position: ``[n_positions_computed, d_model]``."""
        return self._tensor("residual", layer, "residual_layers")

    def attention_rows(self, layer: int) -> torch.Tensor:
        """Attention probabilities of ``layer``: ``[n_heads, n_pos, n_pos]``, query × key, zero above the diagonal."""
        return self._tensor("attention", layer, "attention_layers")

    def _tensor(self, kind: str, layer: int, arg: str) -> torch.Tensor:
        key = f"{kind}.{layer}"
        if key not in self.tensors:
            kept = sorted(int(k.split(".")[1]) for k in self.tensors if k.startswith(kind + "."))
            raise TrajscopeError(f"{kind.capitalize()} tensors of layer {layer} were not kept (kept: {kept}) in this run; "
                                 f"capture with {arg}=[{layer}] or 'all'.")
        return self.tensors[key]

    def __repr__(self) -> str:
        return (f"Trajectory(run_id={self.run_id!r}, prompt_len={self.prompt_len}, "
                f"generated={self.meta.get('n_generated')}, stop={self.meta.get('stop_reason')!r})")

    # -- run directory IO -------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Write the run directory atomically (temporary directory, then rename). Returns the path."""
        path = pathlib.Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        except OSError as exc:
            raise TrajscopeError(f"Cannot write the run to '{path}': {exc.strerror or exc}.") from None
        try:
            meta = dict(self.meta, schema_version=SCHEMA_VERSION, tables=self.table_names(),
                        tensors=sorted(self.tensors))
            for name in self.table_names():
                getattr(self, name).write_parquet(tmp / f"{name}.parquet", metadata=parquet_metadata(name))
            if self.tensors:
                from safetensors.torch import save_file

                save_file({k: v.contiguous().cpu() for k, v in self.tensors.items()}, str(tmp / TENSOR_FILE))
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
            old = None
            if path.exists():
                old = path.with_name(f".{path.name}.old-{os.getpid()}")
                path.rename(old)
            _honour_umask(tmp)
            tmp.rename(path)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise TrajscopeError(f"Cannot write the run to '{path}': {exc.strerror or exc}.") from None
        return path

    def to_parquet(self, directory: str | os.PathLike) -> pathlib.Path:
        """Write just the tables (``<table>.parquet``, schema-versioned) into ``directory``."""
        directory = pathlib.Path(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for name in self.table_names():
                getattr(self, name).write_parquet(directory / f"{name}.parquet", metadata=parquet_metadata(name))
        except OSError as exc:
            raise TrajscopeError(f"Cannot write tables to '{directory}': {exc.strerror or exc}.") from None
        return directory

    @classmethod
    def load(cls, path: str | os.PathLike, lazy: bool = False) -> "Trajectory":
        """Read a run directory written by :meth:`save`.

        Args:
            lazy: open ``attention`` and ``activations`` as ``pl.LazyFrame`` scans and leave the
                tensors on disk (for reports over many or very long runs); ``tokens`` is read.

        Raises:
            TrajscopeError: naming the directory and what is missing or unreadable.
        """
        path = pathlib.Path(path)
        if not path.is_dir():
            raise TrajscopeError(f"No run directory at '{path}'.")
        meta_file = path / "meta.json"
        if not meta_file.exists():
            raise TrajscopeError(f"'{path}' is not a trajscope run directory: it has no meta.json.")
        try:
            meta = json.loads(meta_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TrajscopeError(f"Run directory '{path}' has a corrupt meta.json ({exc}).") from None
        version = meta.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise TrajscopeError(f"Run directory '{path}' has schema version {version}; this trajscope reads "
                                 f"versions {', '.join(map(str, READABLE_VERSIONS))}.")
        tables = {}
        for name in list(TABLES) + [t for t in OPTIONAL_TABLES if t in meta.get("tables", ())]:
            f = path / f"{name}.parquet"
            if not f.exists():
                raise TrajscopeError(f"Run directory '{path}' is incomplete: {f.name} is missing.")
            try:
                if lazy and name in ("attention", "activations"):
                    tables[name] = pl.scan_parquet(f)
                    tables[name].collect_schema()  # reads the footer: a corrupt file fails here
                else:
                    tables[name] = pl.read_parquet(f)
            except Exception as exc:
                raise TrajscopeError(f"Run directory '{path}' has an unreadable {f.name} ({exc}).") from None
        tensors = {}
        if meta.get("tensors") and not lazy:
            f = path / TENSOR_FILE
            if not f.exists():
                raise TrajscopeError(f"Run directory '{path}' is incomplete: {TENSOR_FILE} is missing.")
            try:
                from safetensors.torch import load_file

                tensors = load_file(str(f))
            except Exception as exc:
                raise TrajscopeError(f"Run directory '{path}' has an unreadable {TENSOR_FILE} ({exc}).") from None
        if version != SCHEMA_VERSION:  # converters: docs/schema.md, "Converters"
            tables["tokens"] = upgrade_tokens(tables["tokens"], int(meta["prompt_len"]))
            meta["schema_version"] = SCHEMA_VERSION
        return cls(meta=meta, tensors=tensors, **tables)


def _honour_umask(directory: pathlib.Path) -> None:
    """Give a finished run directory the permissions of ordinary new files (mkdtemp makes it 0700)."""
    mask = os.umask(0)
    os.umask(mask)
    directory.chmod(0o777 & ~mask)
    for f in directory.iterdir():
        f.chmod(0o666 & ~mask)


def upgrade_tokens_v1(tokens: pl.DataFrame, prompt_len: int) -> pl.DataFrame:
    """Schema 1 → 2: add ``produced_at_step`` after ``step`` (docs/schema.md, "Converters")."""
    if "produced_at_step" in tokens.columns:
        return tokens
    cols = tokens.columns
    i = cols.index("step") + 1 if "step" in cols else len(cols)
    out = tokens.with_columns(positions.produced_at_step_expr(prompt_len))
    return out.select(*cols[:i], "produced_at_step", *cols[i:])


def upgrade_tokens_v2(tokens: pl.DataFrame, prompt_len: int) -> pl.DataFrame:
    """Schema 2 → 3: add ``segment`` after ``phase``: older runs had plain prompts, so prompt positions are
    ``user`` and generated ones ``assistant`` (``thinking`` inside thinking tags of the generated text)."""
    if "segment" in tokens.columns:
        return tokens
    texts = tokens.sort("pos")["text"].to_list()
    P = min(prompt_len, len(texts))
    seg = positions.segments_from_runs(None, P) + positions.generated_segments(texts[P:])
    cols = tokens.columns
    i = cols.index("phase") + 1 if "phase" in cols else len(cols)
    out = tokens.sort("pos").with_columns(pl.Series("segment", seg, dtype=pl.String))
    return out.select(*cols[:i], "segment", *cols[i:])


def upgrade_tokens(tokens: pl.DataFrame, prompt_len: int) -> pl.DataFrame:
    """A tokens table of any readable schema version, brought to :data:`SCHEMA_VERSION`."""
    return upgrade_tokens_v2(upgrade_tokens_v1(tokens, prompt_len), prompt_len)
