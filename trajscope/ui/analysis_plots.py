"""Colour and axis helpers shared by the study cards' plots (Drift, Steering, …).

The cards' own plot builders live in their study packages (``trajscope/studies/<name>/plots.py``);
what they share is here: the layer palette, the step axis label, the Bokeh figures' toolbar and side
legend, layer ticks that stay legible for 30+ layers and a robust colour range. All are pure except
:func:`side_legend`, which adds a legend to the figure it is given.
"""

from __future__ import annotations

import numpy as np

LAYER_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf")


STEP_AXIS = "step (≤ 0: prompt positions, all read at step 0)"
FIGURE_TOOLS = "pan,wheel_zoom,box_zoom,reset,save"  # the cards' Bokeh figures' toolbar


def side_legend(fig, items: list[tuple[str, list]]):
    """A click-to-hide legend of ``(label, renderers)`` items, added to the right of the Bokeh figure ``fig``."""
    from bokeh.models import Legend, LegendItem

    legend = Legend(items=[LegendItem(label=label, renderers=r) for label, r in items], click_policy="hide",
                    label_text_font_size="8pt")
    fig.add_layout(legend, "right")
    return legend


def layer_ticks(layers: list[int], max_ticks: int = 16) -> list[int]:
    """Every layer when few, else every k-th (labels of 30+ layers would overlap), always the last."""
    if len(layers) <= max_ticks:
        return list(layers)
    k = -(-(len(layers) - 1) // (max_ticks - 1))  # the ticks of every k-th layer plus the last fit max_ticks
    return sorted({*layers[::k], layers[-1]})


def robust_clim(values: np.ndarray, centre: float | None = None, q: float = 99.0) -> tuple[float, float]:
    """A colour range from the ``q``-th percentile, so a few extreme cells do not turn the rest one colour.

    With ``centre``, the range is symmetric around it (``centre ± percentile of |v − centre|``);
    NaNs are ignored; an empty or constant input gives a unit-wide range.
    """
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if centre is not None:
        dev = float(np.percentile(np.abs(v - centre), q)) if v.size else 1.0
        dev = dev if dev > 0 else 1.0
        return centre - dev, centre + dev
    if not v.size:
        return 0.0, 1.0
    lo, hi = float(np.percentile(v, 100 - q)), float(np.percentile(v, q))
    return (lo, hi) if hi > lo else (lo, lo + 1.0)
