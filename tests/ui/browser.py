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


def serve_app(page, make_page, timeout: int = 90_000):
    """Serve ``make_page()`` (a ``default_page(...)`` template) to ``page``; return the session's TrajScope
    once the page shows its Generate button."""
    from panel.tests.util import serve_component, wait_until

    apps = []

    def make():
        tpl = make_page()
        apps.append(tpl._trajscope)
        return tpl

    serve_component(page, make)
    page.locator(".ts-generate").wait_for(timeout=timeout)
    wait_until(lambda: len(apps) == 1, page, timeout=timeout)
    return apps[0]


def open_card(page, app, title: str, timeout: int = 30_000) -> None:
    """Click the tab ``title`` of the served ``app`` and wait until the server has it active."""
    from panel.tests.util import wait_until

    page.locator(".bk-tab", has_text=title).first.click()
    index = [t for t, _ in app._cards].index(title)
    wait_until(lambda: app.tabs.active == index, page, timeout=timeout)
