"""Exports: versioned Parquet tables that Polars, DuckDB or Spark read without trajscope.

Every Parquet file trajscope writes carries two key-value metadata entries,
``trajscope_schema`` (the schema version, see ``docs/schema.md``) and
``trajscope_table`` (which table it is). :func:`read_table` checks them: a file
from an older schema version is refused with a message saying which version it
is and which this trajscope reads (version 2 is read, its ``tokens`` given the
``segment`` column of version 3).

:func:`export` turns many run directories into one Hive-partitioned dataset,
``OUT/<table>/model=<id>/run_id=<id>/part-0.parquet`` (values percent-encoded, so
``a/b:c`` and ``a_b_c`` stay apart and read back as themselves), streaming one run at a
time through Polars' lazy engine, so 1,000 runs never sit in memory together. Runs
that share every partition key (the same prompt id captured twice, in ``runs/base``
and ``runs/steered``) land in one partition as ``part-0``, ``part-1``, … The export
is atomic: a corrupt run leaves no partial dataset. Read it back with

    pl.scan_parquet("OUT/attention/**/*.parquet", hive_partitioning=True)
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import tempfile
import urllib.parse
from typing import Any, Callable, Iterable, Sequence

import polars as pl

from trajscope import positions
from trajscope.errors import TrajscopeError, first_sentence
from trajscope.io import atomic_dir, honour_umask
from trajscope.safe_paths import inside
from trajscope.trajectory import OPTIONAL_TABLES, SCHEMA_VERSION, TABLES, Trajectory, parquet_metadata, upgrade_tokens_v2

ALL_TABLES = TABLES + OPTIONAL_TABLES


def read_table(path: str | os.PathLike) -> pl.DataFrame:
    """Read a trajscope Parquet file, refusing other schema versions with a clear message."""
    path = pathlib.Path(path)
    try:
        meta = pl.read_parquet_metadata(path)
    except Exception as exc:
        raise TrajscopeError(f"'{path}' is not a readable Parquet file ({exc}).") from exc
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
    """A Hive partition value as one path segment: percent-encoded (``a/b:c`` → ``a%2Fb%3Ac``), as Hive, Polars
    and DuckDB read it back, so distinct values never share a folder."""
    return urllib.parse.quote(value, safe="") or "_"


def _meta(run: pathlib.Path) -> dict:
    try:
        return json.loads((run / "meta.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TrajscopeError(f"Run directory '{run}' has a corrupt meta.json ({exc}).") from exc


def _run_dirs(runs: Iterable[str | os.PathLike | Trajectory]) -> list:
    from trajscope.leftovers import is_temporary

    out = []
    for r in runs:
        if isinstance(r, Trajectory):
            out.append(r)
            continue
        p = pathlib.Path(r)
        if is_temporary(p):  # a save's temporary directory (in progress or left over) is never a run
            continue
        if not (p / "meta.json").exists():
            raise TrajscopeError(f"'{p}' is not a trajscope run directory: it has no meta.json.")
        out.append(p)
    if not out:
        raise TrajscopeError("Nothing to export: no runs were given.")
    return out


def _write_run(run: pathlib.Path | Trajectory, root: pathlib.Path, partition_by: Sequence[str],
               tables: Sequence[str], used: dict[str, int]) -> list[pathlib.Path]:
    """Write one run's tables under ``root``; returns the files written. A run that cannot be read raises
    :class:`TrajscopeError` naming the run and why, after removing the files it had written."""
    written: list[pathlib.Path] = []
    table = "meta.json"
    try:
        meta = run.meta if isinstance(run, Trajectory) else _meta(run)
        try:
            keys = {"model": meta["model"]["model_id"], "run_id": meta["run_id"], "family": meta["model"]["family"]}
        except (KeyError, TypeError) as exc:
            raise TrajscopeError(f"Run directory '{run}' has a meta.json without {exc} (not a trajscope run's "
                                 "meta.json).") from exc
        sub = "/".join(f"{k}={_safe(str(keys[k]))}" for k in partition_by)
        part = f"part-{used.get(sub, 0)}.parquet"
        for table in tables:
            if isinstance(run, Trajectory):
                df = getattr(run, table)
                if df is None:
                    continue
                lf = df.lazy()
            else:
                src = run / f"{table}.parquet"
                if src.exists():
                    inside(src, run)  # a link out of the run directory is not followed
                if not src.exists():
                    if table in TABLES:
                        raise TrajscopeError(f"Run directory '{run}' is incomplete: {src.name} is missing.")
                    continue
                lf = pl.scan_parquet(src)
            target = root / table / sub
            target.mkdir(parents=True, exist_ok=True)
            drop = [k for k in partition_by if k in lf.collect_schema().names()]
            lf.drop(drop).sink_parquet(target / part, metadata=parquet_metadata(table))
            written.append(target / part)
    except TrajscopeError:
        _remove(written)
        raise
    except OSError:
        _remove(written)
        raise  # writing failed: export() says so for the dataset
    except (pl.exceptions.PolarsError, ValueError) as exc:
        _remove(written)
        raise TrajscopeError(f"Run directory '{run}' is corrupt: its {table}.parquet is unreadable "
                             f"({first_sentence(exc)}).") from exc
    used[sub] = used.get(sub, 0) + 1
    return written


def _remove(files: Sequence[pathlib.Path]) -> None:
    for f in files:
        f.unlink(missing_ok=True)


def export(runs: Iterable[str | os.PathLike | Trajectory], out: str | os.PathLike,
           partition_by: Sequence[str] = ("model", "run_id"), tables: Sequence[str] = ALL_TABLES,
           progress: bool = True, on_skip: Callable[[Any, str], None] | None = None) -> pathlib.Path:
    """Write many runs as one Hive-partitioned Parquet dataset per table, atomically.

    The dataset is built in a temporary folder beside ``out`` (``.<name>.XXXX``). When every run is
    written, a new ``out`` is that folder renamed; an existing ``out`` (an earlier export) receives the
    new partition files one by one (``os.replace``), keeping the partitions of other runs. When a run
    cannot be read the temporary folder is removed: no partial dataset remains, and ``out`` is as it was.

    Args:
        runs: run directories (or Trajectories).
        out: dataset root; ``out/<table>/<key>=<value>/.../part-<n>.parquet`` (n counts runs sharing the keys).
        partition_by: keys among ``model`` (the model id), ``run_id``, ``family``.
        tables: which tables to export (optional ones are skipped for runs without them).
        on_skip: when given, a run that cannot be read is left out (its files removed) and
            ``on_skip(run, reason)`` is called, instead of failing the export.
    Returns:
        ``out``.
    Raises:
        TrajscopeError: one sentence naming the first unreadable run and why (without ``on_skip``), or
        why ``out`` cannot be written.
    """
    from tqdm.auto import tqdm

    bad = [k for k in partition_by if k not in ("model", "run_id", "family")]
    if bad:
        raise TrajscopeError(f"Cannot partition by {bad}: choose among model, run_id, family.")
    out = pathlib.Path(out)
    todo = _run_dirs(runs)
    if out.exists() and not out.is_dir():
        raise TrajscopeError(f"Cannot export to '{out}': it is a file.")
    fresh = not out.exists() or not any(out.iterdir())
    try:
        with (atomic_dir(out) if fresh else _staging(out)) as root:
            n_ok, used = 0, {}
            for run in tqdm(todo, desc="export", unit="run", disable=not progress):
                try:
                    _write_run(run, root, partition_by, tables, used)
                    n_ok += 1
                except TrajscopeError as exc:
                    if on_skip is None:
                        raise
                    on_skip(run, str(exc))
            if not n_ok:
                raise TrajscopeError("Nothing to export: every run was left out as unreadable.")
    except OSError as exc:
        raise TrajscopeError(f"Cannot export to '{out}': {exc.strerror or exc}.") from exc
    return out


@contextlib.contextmanager
def _staging(out: pathlib.Path):
    """A temporary folder beside an existing dataset ``out``; on success its files move into ``out``."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        honour_umask(tmp)
        for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
            dest = out / f.relative_to(tmp)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def scan(out: str | os.PathLike, table: str) -> pl.LazyFrame:
    """Lazily read one table of an :func:`export` dataset (partition keys become columns)."""
    root = pathlib.Path(out) / table
    first = next(root.rglob("*.parquet"), None) if root.is_dir() else None
    if first is None:
        raise TrajscopeError(f"'{out}' holds no exported '{table}' table.")
    keys = [part.split("=", 1)[0] for part in first.relative_to(root).parts[:-1] if "=" in part]
    return pl.scan_parquet(str(root / "**" / "*.parquet"), hive_partitioning=True,
                           hive_schema={k: pl.String for k in keys}, try_parse_hive_dates=False)
