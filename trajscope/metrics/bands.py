"""Decode-depth and next-token-entropy bands: one definition for every report.

Depth bands group decode steps on a ×4 scale, ``prefill`` (step 0), ``1-4``,
``5-16``, ``17-64``, ``65-256``, ``257+``, with single steps 1, 8, 50 and 200
reported on their own where a table has room. Entropy bands cut the next-token
entropy (nats) at 0.5, 1.5 and 3: ``0-0.5``, ``0.5-1.5``, ``1.5-3``, ``3+``.
Position bins cut the absolute token position at 32, 64, 128 and 256: ``0-31``,
``32-63``, ``64-127``, ``128-255``, ``256+``; a report compares prefill and decode
rows inside the same bin, so depth is not read as a position effect.
Scalar functions label one value; the ``*_expr`` versions label a Polars column.

Labels are text, and text sorts ``1-4, 17-64, 5-16``. Every table sorts bands by
their order key instead: :func:`band_rank` (the label's index in its order),
:func:`sort_bands` (sort a frame by keys, band columns by rank).
"""

from __future__ import annotations

import math
from typing import Sequence

import polars as pl

DEPTH_STEPS = (1, 8, 50, 200)
DEPTH_BANDS = ((1, 4), (5, 16), (17, 64), (65, 256), (257, None))
ENTROPY_EDGES = (0.5, 1.5, 3.0)
DEPTH_ORDER = ("prefill",) + tuple(f"{lo}-{hi}" if hi is not None else f"{lo}+" for lo, hi in DEPTH_BANDS)
POSITION_BINS = ((0, 31), (32, 63), (64, 127), (128, 255), (256, None))
POSITION_ORDER = tuple(f"{lo}-{hi}" if hi is not None else f"{lo}+" for lo, hi in POSITION_BINS)
ENTROPY_ORDER = tuple(f"{lo:g}-{hi:g}" for lo, hi in zip((0.0, *ENTROPY_EDGES), ENTROPY_EDGES)) + (f"{ENTROPY_EDGES[-1]:g}+",)


BAND_ORDERS = {"depth_band": DEPTH_ORDER, "entropy_band": ENTROPY_ORDER, "pos_bin": POSITION_ORDER,
               "position_bin": POSITION_ORDER}


def band_rank(column: str, order: Sequence[str] | None = None) -> pl.Expr:
    """The order key of a band column: the label's index in its order (``prefill`` 0, ``1-4`` 1, …).

    Args:
        column: a band column (``depth_band``, ``entropy_band``, ``pos_bin``, ``position_bin``), or any
            column when ``order`` is given.
        order: its labels in order (default: :data:`BAND_ORDERS` of ``column``).
    Returns:
        An Int32 expression named ``column``; labels outside the order rank last, nulls stay null.
    """
    order = tuple(order if order is not None else BAND_ORDERS[column])
    return pl.col(column).replace_strict({g: i for i, g in enumerate(order)}, default=len(order),
                                         return_dtype=pl.Int32)


def sort_bands(df: pl.DataFrame, *by: str, orders: dict[str, Sequence[str]] | None = None) -> pl.DataFrame:
    """``df`` sorted by the ``by`` columns, band columns (and those in ``orders``) by :func:`band_rank`."""
    known = {**BAND_ORDERS, **(orders or {})}
    return df.sort([band_rank(c, known[c]) if c in known else pl.col(c) for c in by])


def depth_band(step: int | None) -> str | None:
    """Label of a step's depth band: ``"prefill"`` for 0, else ``"1-4"``, ``"5-16"``, …, ``"257+"``."""
    if step is None:
        return None
    if step == 0:
        return "prefill"
    for (lo, hi), name in zip(DEPTH_BANDS, DEPTH_ORDER[1:]):
        if step >= lo and (hi is None or step <= hi):
            return name
    return None


def entropy_band(h: float | None) -> str | None:
    """Label of a next-token entropy (nats): ``"0-0.5"``, ``"0.5-1.5"``, ``"1.5-3"``, ``"3+"``."""
    if h is None or (isinstance(h, float) and math.isnan(h)):
        return None
    for hi, name in zip(ENTROPY_EDGES, ENTROPY_ORDER):
        if h < hi:
            return name
    return ENTROPY_ORDER[-1]


def depth_band_expr(step: pl.Expr) -> pl.Expr:
    """:func:`depth_band` of a Polars column of steps."""
    expr = pl.when(step == 0).then(pl.lit("prefill"))
    for (lo, hi), name in zip(DEPTH_BANDS, DEPTH_ORDER[1:]):
        cond = step >= lo if hi is None else step.is_between(lo, hi)
        expr = expr.when(cond).then(pl.lit(name))
    return expr.otherwise(pl.lit(None, dtype=pl.String))


def entropy_band_expr(entropy: pl.Expr) -> pl.Expr:
    """:func:`entropy_band` of a Polars column of entropies (nats); null stays null."""
    return entropy.cut(list(ENTROPY_EDGES), labels=list(ENTROPY_ORDER), left_closed=True).cast(pl.String)


def position_bin(pos: int | None) -> str | None:
    """Label of an absolute position's bin: ``"0-31"``, ``"32-63"``, ``"64-127"``, ``"128-255"``, ``"256+"``."""
    if pos is None or pos < 0:
        return None
    for (lo, hi), name in zip(POSITION_BINS, POSITION_ORDER):
        if pos >= lo and (hi is None or pos <= hi):
            return name
    return None


def position_bin_expr(pos: pl.Expr) -> pl.Expr:
    """:func:`position_bin` of a Polars column of positions (negative or null → null)."""
    expr = pl.when(pos < 0).then(pl.lit(None, dtype=pl.String))
    for (lo, hi), name in zip(POSITION_BINS, POSITION_ORDER):
        cond = pos >= lo if hi is None else pos.is_between(lo, hi)
        expr = expr.when(cond).then(pl.lit(name))
    return expr.otherwise(pl.lit(None, dtype=pl.String))
