"""Helpers shared by the browser tests (tests/ui/test_*_browser.py): what they ask the page and type in it."""

from __future__ import annotations

# every plot title on the page, as BokehJS holds it
TITLES = """() => Bokeh.documents.flatMap(d => [...d.all_models])
    .filter(m => m.title && m.title.text !== undefined).map(m => m.title.text)"""


def set_field(page, label: str, value, key: str = "Enter") -> None:
    """Type ``value`` into the field labelled ``label`` and press ``key`` (the change reaches the server)."""
    box = page.get_by_label(label, exact=True)
    box.fill(str(value))
    box.press(key)
