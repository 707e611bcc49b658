"""How trajscope writes an estimate with its interval: one formatter for every report, table and CLI line.

``0.123 [0.101, 0.150]``. Intervals come from :mod:`trajscope.stats` (a bootstrap over
prompts, sessions or files); with a single cluster there is no between-cluster spread
and the interval is NaN, which is written ``0.123 (one prompt: no interval)``, never
``[NaN, NaN]``. :func:`format_interval` writes one value, :func:`interval_columns`
merges the ``c, c_lo, c_hi`` columns of a summary frame into one text column.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import polars as pl

__all__ = ["format_interval", "interval_columns"]


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def format_interval(estimate: Any, lo: Any, hi: Any, digits: int = 3, *, n_clusters: int | None = None,
                    unit: str = "prompt", number: Callable[[float], str] | None = None) -> str:
    """The one way trajscope writes an estimate with its interval.

    Args:
        estimate, lo, hi: numbers; None or NaN where missing.
        digits: decimals (ignored when ``number`` is given).
        n_clusters: the independent units behind the interval, when known.
        unit: what a cluster is (``prompt``, ``session``), for the no-interval note.
        number: how to write one number (default ``f"{v:.{digits}f}"``).
    Returns:
        ``"0.123 [0.101, 0.150]"``; ``"—"`` without an estimate; without an interval, ``"0.123 (one prompt: no
        interval)"`` from a single cluster (a bootstrap over clusters needs two), ``"0.123 (no interval)"`` from
        more, and ``"0.123"`` when ``n_clusters`` is not known. Never ``[nan, nan]``.
    """
    write = number or (lambda v: f"{v:.{digits}f}")
    if _missing(estimate):
        return "—"
    if not (_missing(lo) or _missing(hi)):
        return f"{write(estimate)} [{write(lo)}, {write(hi)}]"
    if n_clusters is None:
        return write(estimate)
    return f"{write(estimate)} ({'one ' + unit + ': ' if n_clusters < 2 else ''}no interval)"


def interval_columns(df: pl.DataFrame, columns: Sequence[str], n_clusters: str | None = None, digits: int = 3,
                     unit: str = "prompt") -> pl.DataFrame:
    """Replace each ``c, c_lo, c_hi`` of ``df`` by one text column ``c`` written by :func:`format_interval`.

    Args:
        df: a summary frame.
        columns: the estimates whose ``_lo`` / ``_hi`` columns follow them (missing ones are skipped).
        n_clusters: the column counting clusters per row (e.g. ``n_prompts``), if any.
    Returns:
        ``df`` with the interval columns merged, in place of the estimate.
    """
    out = df
    for c in (c for c in columns if c in df.columns):
        lo, hi = (df[f"{c}_lo"].to_list(), df[f"{c}_hi"].to_list()) if f"{c}_lo" in df.columns else (
            [None] * df.height, [None] * df.height)
        n = df[n_clusters].to_list() if n_clusters and n_clusters in df.columns else [None] * df.height
        text = [format_interval(e, a, b, digits, n_clusters=k, unit=unit)
                for e, a, b, k in zip(df[c].to_list(), lo, hi, n)]
        out = out.with_columns(pl.Series(c, text, dtype=pl.String)).drop(f"{c}_lo", f"{c}_hi", strict=False)
    return out
