"""Export view: download a table (Parquet or CSV) or the whole run directory (zip)."""

from __future__ import annotations

import io

import panel as pn
import param

from trajscope.trajectory import TABLES
from trajscope.ui.export import FORMATS, run_zip_bytes, table_bytes
from trajscope.ui.views._base import StateView


class ExportView(StateView):
    """Table and format selectors with a download button, and a zip download of the run."""

    table = param.Selector(default="tokens", objects=list(TABLES), doc="Which table to download.")
    fmt = param.Selector(default="parquet", objects=list(FORMATS), doc="File format of the table download.")

    def _filename(self) -> str:
        run = self.state.trajectory.run_id if self.state.trajectory is not None else "run"
        return f"{run}-{self.table}.{self.fmt}"

    def _table(self):
        if self.state.trajectory is None:
            self.state.report("There is no run to export yet.")
            return None
        return io.BytesIO(table_bytes(self.state.trajectory, self.table, self.fmt))

    def _zip(self):
        if self.state.trajectory is None:
            self.state.report("There is no run to export yet.")
            return None
        return io.BytesIO(run_zip_bytes(self.state.trajectory))

    def __panel__(self):
        table = pn.widgets.Select.from_param(self.param.table, name="Table", width=130)
        fmt = pn.widgets.RadioButtonGroup.from_param(self.param.fmt, name="Format", width=150)
        down = pn.widgets.FileDownload(callback=self._table, filename=self._filename(), label="Download table",
                                       color="primary", width=280, css_classes=["ts-download-table"])
        zipd = pn.widgets.FileDownload(callback=self._zip, filename="run.zip", label="Download run (zip)", width=280,
                                       css_classes=["ts-download-zip"])

        def rename(*_):
            down.filename = self._filename()
            zipd.filename = (self.state.trajectory.run_id if self.state.trajectory is not None else "run") + ".zip"

        self.param.watch(rename, ["table", "fmt"])
        self.state.param.watch(rename, ["revision"])
        rename()
        return pn.Column(pn.Row(table, fmt), down, zipd)
