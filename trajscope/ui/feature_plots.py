"""The SAE card's data and tables: frames and arrays in, plot data, frames or HTML out.

Pure functions (no Panel, no Bokeh, no app state). The figures that draw the plot data are
built once per session in :mod:`trajscope.ui.feature_figures`. The x axis of every
step-indexed plot is the *step*, as in the telemetry view: step 0 is the prefill pass,
drawn with the value at its last query (``pos = P − 1``), and decode step s ≥ 1 with the
value at its query ``pos = P + s − 1`` (:func:`trajscope.positions.query_pos`); all prompt
positions together enter as the prefill reference (the green band, the prefill density).
Decode starts between step 0 and step 1 (:data:`DECODE_START`). Feature ids are shown
through a ``names`` mapping (``{feature: "f123 · label"}``), so labels appear wherever ids do.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import polars as pl

from trajscope import positions
from trajscope.escaping import html_text
from trajscope.features.labels import feature_name
DECODE_START = 0.5  # between step 0 (prefill) and step 1 (the first decode step)
_VISIBLE = str.maketrans({"\n": "↵", "\t": "→", "\r": "␍"})


def _name(names: Mapping[int, str] | None, f: int) -> str:
    return (names or {}).get(int(f)) or feature_name(f)


def step_rows(features: pl.DataFrame, prompt_len: int) -> pl.DataFrame:
    """The rows of ``features`` (``pos, feature, value``) at each step's query position, with a ``step`` column."""
    return features.filter(pl.col("pos") >= prompt_len - 1).with_columns(positions.query_step_expr(prompt_len))


def top_features_table(features: pl.DataFrame, pos: int, names: Mapping[int, str] | None = None,
                       density: pl.DataFrame | None = None, n: int = 16) -> pl.DataFrame:
    """The active features at ``pos`` (the current step's query), strongest first.

    Returns:
        ``feature`` (id), ``name`` (with label), ``activation`` and, with an index ``density`` table,
        ``prefill density`` / ``decode density`` over the index prompts.
    """
    sub = features.filter(pl.col("pos") == pos).sort("value", descending=True).head(n)
    out = pl.DataFrame({"feature": sub["feature"].cast(pl.Int64),
                        "name": [_name(names, f) for f in sub["feature"]],
                        "activation": sub["value"].cast(pl.Float64)})
    if density is not None:
        d = density.select(pl.col("feature").cast(pl.Int64), pl.col("density_prefill").alias("prefill density"),
                           pl.col("density_decode").alias("decode density"))
        out = out.join(d, on="feature", how="left", maintain_order="left")
    return out


def timeline_data(features: pl.DataFrame, prompt_len: int, names: Mapping[int, str] | None = None,
                  n_features: int = 20) -> dict:
    """Feature × step map of the ``n_features`` features most often active over the steps' queries.

    One rectangle per active (step, feature), the feature's row ``i`` spanning y ∈ [i − 0.5, i + 0.5];
    inactive cells have none.

    Returns:
        ``{"rects": {x0, y0, x1, y1, activation, step, feature}, "rows": [names, first row first],
        "last_step": the largest step shown (at least 1)}``.
    """
    rows = step_rows(features, prompt_len)
    top = rows.group_by("feature").len().sort(["len", "feature"], descending=[True, False]).head(n_features)["feature"]
    order = {int(f): i for i, f in enumerate(top)}
    sub = rows.filter(pl.col("feature").is_in(top.implode()))
    s = sub["step"].to_numpy().astype(float)
    y = np.array([order[int(f)] for f in sub["feature"]], dtype=float)
    rects = {"x0": s - 0.5, "y0": y - 0.5, "x1": s + 0.5, "y1": y + 0.5,
             "activation": sub["value"].cast(pl.Float64).to_numpy(), "step": sub["step"].cast(pl.Int64).to_numpy(),
             "feature": [_name(names, f) for f in sub["feature"]]}
    return {"rects": rects, "rows": [_name(names, f) for f in top], "last_step": int(max(s.max() if len(s) else 0, 1))}


def error_data(rel_err: np.ndarray, prompt_len: int) -> dict:
    """Relative reconstruction error ‖x − x̂‖² ÷ ‖x‖² by step, and the prefill mean and s.d. (prompt positions ≥ 1).

    Args:
        rel_err: ``[n_positions_computed]`` per-position error.
    Returns:
        ``{"step": [n_steps], "error": [n_steps] (at each step's query position), "mean": float, "sd": float}``.
    """
    steps = np.arange(0, len(rel_err) - prompt_len + 1)
    ref = rel_err[1:prompt_len] if prompt_len > 2 else rel_err[:prompt_len]
    return {"step": steps, "error": np.asarray(rel_err)[positions.query_pos(steps, prompt_len)].astype(np.float64),
            "mean": float(ref.mean()), "sd": float(ref.std())}


def display_table(df: pl.DataFrame, digits: int = 3) -> pl.DataFrame:
    """``df`` as text for a table widget: integers as integers, floats with ``digits`` significant digits, nulls blank."""
    def fmt(v) -> str:
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return ""
        if isinstance(v, float):
            return str(int(v)) if v.is_integer() and abs(v) >= 1 else f"{v:.{digits}g}"
        return str(v)

    return pl.DataFrame({c: [fmt(v) for v in df[c].to_list()] for c in df.columns}, schema={c: pl.String for c in df.columns})


def density_text(row: Mapping | None, run: Mapping | None = None) -> str:
    """One Markdown line on a feature's activation density in prefill and in decode (index, and this run)."""
    def pct(a, n):
        return "–" if not n else f"{100 * a / n:.2g}% ({int(a)} of {int(n)})"

    parts = []
    if row is not None:
        parts.append(f"**Density over the index prompts**: prefill {pct(row['active_prefill'], row['n_prefill'])}, "
                     f"decode {pct(row['active_decode'], row['n_decode'])} of positions.")
    else:
        parts.append("This SAE has no feature index (build one with `trajscope sae-index`).")
    if run is not None:
        parts.append(f"**This run**: prefill {pct(run['active_prefill'], run['n_prefill'])}, "
                     f"decode {pct(run['active_decode'], run['n_decode'])}.")
    return " ".join(parts)


def _tok(text: str) -> str:
    return html_text(str(text).translate(_VISIBLE))


def contexts_html(examples: pl.DataFrame) -> str:
    """An HTML table of a feature's top-activating contexts, the activating token highlighted (its spaces as ·,
    so an indentation token shows what it is).

    Args:
        examples: rows of :attr:`trajscope.features.index.FeatureIndex.examples` of one feature.
    """
    if examples.is_empty():
        return "<p>This feature never fired on the index prompts.</p>"
    head = "".join(f"<th>{h}</th>" for h in ("#", "activation", "phase", "step", "prompt", "context"))
    body = []
    for r in examples.iter_rows(named=True):
        ctx = ("".join(_tok(t) for t in r["left"]) + f"<mark title='pos {r['pos']}'>{_tok(r['token']).replace(' ', '·')}</mark>"
               + "<span style='color:#888'>" + "".join(_tok(t) for t in r["right"]) + "</span>")
        body.append(f"<tr><td>{r['rank'] + 1}</td><td>{r['value']:.3g}</td><td>{r['phase']}</td><td>{r['step']}</td>"
                    f"<td>{html_text(str(r['prompt_id']))}</td><td style='white-space:pre;font-family:monospace'>"
                    f"{ctx}</td></tr>")
    return (f"<table class='ts-contexts' style='border-collapse:collapse;font-size:0.85em'><thead><tr>{head}</tr>"
            f"</thead><tbody>{''.join(body)}</tbody></table>")
