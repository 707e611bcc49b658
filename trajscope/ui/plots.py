"""Plot data: Polars frames (or arrays) in, plot data out. Pure functions.

Nothing here reads app state or imports Panel, so a plot is reproducible from a
run directory and unit-testable. Two kinds, so that moving the step cursor
redraws almost nothing:

- *base* plots and their data, which depend on the run and the selection (token
  layout and colours, attention heatmap, head grid); the figures that the app
  builds once per session and fills with this data are in
  :mod:`trajscope.ui.step_figures` (Overview) and :mod:`trajscope.ui.attention_figures`
  (Attention card);
- *cursor* coordinates, which depend on the step only (current token outline,
  current query row), set on annotations by the views.

Axes follow DESIGN.md: ``pos`` is the absolute token position, ``step`` 0 is
prefill, step s ≥ 1 queries position ``P + s − 1``.
"""

from __future__ import annotations

import holoviews as hv
import holoviews.plotting.bokeh  # noqa: F401  (registers the bokeh backend's plot options)
import numpy as np
import polars as pl

from trajscope import positions
from trajscope.errors import TrajscopeError
from trajscope.metrics.attention import TELEMETRY_FIELDS

hv.Store.set_current_backend("bokeh")

PREFILL_COLOR, DECODE_COLOR, CURSOR_COLOR, JUMP_COLOR = "#6c757d", "#1f77b4", "#d62728", "#ff7f0e"
CURVE_COLORS = {"entropy_norm": "#1f77b4", "prefix_mass": "#2ca02c", "generated_mass": "#9467bd",
                "sink_mass": "#8c564b", "sink4_mass": "#e377c2", "self_mass": "#17becf", "entropy": "#1f77b4"}
CURVE_LABELS = {"entropy": "attention entropy (nats)", "entropy_norm": "attention entropy / log(#keys)",
                "prefix_mass": "prefix (prompt) mass", "generated_mass": "generated mass",
                "sink_mass": "sink mass (pos 0)", "sink4_mass": "sink mass (pos 0–3)", "self_mass": "self mass"}
METRIC_CMAPS = {"entropy": "YlOrRd", "logprob": "PuBu_r", "drift": "RdBu_r"}
# the token strip's colours by segment (a category, not a scale), in positions.SEGMENTS order
SEGMENT_COLORS = {positions.SYSTEM: "#b0a8d8", positions.USER: "#7fb8e6", positions.ASSISTANT: "#8fd19e",
                  positions.THINKING: "#f6b26b"}
_WS = str.maketrans({" ": "·", "\n": "↵", "\t": "→", "\r": "␍"})


def visible(text: str | None) -> str:
    """Token text with whitespace made visible (space ·, newline ↵, tab →)."""
    return (text or "").translate(_WS) or "∅"


def position_labels(texts, prompt_len: int) -> list[str]:
    """Hover labels of positions: ``"12 prompt «·str»"`` (whitespace made visible)."""
    return [f"{i} {positions.phase(i, prompt_len)} «{visible(t)}»" for i, t in enumerate(texts)]


def integer_hover(tooltips: list[tuple[str, str]], labels: dict[str, list[str] | None],
                  origin: dict[str, int] | None = None):
    """A Bokeh ``HoverTool`` whose ``$x`` / ``$y`` fields show integers (cell centres), or ``labels[i]``.

    Args:
        tooltips: Bokeh tooltips; write ``$x{custom}`` / ``$y{custom}`` for the rounded coordinates.
        labels: ``{"$x": [...], "$y": [...]}``: text per integer coordinate (None: the integer itself).
        origin: ``{field: c}``: ``labels[field][0]`` belongs to coordinate ``c`` (default 0).
    """
    from bokeh.models import CustomJSHover, HoverTool

    code = ("const i = Math.round(value); if (labels === null) return String(i); const j = i - origin;"
            "return (j >= 0 && j < labels.length) ? labels[j] : String(i);")
    fmts = {k: CustomJSHover(args={"labels": v, "origin": int((origin or {}).get(k, 0))}, code=code)
            for k, v in labels.items()}
    return HoverTool(tooltips=tooltips, formatters=fmts)


