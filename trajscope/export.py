"""Exports: versioned Parquet tables that Polars, DuckDB or Spark read without trajscope.

Every Parquet file trajscope writes carries two key-value metadata entries,
``trajscope_schema`` (the schema version, see ``docs/schema.md``) and
``trajscope_table`` (which table it is). :func:`read_table` checks them: a file
from an older schema version is refused with a message saying which version it
is and which this trajscope reads (version 2 is read, its ``tokens`` given the
``segment`` column of version 3).

:func:`export` turns many run directories into one Hive-partitioned dataset,
``OUT/<table>/model=<id>/run_id=<id>/part-0.parquet``, streaming one run at a
time through Polars' lazy engine, so 1,000 runs never sit in memory together:

    pl.scan_parquet("OUT/attention/**/*.parquet", hive_partitioning=True)
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Iterable, Sequence

import polars as pl

from trajscope import positions
from trajscope.errors import TrajscopeError
from trajscope.trajectory import OPTIONAL_TABLES, SCHEMA_VERSION, TABLES, Trajectory, parquet_metadata, upgrade_tokens_v2

ALL_TABLES = TABLES + OPTIONAL_TABLES


def read_table(path: str | os.PathLike) -> pl.DataFrame:
    """Read a trajscope Parquet file, refusing other schema versions with a clear message."""
    path = pathlib.Path(path)
    try:
        meta = pl.read_parquet_metadata(path)
    except Exception as exc:
        raise TrajscopeError(f"'{path}' is not a readable Parquet file ({exc}).") from None
    version = meta.get("trajscope_schema")
    if version is None:
        raise TrajscopeError(f"'{path}' has no trajscope schema version; it was not written by trajscope.")
    if int(version) not in (2, SCHEMA_VERSION):
        raise TrajscopeError(f"'{path}' uses trajscope schema version {version}; this trajscope reads versions "
                             f"2 and {SCHEMA_VERSION} (see docs/schema.md for the differences).")
    df = pl.read_parquet(path)
    if meta.get("trajscope_table") == "tokens" and "segment" not in df.columns and "phase" in df.columns:
        # version 2 (docs/schema.md, "Converters"): the prompt length of each run is its count of prefill rows
        parts = df.partition_by("run_id", maintain_order=True) if "run_id" in df.columns else [df]
        df = pl.concat([upgrade_tokens_v2(part, int((part["phase"] == positions.PREFILL).sum())) for part in parts])
    return df


def _safe(value: str) -> str:
    """A Hive partition value that is a valid path segment."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", value).strip("_") or "_"


def _meta(run: pathlib.Path) -> dict:
    try:
        return json.loads((run / "meta.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TrajscopeError(f"Run directory '{run}' has a corrupt meta.json ({exc}).") from None


def _run_dirs(runs: Iterable[str | os.PathLike | Trajectory]) -> list:
    out = []
    for r in runs:
        if isinstance(r, Trajectory):
            out.append(r)
            continue
        p = pathlib.Path(r)
        if not (p / "meta.json").exists():
            raise TrajscopeError(f"'{p}' is not a trajscope run directory: it has no meta.json.")
        out.append(p)
    if not out:
        raise TrajscopeError("Nothing to export: no runs were given.")
    return out


def export(runs: Iterable[str | os.PathLike | Trajectory], out: str | os.PathLike,
           partition_by: Sequence[str] = ("model", "run_id"), tables: Sequence[str] = ALL_TABLES,
           progress: bool = True) -> pathlib.Path:
    """Write many runs as one Hive-partitioned Parquet dataset per table.

    Args:
        runs: run directories (or Trajectories).
        out: dataset root; ``out/<table>/<key>=<value>/.../part-0.parquet``.
        partition_by: keys among ``model`` (the model id), ``run_id``, ``family``.
        tables: which tables to export (optional ones are skipped for runs without them).
    Returns:
        ``out``.
    """
    from tqdm.auto import tqdm

    bad = [k for k in partition_by if k not in ("model", "run_id", "family")]
    if bad:
        raise TrajscopeError(f"Cannot partition by {bad}: choose among model, run_id, family.")
    out = pathlib.Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise TrajscopeError(f"Cannot export to '{out}': {exc.strerror or exc}.") from None
    for run in tqdm(_run_dirs(runs), desc="export", unit="run", disable=not progress):
        meta = run.meta if isinstance(run, Trajectory) else _meta(run)
        keys = {"model": meta["model"]["model_id"], "run_id": meta["run_id"], "family": meta["model"]["family"]}
        sub = "/".join(f"{k}={_safe(str(keys[k]))}" for k in partition_by)
        for table in tables:
            if isinstance(run, Trajectory):
                df = getattr(run, table)
                if df is None:
                    continue
                lf = df.lazy()
            else:
                src = run / f"{table}.parquet"
                if not src.exists():
                    if table in TABLES:
                        raise TrajscopeError(f"Run directory '{run}' is incomplete: {src.name} is missing.")
                    continue
                lf = pl.scan_parquet(src)
            target = out / table / sub
            target.mkdir(parents=True, exist_ok=True)
            drop = [k for k in partition_by if k in lf.collect_schema().names()]
            lf.drop(drop).sink_parquet(target / "part-0.parquet", metadata=parquet_metadata(table))
    return out


def scan(out: str | os.PathLike, table: str) -> pl.LazyFrame:
    """Lazily read one table of an :func:`export` dataset (partition keys become columns)."""
    root = pathlib.Path(out) / table
    first = next(root.rglob("*.parquet"), None) if root.is_dir() else None
    if first is None:
        raise TrajscopeError(f"'{out}' holds no exported '{table}' table.")
    keys = [part.split("=", 1)[0] for part in first.relative_to(root).parts[:-1] if "=" in part]
    return pl.scan_parquet(str(root / "**" / "*.parquet"), hive_partitioning=True,
                           hive_schema={k: pl.String for k in keys}, try_parse_hive_dates=False)
