"""Export a run: one table as Parquet or CSV bytes, or the whole run directory as a zip.

Pure functions (no Panel) so the bytes a user downloads are testable. CSV
cannot hold list columns (``top_pos``, ``top_texts``…), so they are written as
JSON arrays. Nothing secret is in a run: :func:`trajscope.capture` records the
model's description and sampling settings, never an API key.
"""

from __future__ import annotations

import io
import json
import pathlib
import tempfile
import zipfile

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.safe_paths import safe_name
from trajscope.trajectory import TABLES, Trajectory, parquet_metadata

FORMATS = ("parquet", "csv")


def csv_ready(df: pl.DataFrame) -> pl.DataFrame:
    """The frame with list columns turned into JSON-array strings."""
    lists = [c for c, t in df.schema.items() if isinstance(t, (pl.List, pl.Array))]
    return df.with_columns(pl.col(c).map_elements(lambda v: json.dumps(list(v)), return_dtype=pl.String,
                                                  skip_nulls=True) for c in lists)


def table_bytes(traj: Trajectory, table: str, fmt: str) -> bytes:
    """One table of ``traj`` serialised.

    Args:
        table: one of ``tokens``, ``attention``, ``activations``.
        fmt: ``parquet`` or ``csv``.
    """
    if table not in TABLES:
        raise TrajscopeError(f"Unknown table '{table}': choose one of {', '.join(TABLES)}.")
    if fmt not in FORMATS:
        raise TrajscopeError(f"Unknown format '{fmt}': choose parquet or csv.")
    df = getattr(traj, table)
    buf = io.BytesIO()
    if fmt == "parquet":
        df.write_parquet(buf, metadata=parquet_metadata(table))
    else:
        csv_ready(df).write_csv(buf)
    return buf.getvalue()


def run_zip_bytes(traj: Trajectory) -> bytes:
    """The run directory (meta.json, tables, tensors) as a zip whose top folder is the run id.

    The run id comes from ``meta.json`` (anybody can edit it): the run is written into a fresh temporary
    directory under :func:`~trajscope.safe_paths.safe_name` of it, and every entry is ``<safe name>/<file>``
    for the plain files written there, so no entry climbs (``..``), is absolute, or follows a link.
    """
    top = safe_name(traj.run_id)
    with tempfile.TemporaryDirectory() as tmp:
        path = traj.save(pathlib.Path(tmp) / top)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for f in sorted(path.iterdir()):
                if f.is_file() and not f.is_symlink():
                    zf.write(f, f"{top}/{safe_name(f.name, 'file')}")
    return buf.getvalue()


def report_bytes(traj: Trajectory, other: str | None = None) -> bytes:
    """The standalone HTML comparison report of ``traj`` (and the run directory ``other``, when given)."""
    from trajscope.reports.comparison import compare

    runs = [traj] + ([other.strip()] if other and other.strip() else [])
    with tempfile.TemporaryDirectory() as tmp:
        return compare(runs).save(pathlib.Path(tmp) / "report.html").read_bytes()