# -- token strip ---------------------------------------------------------------------------------
def token_metric_values(tokens: pl.DataFrame, metric: str, drift: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per-position values of a token-colouring metric.

    Args:
        tokens: the ``tokens`` table.
        metric: a numeric column of ``tokens`` (``entropy``, ``logprob``, or any added per-token column),
            ``"segment"`` (the index of the position's segment in :data:`trajscope.positions.SEGMENTS`), or
            ``"drift"`` (then ``drift`` must be the frame of :func:`trajscope.metrics.position_zscore.position_zscore`).
    Returns:
        ``pos, value`` (Float64, null where undefined), one row per token.
    """
    if metric == "drift":
        base = tokens.select("pos")
        if drift is None or drift.is_empty():
            return base.with_columns(pl.lit(None, dtype=pl.Float64).alias("value"))
        return base.join(drift.select("pos", pl.col("drift").alias("value")), on="pos", how="left")
    if metric == "segment":
        if "segment" not in tokens.columns:  # a run saved before segments were recorded
            return tokens.select("pos", pl.lit(None, dtype=pl.Float64).alias("value"))
        codes = {name: float(i) for i, name in enumerate(positions.SEGMENTS)}
        return tokens.select("pos", pl.col("segment").replace_strict(codes, default=None, return_dtype=pl.Float64)
                             .alias("value"))
    return tokens.select("pos", pl.col(metric).cast(pl.Float64).fill_nan(None).alias("value"))


def token_layout(tokens: pl.DataFrame, values: pl.DataFrame | None = None, wrap: int = 110) -> pl.DataFrame:
    """Lay tokens out as boxes on wrapped lines, one character = one x unit, one line = one y unit.

    Args:
        tokens: the ``tokens`` table (pos, step, phase, text).
        values: ``pos, value`` from :func:`token_metric_values` (colour), or None.
        wrap: characters per line.
    Returns:
        One row per token: ``pos, step, phase, (segment,) text, label, value, x0, x1, y0, y1, xc, yc``
        (line r spans y ∈ [−r−1, −r]; a newline token ends its line).
    """
    labels = [visible(t) for t in tokens["text"].to_list()]
    x0s, y0s, widths = [], [], []
    x, row = 0.0, 0
    for label, raw in zip(labels, tokens["text"].to_list()):
        w = float(min(len(label), wrap)) + 0.4
        if x + w > wrap and x > 0:
            x, row = 0.0, row + 1
        x0s.append(x)
        y0s.append(-row - 1.0)
        widths.append(w)
        x += w
        if raw and raw.endswith("\n"):
            x, row = 0.0, row + 1
    x0 = np.array(x0s, dtype=np.float64)
    w = np.array(widths, dtype=np.float64)
    y0 = np.array(y0s, dtype=np.float64)
    keep = ["pos", "step", "phase", "text"] + (["segment"] if "segment" in tokens.columns else [])
    out = tokens.select(keep).with_columns(
        pl.Series("label", labels, dtype=pl.String), pl.Series("x0", x0 + 0.05), pl.Series("x1", x0 + w - 0.05),
        pl.Series("y0", y0 + 0.08), pl.Series("y1", y0 + 0.92), pl.Series("xc", x0 + w / 2), pl.Series("yc", y0 + 0.5))
    if values is not None:
        out = out.join(values.select("pos", "value"), on="pos", how="left")
    else:
        out = out.with_columns(pl.lit(None, dtype=pl.Float64).alias("value"))
    return out


def token_at(layout: pl.DataFrame, x: float | None, y: float | None) -> int | None:
    """Position of the token box containing (x, y), or None."""
    if x is None or y is None:
        return None
    hit = layout.filter((pl.col("x0") <= x) & (pl.col("x1") >= x) & (pl.col("y0") - 0.08 <= y) & (pl.col("y1") + 0.08 >= y))
    return None if hit.is_empty() else int(hit["pos"][0])


def text_colors(values: np.ndarray, cmap: str, lo: float, hi: float, alpha: float = 0.85) -> list[str]:
    """Black or white per value, whichever has the higher WCAG contrast on the fill ``cmap`` gives it
    (blended over white with ``alpha``); NaN boxes are light grey, so black."""
    from holoviews.plotting.util import process_cmap

    pal = process_cmap(cmap, ncolors=256)
    out = []
    for v in values:
        if not np.isfinite(v):
            out.append("black")
            continue
        c = pal[int(np.clip((v - lo) / (hi - lo), 0, 1) * 255)].lstrip("#")
        rgb = [alpha * int(c[i:i + 2], 16) / 255 + (1 - alpha) for i in (0, 2, 4)]
        lin = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in rgb]
        lum = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
        out.append("white" if lum < 0.179 else "black")  # equal contrast with black and white at 0.179
    return out


def token_cursor_boxes(layout: pl.DataFrame, query_pos: int, produced_pos: int | None = None) -> list[dict]:
    """Outline boxes of the current step's query token and of the token it produced.

    Returns:
        Two dicts ``{left, right, bottom, top, visible}`` (query, produced), in strip coordinates;
        ``visible`` is False for a position not in the layout.
    """
    out = []
    for pos in (query_pos, produced_pos):
        hit = layout.filter(pl.col("pos") == pos) if pos is not None else layout.head(0)
        if len(hit):
            out.append({"left": float(hit["x0"][0]) - 0.1, "right": float(hit["x1"][0]) + 0.1,
                        "bottom": float(hit["y0"][0]) - 0.06, "top": float(hit["y1"][0]) + 0.06, "visible": True})
        else:
            out.append({"left": 0.0, "right": 0.0, "bottom": 0.0, "top": 0.0, "visible": False})
    return out


# -- attention ------------------------------------------------------------------------------------
def attention_matrix(attention: pl.DataFrame, layer: int, head: int | None, n_pos: int) -> np.ndarray:
    """Sparse query × key matrix from the table's top-k keys, for layers whose full rows were not kept.

    Args:
        attention: the ``attention`` table (pos, layer, head, top_pos, top_w).
        head: a head index, or None for the mean over heads.
    Returns:
        ``[n_pos, n_pos]`` float32, query × key; only each row's top-k weights are non-zero.
    """
    df = attention.filter(pl.col("layer") == layer)
    n_heads = int(df["head"].n_unique()) if len(df) else 1
    if head is not None:
        df, n_heads = df.filter(pl.col("head") == head), 1
    ex = df.select("pos", "top_pos", "top_w").explode("top_pos", "top_w").drop_nulls()
    out = np.zeros((n_pos, n_pos), dtype=np.float32)
    q, k, w = ex["pos"].to_numpy(), ex["top_pos"].to_numpy(), ex["top_w"].to_numpy()
    ok = (q < n_pos) & (k < n_pos)
    np.add.at(out, (q[ok], k[ok]), w[ok] / n_heads)
    return out


SPARSE_NOTE = " (top-8 keys only: full rows not kept for this layer)"


def attention_heatmap_data(traj, layer: int, head: int | None) -> dict:
    """What the Attention card's heatmap shows for ``layer`` / ``head`` of a run (None: no run yet).

    Uses the full attention rows when the run kept them for the layer (``attention_layers`` at capture;
    saved runs hold them as float16), otherwise rebuilds each row from its top-8 keys in the
    ``attention`` table (:func:`attention_matrix`), and says so in the title.

    Args:
        traj: a :class:`~trajscope.trajectory.Trajectory`, or None.
        head: a head index, or None for the mean over heads.
    Returns:
        ``{"matrix": [n_query, n_key] float32, "prompt_len", "title", "sparse", "labels"}``; ``labels`` are
        the :func:`position_labels` of the run's positions (hover text), None without a run.
    """
    if traj is None:
        return {"matrix": np.zeros((1, 1), dtype=np.float32), "prompt_len": 1, "sparse": False, "labels": None,
                "title": "Attention weights (no run yet)"}
    n = int(traj.attention["pos"].max() or 0) + 1  # positions that were queries
    try:
        rows = traj.attention_rows(layer)
        matrix = (rows.float().mean(0) if head is None else rows[head].float()).numpy()
        sparse = False
    except TrajscopeError:
        matrix = attention_matrix(traj.attention, layer, head, n)
        sparse = True
    who = "mean over heads" if head is None else f"head {head}"
    return {"matrix": np.ascontiguousarray(matrix, dtype=np.float32), "prompt_len": traj.prompt_len,
            "sparse": sparse, "labels": position_labels(traj.tokens["text"].to_list(), traj.prompt_len),
            "title": f"Attention weights, layer {layer}, {who}" + (SPARSE_NOTE if sparse else "")}


def attention_cursor_box(step: int, prompt_len: int, n_keys: int) -> dict:
    """Box around the rows queried at ``step`` (all prompt rows at step 0, row P + s − 1 after).

    Returns:
        ``{left, right, bottom, top}`` in heatmap coordinates (key pos, query pos).
    """
    rows = positions.query_positions(step, prompt_len)
    lo, hi = rows[0], rows[-1]
    return {"left": -0.5, "right": n_keys - 0.5, "bottom": lo - 0.5, "top": hi + 0.5}


def head_box(layer: int, head: int | None, n_heads: int) -> dict:
    """Outline of the selected layer × head cell (the whole layer row when ``head`` is None)."""
    x0, x1 = (head - 0.5, head + 0.5) if head is not None else (-0.5, n_heads - 0.5)
    return {"left": x0, "right": x1, "bottom": layer - 0.5, "top": layer + 0.5}


def head_grid_values(queries: pl.DataFrame, step: int, stat: str, n_layers: int | None = None,
                     n_heads: int | None = None) -> np.ndarray:
    """One statistic for every layer × head at one step: ``[n_layers, n_heads]`` float64, row = layer,
    column = head, NaN where the step has no row (shape from ``queries`` unless given)."""
    if n_heads is None:
        n_heads = int(queries["head"].max() or 0) + 1 if len(queries) else 1
    if n_layers is None:
        n_layers = int(queries["layer"].max() or 0) + 1 if len(queries) else 1
    grid = np.full((n_layers, n_heads), np.nan)
    if len(queries):
        df = queries.filter(pl.col("step") == step)
        grid[df["layer"].to_numpy(), df["head"].to_numpy()] = df[stat].cast(pl.Float64).to_numpy()
    return grid


def head_grid_data(queries: pl.DataFrame, step: int, stat: str) -> dict:
    """What the layer × head grid shows: the values at ``step`` (:func:`head_grid_values`) and their frame.

    Returns:
        ``{"grid", "n_layers", "n_heads", "clim", "label", "title", "height", "xticks", "yticks"}``:
        the colour range is [0, 1] (the run's maximum for ``entropy``, in nats); at most 16 layer ticks.
    """
    n_heads = int(queries["head"].max() or 0) + 1 if len(queries) else 1
    n_layers = int(queries["layer"].max() or 0) + 1 if len(queries) else 1
    label = CURVE_LABELS.get(stat, stat)
    clim = (0.0, 1.0) if stat != "entropy" or not len(queries) else (0.0, float(queries[stat].max() or 1.0))
    return {"grid": head_grid_values(queries, step, stat, n_layers, n_heads), "n_layers": n_layers,
            "n_heads": n_heads, "clim": clim, "label": label,
            "title": f"Every layer × head at this step: {label}" if len(queries) else "Layer × head grid (no run yet)",
            "height": max(300, 16 * n_layers + 70), "xticks": list(range(n_heads)),
            "yticks": list(range(0, n_layers, -(-n_layers // 16)))}


def top_attended(queries: pl.DataFrame, tokens: pl.DataFrame, step: int, layer: int, head: int | None,
                 k: int = 8) -> pl.DataFrame:
    """The keys the current step's query attends to most, as text.

    Args:
        queries: one row per step × layer × head (top_pos, top_w lists).
        head: a head, or None for the mean over the layer's heads (weights summed over heads / n_heads,
            from each head's top-k: a lower bound of the true mean weight).
    Returns:
        ``rank, pos, phase, token, weight``, at most ``k`` rows, heaviest first.
    """
    df = queries.filter((pl.col("step") == step) & (pl.col("layer") == layer))
    n = max(1, len(df))
    if head is not None:
        df, n = df.filter(pl.col("head") == head), 1
    ex = df.select("top_pos", "top_w").explode("top_pos", "top_w").drop_nulls().filter(pl.col("top_w") > 0)
    agg = ex.group_by("top_pos").agg((pl.col("top_w").sum() / n).alias("weight")).sort("weight", descending=True).head(k)
    agg = agg.rename({"top_pos": "pos"}).with_columns(pl.col("pos").cast(tokens["pos"].dtype))
    out = agg.join(tokens.select("pos", "phase", "text"), on="pos", how="left").sort("weight", descending=True)
    return out.with_columns(pl.int_range(1, pl.len() + 1).alias("rank"),
                            pl.col("text").map_elements(visible, return_dtype=pl.String).alias("token")).select(
        "rank", "pos", "phase", "token", pl.col("weight").cast(pl.Float64))


# -- telemetry ------------------------------------------------------------------------------------
def empty_telemetry(fields: tuple[str, ...] = TELEMETRY_FIELDS) -> pl.DataFrame:
    """A telemetry frame with no steps (the shape :func:`telemetry_plot` draws before there is a run)."""
    return pl.DataFrame(schema={"step": pl.Int32, **{f: pl.Float64 for f in fields}, "jaccard": pl.Float64,
                                "jump": pl.Boolean, "sharp_jump": pl.Boolean})


def empty_tokens() -> pl.DataFrame:
    """A ``tokens`` table with no rows (what the token views draw before there is a run)."""
    return pl.DataFrame(schema={"pos": pl.Int32, "step": pl.Int32, "phase": pl.String, "text": pl.String,
                                "logprob": pl.Float32, "entropy": pl.Float32, "token_id": pl.Int64})


__all__ = ["visible", "token_metric_values", "token_layout", "token_at", "token_cursor_boxes", "text_colors",
           "attention_matrix", "attention_heatmap_data", "attention_cursor_box", "head_grid_values", "head_grid_data",
           "head_box", "top_attended",
           "empty_telemetry", "empty_tokens", "TELEMETRY_FIELDS"]
