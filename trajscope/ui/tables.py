"""Small tables in the views as plain HTML.

The page shows its tables (prefill vs decode of the SAE card, the steering sweep's summary) as
HTML, not as Tabulator widgets: a Tabulator needs Panel's ``tabulator`` extension loaded before
the page is served (without it the tab holding one stays blank), and one kept Chromium's tab at
100% CPU after a new run. Numbers are formatted by :func:`trajscope.ui.feature_plots.display_table`
(integers as integers, floats with a few significant digits).
"""

from __future__ import annotations


import panel as pn
import polars as pl

from trajscope.escaping import html_text
from trajscope.ui.feature_plots import display_table

STYLE = (":host table{border-collapse:collapse;font-size:0.85em}"
         ":host td,:host th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}"
         ":host th{background:#f4f4f4;white-space:nowrap}")  # wide tables scroll sideways, headers stay one line


def frame_html(df: pl.DataFrame, digits: int = 3) -> str:
    """``df`` (any columns, rows in order) as an HTML ``<table>``, every cell escaped."""
    shown = display_table(df, digits)
    head = "".join(f"<th>{html_text(c)}</th>" for c in shown.columns)
    rows = "".join("<tr>" + "".join(f"<td>{html_text(v)}</td>" for v in row) + "</tr>" for row in shown.iter_rows())
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def table_pane(df: pl.DataFrame, digits: int = 3, css_class: str = "ts-table") -> pn.pane.HTML:
    """:func:`frame_html` in a pane that fits the card's width (scrolls sideways when wider).

    The pane's height is set from the rows (one header line, about 26 px a row, room for a scroll
    bar): a table added to a card after it was laid out (the depth sweep's summary) was cut off at
    the height the card had before.
    """
    return pn.pane.HTML(frame_html(df, digits), sizing_mode="stretch_width", css_classes=[css_class],
                        stylesheets=[STYLE], styles={"overflow-x": "auto"}, height=48 + 26 * len(df))
