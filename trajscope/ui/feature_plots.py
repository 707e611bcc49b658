"""Plot and table builders of the SAE card: frames and arrays in, HoloViews elements, frames or HTML out.

Pure functions (no Panel, no app state), as :mod:`trajscope.ui.plots`. The x axis
of every step-indexed plot here is the *step*, as in the telemetry view: step 0
is the prefill pass, drawn with the value at its last query (``pos = P − 1``),
and decode step s ≥ 1 with the value at its query ``pos = P + s − 1``
(:func:`trajscope.positions.query_pos`); all prompt positions together enter as
the prefill reference (the green band, the prefill density). Decode starts
between step 0 and step 1: the dashed line at x = 0.5. The step cursor is not
drawn here; the view adds it as a Bokeh annotation that moves in place
(:mod:`trajscope.ui.views._cursor`). Feature ids are shown through a ``names``
mapping (``{feature: "f123 · label"}``), so labels appear wherever ids do.
"""

from __future__ import annotations

from typing import Mapping

import holoviews as hv
import numpy as np
import polars as pl
from bokeh.models import HoverTool

from trajscope import positions
from trajscope.escaping import html_text
from trajscope.features.labels import feature_name
from trajscope.ui.plots import PREFILL_COLOR

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


def timeline_plot(features: pl.DataFrame, prompt_len: int, names: Mapping[int, str] | None = None,
                  n_features: int = 20) -> hv.Overlay:
    """Feature × step map of the ``n_features`` features most often active over the steps' queries.

    One rectangle per active (step, feature); inactive cells stay blank (no hover). The dashed line
    marks where decode starts.
    """
    rows = step_rows(features, prompt_len)
    top = rows.group_by("feature").len().sort(["len", "feature"], descending=[True, False]).head(n_features)["feature"]
    order = {int(f): i for i, f in enumerate(top)}
    sub = rows.filter(pl.col("feature").is_in(top.implode()))
    s = sub["step"].to_numpy().astype(float)
    y = np.array([order[int(f)] for f in sub["feature"]], dtype=float)
    data = {"x0": s - 0.5, "y0": y - 0.5, "x1": s + 0.5, "y1": y + 0.5, "activation": sub["value"].to_numpy(),
            "step": sub["step"].to_numpy(), "feature": [_name(names, f) for f in sub["feature"]]}
    hover = HoverTool(tooltips=[("step", "@step"), ("feature", "@feature"), ("activation", "@activation{0.00}")])
    rects = hv.Rectangles(data, ["x0", "y0", "x1", "y1"], ["activation", "step", "feature"]).opts(
        color="activation", cmap="viridis", colorbar=True, clabel="activation", line_alpha=0, tools=[hover],
        default_tools=["pan", "wheel_zoom", "box_zoom", "reset", "save"])
    n = max(1, len(top))
    edge = hv.VLine(DECODE_START).opts(color=PREFILL_COLOR, line_dash="dashed", line_width=2)
    return (rects * edge).opts(
        responsive=True, height=max(260, 22 * n + 90), xlabel="step (0 = prefill)", ylabel="feature",
        yticks=[(i, _name(names, f)) for i, f in enumerate(top)], ylim=(n - 0.5, -0.5), show_legend=False,
        xlim=(-0.5, float(max(s.max() if len(s) else 0, 1)) + 0.5), shared_axes=False,
        title=f"Feature timeline — the {len(top)} features most often active (dashed: decode starts)")


def error_plot(rel_err: np.ndarray, prompt_len: int) -> hv.Overlay:
    """Relative reconstruction error ‖x − x̂‖² ÷ ‖x‖² by step, with the prefill mean ± s.d. (prompt positions ≥ 1).

    Args:
        rel_err: ``[n_positions_computed]`` per-position error.
    """
    steps = np.arange(0, len(rel_err) - prompt_len + 1)
    y = rel_err[positions.query_pos(steps, prompt_len)]
    ref = rel_err[1:prompt_len] if prompt_len > 2 else rel_err[:prompt_len]
    m, s = float(ref.mean()), float(ref.std())
    band = hv.HSpan(m - s, m + s).opts(color="#2ca02c", alpha=0.15)
    hover = HoverTool(tooltips=[("step", "@step"), ("relative error", "@{relative error}{0.000}")], mode="vline")
    curve = hv.Curve((steps, y), "step", "relative error").opts(color="#1f77b4", tools=[hover])
    return (band * hv.HLine(m).opts(color="#2ca02c", line_dash="dashed") * curve
            * hv.VLine(DECODE_START).opts(color=PREFILL_COLOR, line_dash="dashed")).opts(
        responsive=True, height=260, ylabel="‖x − x̂‖² ÷ ‖x‖²", xlabel="step (0 = prefill)", shared_axes=False,
        title="SAE reconstruction error by step (green: prefill mean ± s.d.; dashed: decode starts)")


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


def no_data(message: str) -> hv.Text:
    """An empty plot carrying ``message``."""
    return hv.Text(0, 0, message).opts(responsive=True, height=120, xaxis=None, yaxis=None, toolbar=None)
