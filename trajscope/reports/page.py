"""The page every trajscope report is written into: one HTML shell, BokehJS inline.

:data:`PAGE` is the shell (title, inline resources, a short note on the step vocabulary, the body
and the figures' script); :func:`bokeh_js` is BokehJS itself as inline ``<script>`` tags, so a
report opens offline with a double click: no script, stylesheet or font is fetched. The
comparison report (:mod:`trajscope.reports.comparison`) and the study report
(:mod:`trajscope.reports.studies`) both use them.
"""

from __future__ import annotations

import pathlib


def bokeh_js() -> str:
    """BokehJS itself, inline (no extension bundles).

    ``bokeh.resources.INLINE`` is patched by Panel once Panel is imported in the same process, and
    then carries Panel's extensions, which fetch from a CDN: a report written by the app (or after
    any Panel import) would not open offline. The report's figures need BokehJS only.
    """
    from bokeh.util.paths import bokehjs_path

    js = pathlib.Path(bokehjs_path()) / "js"
    return "\n".join(f"<script type=\"text/javascript\">\n{(js / f'{name}.min.js').read_text(encoding='utf-8')}\n</script>"
                     for name in ("bokeh", "bokeh-gl", "bokeh-widgets", "bokeh-tables"))


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
{resources}
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1200px; }}
table {{ border-collapse: collapse; font-size: 12px; }} td, th {{ border: 1px solid #ddd; padding: 2px 6px; }}
td.diff {{ background: #fde2e2; }} .scroll {{ max-height: 420px; overflow: auto; margin-bottom: 8px; }}
.note {{ color: #555; font-size: 13px; }} h2 {{ border-bottom: 2px solid #1f77b4; padding-bottom: 2px; }}
</style></head>
<body><h1>{title}</h1>
<p class="note">Step 0 is the prefill pass; step s ≥ 1 is the s-th decode pass (query at position P + s − 1).
Written by trajscope; opens offline.</p>
{body}
{script}
</body></html>
"""
