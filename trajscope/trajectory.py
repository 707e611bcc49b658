"""Trajectory: one prompt and its continuation under one configuration, as tables.

A trajectory holds the long-format Polars tables of DESIGN.md and, when asked
for at capture time, tensors:

- ``tokens``: one row per position (prompt and generated). ``logprob`` is
  ``log p(token at pos | tokens before pos)`` (null at pos 0); ``entropy`` and
  ``top_ids`` / ``top_texts`` / ``top_logprobs`` describe the next-token
  distribution computed *at* this position (null for the last token, which no
  step consumed). ``step`` is the forward pass in which the position was a
  query: 0 for the prompt, ``pos - P + 1`` after it.
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

import numpy as np
import polars as pl
import torch

from trajscope import _stepstats
from trajscope.errors import TrajscopeError

SCHEMA_VERSION = 1
TABLES = ("tokens", "attention", "activations")
OPTIONAL_TABLES = ("features", "probe")  # present when an SAE / a drift probe was attached
TENSOR_FILE = "tensors.safetensors"


def parquet_metadata(table: str) -> dict[str, str]:
    """Key-value metadata stamped into every Parquet file trajscope writes (schema version, table name)."""
    return {"trajscope_schema": str(SCHEMA_VERSION), "trajscope_table": table}


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
            raise TrajscopeError(f"{kind.capitalize()} tensors of layer {layer} were not kept (kept: {kept}); "
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
        if version != SCHEMA_VERSION:
            raise TrajscopeError(f"Run directory '{path}' has schema version {version}; this trajscope reads "
                                 f"version {SCHEMA_VERSION}.")
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
        return cls(meta=meta, tensors=tensors, **tables)


# -- building tables from capture records ------------------------------------------------------
def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy() if t.is_floating_point() else t.detach().cpu().numpy()


def build_tables(meta: dict, recs: list[dict], token_ids: list[int], final_lp: torch.Tensor | None,
                 tokenizer: Any, res_layers: list[int], row_layers: list[int]) -> tuple[dict, dict]:
    """Turn per-step capture records into the three tables and the kept tensors.

    Args:
        meta: needs ``run_id`` and ``prompt_len``.
        recs: capture records in step order (see :func:`trajscope.capture._step_record`).
        token_ids: all ids (the consumed ones plus, when known, the last produced one).
        final_lp: ``[vocab]`` log-probabilities that produced the last token, or None.
    Returns:
        ``({"tokens": df, "attention": df, "activations": df}, tensors)``.
    """
    run_id, P = meta["run_id"], int(meta["prompt_len"])
    n_comp = sum(len(r["ids"]) for r in recs)
    T = len(token_ids)
    pos = np.arange(T)
    step = np.maximum(0, pos - P + 1)
    logprob = np.full(T, np.nan, dtype=np.float32)
    if recs:
        chosen = np.concatenate([_np(r["chosen_lp"]).reshape(-1) for r in recs])
        logprob[1 : 1 + len(chosen)] = chosen
    if final_lp is not None and T > n_comp:
        logprob[T - 1] = float(final_lp[token_ids[-1]])
    k_tok = int(meta.get("top_k_tokens", 5))
    entropy = np.full(T, np.nan, dtype=np.float32)
    top_ids = np.full((T, k_tok), -1, dtype=np.int64)
    top_lp = np.full((T, k_tok), np.nan, dtype=np.float32)
    if recs:
        entropy[:n_comp] = np.concatenate([_np(r["entropy"]) for r in recs])
        top_ids[:n_comp] = np.concatenate([_np(r["top_ids"]) for r in recs])
        top_lp[:n_comp] = np.concatenate([_np(r["top_lp"]) for r in recs])
    texts = tokenizer.batch_decode([[i] for i in token_ids]) if T else []
    flat_top = [int(i) for i in top_ids[:n_comp].reshape(-1)]
    top_texts = tokenizer.batch_decode([[i] for i in flat_top]) if flat_top else []
    top_texts_rows = [top_texts[i * k_tok:(i + 1) * k_tok] for i in range(n_comp)] + [None] * (T - n_comp)
    tokens = pl.DataFrame({
        "run_id": [run_id] * T, "pos": pos.astype(np.int32), "step": step.astype(np.int32),
        "phase": np.where(pos < P, "prefill", "decode"), "token_id": np.asarray(token_ids, dtype=np.int64),
        "text": texts, "logprob": logprob, "entropy": entropy,
        "top_ids": [list(map(int, r)) if i < n_comp else None for i, r in enumerate(top_ids)],
        "top_texts": top_texts_rows,
        "top_logprobs": [list(map(float, r)) if i < n_comp else None for i, r in enumerate(top_lp)],
    }, schema_overrides={"top_ids": pl.List(pl.Int64), "top_texts": pl.List(pl.String),
                         "top_logprobs": pl.List(pl.Float32)}).with_columns(pl.col("logprob", "entropy").fill_nan(None))

    attention = _attention_table(run_id, P, recs, int(meta.get("top_k_keys", 8)))
    activations = _activation_table(run_id, P, recs)
    tensors: dict[str, torch.Tensor] = {}
    for layer in res_layers:
        if recs:
            tensors[f"residual.{layer}"] = torch.cat([r["resid"][layer].float().cpu() for r in recs])
    for layer in row_layers:
        if recs:
            tensors[f"attention.{layer}"] = _square_rows([r["rows"][layer] for r in recs], recs, n_comp)
    return {"tokens": tokens, "attention": attention, "activations": activations}, tensors


def _square_rows(rows: list[torch.Tensor], recs: list[dict], n: int) -> torch.Tensor:
    """Place per-step rows ``[H, q, k]`` into one ``[H, n, n]`` query × key matrix."""
    H = rows[0].shape[0]
    out = torch.zeros(H, n, n, dtype=torch.float32)
    for r, rec in zip(rows, recs):
        q0, q, k = rec["first_pos"], r.shape[1], r.shape[2]
        out[:, q0:q0 + q, :k] = r.float().cpu()
    return out


def _attention_table(run_id: str, P: int, recs: list[dict], top_k: int) -> pl.DataFrame:
    cols: dict[str, list] = {c: [] for c in ("step", "pos", "layer", "head", "stats", "top_pos", "top_w")}
    for r in recs:
        st = _np(r["attn"])  # [L, H, q, 7]
        L, H, q, _ = st.shape
        grid_q, grid_l, grid_h = np.meshgrid(np.arange(q), np.arange(L), np.arange(H), indexing="ij")
        cols["step"].append(np.full(q * L * H, r["step"], dtype=np.int32))
        cols["pos"].append((r["first_pos"] + grid_q).reshape(-1).astype(np.int32))
        cols["layer"].append(grid_l.reshape(-1).astype(np.int16))
        cols["head"].append(grid_h.reshape(-1).astype(np.int16))
        cols["stats"].append(st.transpose(2, 0, 1, 3).reshape(-1, st.shape[-1]))
        cols["top_pos"].append(_np(r["top_pos"]).transpose(2, 0, 1, 3).reshape(-1, top_k))
        cols["top_w"].append(_np(r["top_w"]).transpose(2, 0, 1, 3).reshape(-1, top_k))
    if not recs:
        return pl.DataFrame(schema={"run_id": pl.String, "step": pl.Int32, "pos": pl.Int32, "layer": pl.Int16,
                                    "head": pl.Int16, **{f: pl.Float32 for f in _stepstats.ATTN_FIELDS},
                                    "top_pos": pl.List(pl.Int32), "top_w": pl.List(pl.Float32)})
    stats = np.concatenate(cols["stats"]).astype(np.float32)
    n = len(stats)
    df = pl.DataFrame({
        "run_id": [run_id] * n, "step": np.concatenate(cols["step"]), "pos": np.concatenate(cols["pos"]),
        "layer": np.concatenate(cols["layer"]), "head": np.concatenate(cols["head"]),
        **{f: stats[:, i] for i, f in enumerate(_stepstats.ATTN_FIELDS)},
        "top_pos": np.concatenate(cols["top_pos"]).astype(np.int32),
        "top_w": np.concatenate(cols["top_w"]).astype(np.float32),
    })
    df = df.with_columns(pl.col("top_pos", "top_w").arr.to_list())
    keep = pl.col("top_pos").list.eval(pl.element() >= 0).list.sum()
    return df.with_columns(pl.col("top_pos").list.head(keep), pl.col("top_w").list.head(keep))


def _activation_table(run_id: str, P: int, recs: list[dict]) -> pl.DataFrame:
    parts = []
    for r in recs:
        st = _np(r["act"])  # [L, q, 7]
        L, q, _ = st.shape
        grid_q, grid_l = np.meshgrid(np.arange(q), np.arange(L), indexing="ij")
        parts.append((r["first_pos"] + grid_q.reshape(-1), grid_l.reshape(-1), st.transpose(1, 0, 2).reshape(-1, 7)))
    if not parts:
        return pl.DataFrame(schema={"run_id": pl.String, "pos": pl.Int32, "step": pl.Int32, "phase": pl.String,
                                    "layer": pl.Int16, **{f: pl.Float32 for f in _stepstats.ACT_FIELDS}})
    pos = np.concatenate([p[0] for p in parts]).astype(np.int32)
    stats = np.concatenate([p[2] for p in parts]).astype(np.float32)
    df = pl.DataFrame({
        "run_id": [run_id] * len(pos), "pos": pos, "step": np.maximum(0, pos - P + 1).astype(np.int32),
        "phase": np.where(pos < P, "prefill", "decode"),
        "layer": np.concatenate([p[1] for p in parts]).astype(np.int16),
        **{f: stats[:, i] for i, f in enumerate(_stepstats.ACT_FIELDS)},
    })
    return df.with_columns(pl.col("n_outliers", "n_massive").cast(pl.Int32))
