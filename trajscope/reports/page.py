"""The page every trajscope report is written into: one HTML shell, BokehJS inline, the same bytes
whatever the process imported.

:data:`PAGE` is the shell (title, inline resources, a short note on the step vocabulary, the body
and the figures' script); :func:`bokeh_js` is BokehJS itself as inline ``<script>`` tags, so a
report opens offline with a double click: no script, stylesheet or font is fetched.

A page is drawn apart from Panel: once Panel is imported it patches Bokeh (``INLINE`` resources,
the ``_ONLOAD`` wrapper of a page's figure script, the custom-model definitions added to every
document's JSON, the id counter). :func:`components` draws figures with Bokeh's own wrapper and
:func:`render` fills the shell, leaves the process's custom-model definitions out
(:func:`drop_defs`) and renumbers Bokeh's ids in order of appearance (:func:`canonical_ids`), so
the same figures give the same bytes in any process. The comparison report
(:mod:`trajscope.reports.comparison`), the study report (:mod:`trajscope.reports.studies`) and the
calibration report (:mod:`trajscope.calibration.report`) all draw through them.
"""

from __future__ import annotations

import pathlib
import re


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


def render(title: str, body: str, script: str = "", resources: str | None = None) -> str:
    """The page: :data:`PAGE` filled (``resources`` default: :func:`bokeh_js`), the custom-model definitions
    left out and the ids renumbered (module docstring). ``title`` is escaped here; ``body`` is HTML."""
    from trajscope.escaping import html_text

    page = PAGE.format(resources=bokeh_js() if resources is None else resources, script=script, body=body,
                       title=html_text(title))
    return canonical_ids(drop_defs(page))


def _bokeh_onload() -> str:
    """Bokeh's own wrapper of a page's figure script, read from its source (Panel replaces the module's
    ``_ONLOAD`` when it is imported, which would make the page depend on the process's imports)."""
    import ast

    import bokeh.embed.wrappers as wrappers

    tree = ast.parse(pathlib.Path(wrappers.__file__).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_ONLOAD" for t in node.targets):
            return ast.literal_eval(node.value)
    return wrappers._ONLOAD


def components(figs: list) -> tuple[str, list]:
    """Bokeh's ``components(figs)`` drawn with Bokeh's own script wrapper (see :func:`_bokeh_onload`).

    Returns:
        ``(script, divs)``: one ``<script>`` for all figures and one ``<div>`` per figure, in order;
        ``("", [])`` for no figures.
    """
    import bokeh.embed.wrappers as wrappers
    from bokeh.embed import components as bokeh_components

    if not figs:
        return "", []
    was = wrappers._ONLOAD
    wrappers._ONLOAD = _bokeh_onload()
    try:
        return bokeh_components(figs)
    finally:
        wrappers._ONLOAD = was


def drop_defs(html: str) -> str:
    """The page without the ``"defs"`` entries Bokeh adds to each document for the custom models registered in
    the process (Panel's, once Panel is imported): the reports' figures use none, and with them the bytes would
    depend on what else the process had imported."""
    out, i, key = [], 0, ',"defs":['
    while (j := html.find(key, i)) >= 0:
        out.append(html[i:j])
        k, depth, in_str = j + len(key), 1, False
        while depth and k < len(html):
            c = html[k]
            if in_str:
                if c == "\\":
                    k += 1
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c == "[":
                depth += 1
            elif c == "]":
                depth -= 1
            k += 1
        i = k
    out.append(html[i:])
    return "".join(out)


_BOKEH_ID = re.compile(r"(?<=[\"'])p\d{4,}(?=\\?[\"'])|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def canonical_ids(html: str) -> str:
    """Bokeh's model ids (``p1234``) and document ids (UUIDs) renumbered in order of appearance.

    A quoted ``p1234`` is renamed only when the page defines it as a model id (``"id":"p1234"`` or
    ``data-root-id``), so a data string of that shape (a token's text in a figure's data) is left as it is.
    """
    models = set(re.findall(r'(?:\\?"id\\?":\\?"|data-root-id=["\'])(p\d{4,})', html))
    seen: dict[str, dict[str, str]] = {"p": {}, "uuid": {}}

    def sub(m: re.Match) -> str:
        key = m.group(0)
        if key.startswith("p") and key not in models:
            return key
        kind = seen["p" if key.startswith("p") else "uuid"]
        if key not in kind:
            kind[key] = f"p{len(kind) + 1001}" if key.startswith("p") else f"00000000-0000-4000-8000-{len(kind):012d}"
        return kind[key]

    return _BOKEH_ID.sub(sub, html)
