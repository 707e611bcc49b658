"""One rule for text shown in a page: what a user, a file, a model or a tokenizer supplies is escaped.

Prompts, tokens, feature labels, paths, run ids, schema versions and error
messages that echo any of them are *text*: wherever trajscope builds HTML (the
app's HTML / Markdown / Str / Alert panes, the comparison and study reports)
they go through one of the two functions here, and only trusted templates are
written as markup around them.

- :func:`html_text` for HTML (element content and quoted attribute values). It
  is also what a Panel ``Str`` pane needs: in Panel 1.9 that pane hands its text
  to the browser as HTML.
- :func:`md_text` for Markdown (Panel's ``Markdown`` and ``Alert`` panes pass raw
  HTML through, and Markdown itself would read ``*``, ``_``, backticks, ``$…$``
  and ``[…](…)`` as formatting): every ASCII punctuation character gets a
  backslash (CommonMark shows it literally), then the result is HTML-escaped.

Bokeh hover tooltips given as ``("name", "@field")`` escape field values
already (only ``{safe}`` would not, and trajscope never writes it); Bokeh text
glyphs, ``Select`` options and the ticker's ``textContent`` are not HTML.
"""

from __future__ import annotations

import html
import re

__all__ = ["html_text", "md_text"]

# CommonMark: any ASCII punctuation may be backslash-escaped; "<", ">", "&", '"' and "'" are left to the
# HTML escape (an entity is shown literally by Markdown, and a backslash before "&" would break it)
_MD_SPECIAL = re.compile(r"""([\\`*_{}\[\]()#+\-.!|~$=:^@%,;?/])""")


def html_text(value: object) -> str:
    """``value`` as HTML text: ``&``, ``<``, ``>``, ``"`` and ``'`` become entities.

    Args:
        value: anything (``str()`` is taken; None gives "").
    Returns:
        Text safe inside an element or a quoted attribute.
    """
    return "" if value is None else html.escape(str(value), quote=True)


def md_text(value: object) -> str:
    """``value`` as Markdown text shown literally: punctuation backslash-escaped, then HTML-escaped.

    Args:
        value: anything (``str()`` is taken; None gives "").
    Returns:
        Text that a Markdown pane (markdown-it, raw HTML allowed) renders as exactly ``value``.
    """
    return "" if value is None else html_text(_MD_SPECIAL.sub(r"\\\1", str(value)))
