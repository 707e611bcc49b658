"""The study registry: every study has one shape, and every surface iterates the registry.

A study answers one question about a model. It is one :class:`Study`:

- ``config``: a frozen dataclass whose fields carry their help text
  (``field(default=…, metadata={"help": …})``); ``trajscope study NAME`` generates its flags
  from it (:mod:`trajscope.studies.flags`), beside the shared ``--model/--prompts/--out…``
  flags defined once;
- ``run(model, prompts, config, progress) -> Result``: Polars tables and summaries. The
  :class:`Result` is the only home of the study's numbers;
- ``section(result) -> (title, html, figures)``: its part of a report, reading the Result only;
- ``card(state) -> viewable`` (optional): an app tab, titled ``title`` (default: the name) and placed
  by ``order`` (lower first) among the registered cards, after the core cards and before Export;
- ``uses`` (optional): which config field takes each artefact a user can hand the calibration report
  (``{"sae": "saes", "vector": "vector", "profile": "profile"}``; ``"prompts"`` marks a study that reads
  its own input by default but runs on the report's prompts, as records ``{"id", "prompt": token ids,
  "segments"}``; ``"seen_files"`` takes every source file the artefacts were fitted on,
  ``"seen_prompt_files"`` those among the report's prompts when some prompts come from other files: see
  :mod:`trajscope.calibration.plan`), and ``quick``: config overrides for
  ``trajscope calibrate --quick`` (a pass of about a minute on SmolLM2 on a 2-core CPU).

:func:`register` adds a study; :func:`studies` lists them after importing every study package
under ``trajscope/studies/`` (a package registers itself when imported), so adding a study edits
no list. The CLI (``trajscope study``), the study report (``trajscope study-report``) and the
app's tabs all iterate :func:`studies`.

A Result on disk is its tables as ``<table>.parquet`` (trajscope's schema metadata) beside a
marker ``<study>.result.json`` (study, config, summaries). Several studies may share one
folder. Study tables are named ``<study>`` or ``<study>_<part>``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pathlib
import pkgutil
from typing import Any, Callable, Mapping

import polars as pl

from trajscope.errors import TrajscopeError

Section = tuple[str, str, list]


@dataclasses.dataclass
class Result:
    """A study's outcome: its tables by name, its config and its summaries.

    Attributes:
        study: the study's registered name.
        tables: ``name -> DataFrame``, filled lazily for a Result read from disk.
        config: the config the study ran with (``dataclasses.asdict``).
        summaries: named headline numbers, each a dict (``value``, ``lo``, ``hi``, ``n``…).
    """

    study: str
    tables: dict[str, pl.DataFrame] = dataclasses.field(default_factory=dict)
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    summaries: dict[str, Any] = dataclasses.field(default_factory=dict)
    _dir: pathlib.Path | None = dataclasses.field(default=None, repr=False)

    def table(self, name: str) -> pl.DataFrame:
        """The table ``name``; one sentence when the study did not write it or it is unreadable."""
        if name not in self.tables:
            f = self._file(name)
            try:
                self.tables[name] = pl.read_parquet(f)
            except Exception as exc:  # polars raises several types for a damaged file
                raise TrajscopeError(f"The table '{f}' is unreadable ({str(exc).splitlines()[0][:80]}).") from exc
        return self.tables[name]

    def scan(self, name: str) -> pl.LazyFrame:
        """The table ``name`` as a lazy frame (read from disk only for the columns asked)."""
        if name in self.tables:
            return self.tables[name].lazy()
        return pl.scan_parquet(self._file(name))

    def _file(self, name: str) -> pathlib.Path:
        f = (self._dir or pathlib.Path(".")) / f"{name}.parquet"
        if self._dir is None or not f.is_file():
            raise TrajscopeError(f"The {self.study} study has no table '{name}'; rerun the study that writes it.")
        return f

    def save(self, out: str | pathlib.Path, family: str = "") -> list[pathlib.Path]:
        """Write every table and the marker into ``out``; returns the paths written (marker last).

        Each table's schema metadata names it ``<family>_<table>`` (``family`` empty: ``<table>``).
        """
        from trajscope.studies.common import write_table
        from trajscope.io import atomic_write_text

        d = pathlib.Path(out)
        paths = [write_table(df, d / f"{name}.parquet", f"{family}_{name}" if family else name) for name, df in self.tables.items()]
        marker = d / marker_name(self.study)
        atomic_write_text(marker, json.dumps({"study": self.study, "config": self.config,
                                              "summaries": self.summaries, "tables": sorted(self.tables)},
                                             indent=1, default=str))
        return [*paths, marker]

    @classmethod
    def load(cls, folder: str | pathlib.Path, study: str) -> "Result":
        """The Result of ``study`` in ``folder`` (tables read when asked for)."""
        d = pathlib.Path(folder)
        info: dict[str, Any] = {}
        marker = d / marker_name(study)
        if marker.is_file():
            try:
                info = json.loads(marker.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise TrajscopeError(f"'{marker}' is not a readable study marker ({exc}).") from exc
            if not isinstance(info, dict):
                raise TrajscopeError(f"'{marker}' holds no study marker object.")
        return cls(study=study, config=dict(info.get("config") or {}), summaries=dict(info.get("summaries") or {}),
                   _dir=d)


@dataclasses.dataclass(frozen=True)
class Study:
    """One registered study (see the module docstring for each part's contract)."""

    name: str
    question: str
    config: type
    run: Callable[..., Result]
    section: Callable[[Result], Section]
    example: str
    card: Callable[[Any], Any] | None = None
    marker: str | None = None  # a table whose presence marks the study in folders without a .result.json
    shared_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # e.g. {"max_prompts": 96}
    family: str = ""  # prefix of the tables' schema names ("serving": serving_<table>)
    title: str = ""  # the app tab's title (default: the name, capitalised)
    order: int = 100  # the app tab's place among registered cards (lower first; ties by name)
    uses: Mapping[str, str] = dataclasses.field(default_factory=dict)  # artefact kind -> config field
    quick: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # config overrides for calibrate --quick

    @property
    def tab_title(self) -> str:
        """The app tab's title."""
        return self.title or self.name.replace("-", " ").capitalize()

    def holds(self, folder: str | pathlib.Path) -> bool:
        """Whether ``folder`` holds this study's output."""
        d = pathlib.Path(folder)
        return (d / marker_name(self.name)).is_file() or (d / (self.marker or f"{self.name}_summary.parquet")).is_file()


_REGISTRY: dict[str, Study] = {}


def marker_name(study: str) -> str:
    """The file that marks ``study``'s Result in a folder."""
    return f"{study}.result.json"


def register(study: Study) -> Study:
    """Add ``study`` to the registry (a second study of the same name replaces the first); returns it."""
    if not dataclasses.is_dataclass(study.config) or not study.config.__dataclass_params__.frozen:
        raise TypeError(f"study {study.name!r}: config must be a frozen dataclass")
    _REGISTRY[study.name] = study
    return study


def unregister(name: str) -> None:
    """Remove a study (tests register toy studies and take them out again)."""
    _REGISTRY.pop(name, None)


_DISCOVERED = False


def studies() -> dict[str, Study]:
    """Every registered study by name, after importing each study package under ``trajscope/studies/``."""
    global _DISCOVERED
    if not _DISCOVERED:  # by path and name: the package (which re-exports this module) is not imported here
        for info in pkgutil.iter_modules([str(pathlib.Path(__file__).parent)]):
            if info.ispkg:
                importlib.import_module(f"{__package__}.{info.name}")
        _DISCOVERED = True
    return dict(_REGISTRY)


def cards() -> list[Study]:
    """The registered studies that have an app card, in tab order (``order``, then name)."""
    return sorted((s for s in studies().values() if s.card is not None), key=lambda s: (s.order, s.name))


def get(name: str) -> Study:
    """The study ``name``; one sentence naming the known studies when there is none."""
    found = studies()
    if name not in found:
        raise TrajscopeError(f"Unknown study '{name}'; choose one of {', '.join(sorted(found))}.")
    return found[name]
