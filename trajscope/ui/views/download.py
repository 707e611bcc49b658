"""A download button whose callback may refuse: it returns None and has said why on the page.

Panel's ``FileDownload`` sends whatever its callback returns and raises on None (``Cannot transfer
unknown object of type NoneType``), which puts a traceback in the server's log for each refused
download (no run yet, a compare directory outside the server's data directories, no calibration
report written), although the page has given the one sentence that says what to change.
:class:`Download` sends nothing for None; the next press calls the callback again.
"""

from __future__ import annotations

import panel as pn


class Download(pn.widgets.FileDownload):
    """``FileDownload`` whose callback returns None to send nothing (after saying why on the page)."""

    def _sync_data(self, fileobj):
        if fileobj is None:
            return
        super()._sync_data(fileobj)


__all__ = ["Download"]
