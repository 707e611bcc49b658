"""Export view: download a table (Parquet or CSV), the whole run directory (zip), a comparison report, or the
model's decode-regime calibration report (:mod:`trajscope.ui.views.calibration`)."""

from __future__ import annotations

import io

import panel as pn
import param

from trajscope.trajectory import TABLES
from trajscope.errors import TrajscopeError
from trajscope.safe_paths import safe_name
from trajscope.ui.export import FORMATS, report_bytes, run_zip_bytes, table_bytes
from trajscope.ui.views._base import StateView
from trajscope.ui.views.download import Download


class ExportView(StateView):
    """Table and format selectors with a download button, and a zip download of the run."""

    table = param.Selector(default="tokens", objects=list(TABLES), doc="Which table to download.")
    fmt = param.Selector(default="parquet", objects=list(FORMATS), doc="File format of the table download.")
    compare_with = param.String(default="", doc="A second run directory to compare with in the report (optional).")

    def _filename(self) -> str:
        run = safe_name(self.state.trajectory.run_id) if self.state.trajectory is not None else "run"
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

    def _report(self):
        if self.state.trajectory is None:
            self.state.report("There is no run to report on yet.")
            return None
        try:
            from trajscope.ui.operator import config

            other = str(config().path(self.compare_with, "run to compare with")) if self.compare_with.strip() else ""
            return io.BytesIO(report_bytes(self.state.trajectory, other))
        except TrajscopeError as exc:
            self.state.report(str(exc))
            return None

    def __panel__(self):
        table = pn.widgets.Select.from_param(self.param.table, name="Table", width=130)
        fmt = pn.widgets.RadioButtonGroup.from_param(self.param.fmt, name="Format", width=150)
        down = Download(callback=self._table, filename=self._filename(), label="Download table",
                        color="primary", width=280, css_classes=["ts-download-table"])
        zipd = Download(callback=self._zip, filename="run.zip", label="Download run (zip)", width=280,
                        css_classes=["ts-download-zip"])

        def rename(*_):
            down.filename = self._filename()
            zipd.filename = (safe_name(self.state.trajectory.run_id) if self.state.trajectory is not None else "run") + ".zip"

        other = pn.widgets.TextInput.from_param(self.param.compare_with, name="Compare with run directory (optional)",
                                                placeholder="runs/other", width=280)
        report = Download(callback=self._report, filename="trajscope-report.html", width=280,
                          label="Download comparison report (HTML)", css_classes=["ts-download-report"])
        self.param.watch(rename, ["table", "fmt"])
        self.state.param.watch(rename, ["revision"])
        rename()
        from trajscope.ui.views.calibration import CalibrationPanel

        self.calibration = CalibrationPanel(state=self.state)
        return pn.Row(pn.Column(pn.Row(table, fmt), down, zipd, other, report), pn.Spacer(width=24), self.calibration)
