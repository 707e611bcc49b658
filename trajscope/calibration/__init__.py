"""The decode-regime calibration report: can an SAE, a steering vector or a monitor fitted on prefill be
trusted in decode, for this model?

``trajscope calibrate --model M [--prompts FILE…] [--sae DIR…] [--vector FILE…] [--profile FILE]
[--budget MINUTES] [--quick] --out DIR`` (or :func:`calibrate` from Python) runs the registered studies
that apply to what it was given (:mod:`~trajscope.calibration.plan`), each into its own folder with its
Parquet tables and result marker, resumably and within a budget (:mod:`~trajscope.calibration.runner`),
then writes ``DIR/report.html`` (one offline page: a verdict table, the model and data method, and one
section per question, each drawn by its study from its Result; :mod:`~trajscope.calibration.report`),
``DIR/summary.json`` (the verdicts and every study's summaries) and ``DIR/prompts.jsonl`` (the prompt set
measured). Without artefacts or prompts, the model's shipped ones are used (SmolLM2 ships an SAE pair, a
French CAA vector, a drift profile and chat prompts in eight source files).

Inputs are checked before anything runs (:mod:`~trajscope.calibration.inputs`): an SAE, vector or profile
that does not fit the model, or an empty prompt file, is one sentence.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Any, Callable, Mapping, Sequence

from trajscope.calibration.inputs import Inputs, resolve, write_records
from trajscope.calibration.plan import Job, jobs
from trajscope.calibration.runner import JobState, run_jobs
from trajscope.errors import TrajscopeError


@dataclasses.dataclass
class Calibration:
    """What :func:`calibrate` wrote: the report's path, the summary (verdicts and studies) and each job's state."""

    report: pathlib.Path
    summary: dict[str, Any]
    states: list[JobState]
    inputs: Inputs | None = None

    @property
    def verdicts(self) -> list[dict[str, Any]]:
        """The verdict table's rows."""
        return list(self.summary["verdicts"])


def _with_settings(planned: list[Job], settings: Mapping[str, Mapping[str, Any]]) -> list[Job]:
    from trajscope.studies.registry import studies

    unknown = sorted(set(settings) - set(studies()))
    if unknown:
        raise TrajscopeError(f"--set names the study '{unknown[0]}'; the studies are {', '.join(sorted(studies()))}.")
    out = []
    for job in planned:
        extra = dict(settings.get(job.study, {}))
        runner = {k: extra.pop(k) for k in ("max_prompts", "max_tokens") if k in extra}
        job = dataclasses.replace(job, overrides=tuple(sorted({**dict(job.overrides), **extra}.items())), **runner)
        if not job.missing:  # a bad setting is one sentence before anything runs
            fields = {f.name for f in dataclasses.fields(studies()[job.study].config)}
            bad = sorted(set(extra) - fields)
            if bad:
                raise TrajscopeError(f"The {job.study} study has no setting '{bad[0]}'; its settings are "
                                     f"{', '.join(sorted(fields))}.")
            job.config()
        out.append(job)
    return out


def calibrate(model: str | Any = "smollm2", out: str | pathlib.Path = "calibration", prompts: Sequence[str] = (),
              saes: Sequence[str] = (), vectors: Sequence[str] = (), profile: str | None = None,
              budget_minutes: float | None = None, quick: bool = False,
              settings: Mapping[str, Mapping[str, Any]] | None = None, threads: int | None = None,
              only: Sequence[str] = (), on_state: Callable[[JobState], None] | None = None) -> Calibration:
    """Run the calibration report for ``model`` into ``out`` (module docstring).

    Args:
        model: a model name or directory (``"smollm2"``, ``"sample"``…), or a loaded model handle.
        out: the output folder (created; a second call resumes what is finished there).
        prompts: JSON-lines prompt files (default: the model's shipped evaluation prompts).
        saes, vectors, profile: the artefacts to calibrate (default: the model's shipped ones).
        budget_minutes: no study starts after this many minutes (None: no budget).
        quick: each study on its ``quick`` settings (a few minutes in all on SmolLM2 on a 2-core CPU).
        settings: per-study config overrides, ``{"steering": {"depths": (1, 8)}}`` (also ``max_prompts``,
            ``max_tokens``).
        threads: CPU threads for the studies (default: torch's).
        only: run only these studies (default: every study that applies).
        on_state: called with each study's :class:`~trajscope.calibration.runner.JobState` as it ends.
    Returns:
        A :class:`Calibration`.
    """
    from trajscope.model.load import load_model

    handle = load_model(model) if isinstance(model, (str, pathlib.Path)) else model
    name = str(model) if isinstance(model, (str, pathlib.Path)) else handle.model_id
    inputs = resolve(handle, prompts, saes, vectors, profile, model_name=name)
    if budget_minutes is not None and budget_minutes <= 0:
        raise TrajscopeError(f"--budget must be a positive number of minutes, not {budget_minutes:g}.")
    planned = jobs(inputs, quick=quick)
    if only:
        known = {j.study for j in planned}
        unknown = sorted(set(only) - known)
        if unknown:
            raise TrajscopeError(f"--only names '{unknown[0]}'; the report's studies are {', '.join(sorted(known))}.")
        planned = [j for j in planned if j.study in set(only)]
    planned = _with_settings(planned, settings or {})
    folder = pathlib.Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrajscopeError(f"Cannot create the output folder '{folder}': {exc.strerror or exc}.") from exc
    write_records(inputs, folder)

    def say(state: JobState) -> None:
        print(f"{state.job.key}: {state.state}" + (f" ({state.why})" if state.why else "")
              + (f" in {state.seconds:.0f} s" if state.state == "done" else ""), file=sys.stderr)
        if on_state is not None:
            on_state(state)

    states = run_jobs(handle, inputs, planned, folder, None if budget_minutes is None else budget_minutes * 60,
                      threads=threads, on_state=say)
    from trajscope.calibration import report

    path, summary = report.write(folder, inputs, model_facts(handle), states, quick)
    return Calibration(report=path, summary=summary, states=states, inputs=inputs)


def model_facts(handle: Any) -> dict[str, Any]:
    """What section 1 says of the model: id, layers, width, dtype, device and attention implementation."""
    hf = getattr(handle, "model", None)
    cfg = getattr(hf, "config", None)
    return {"model": handle.model_id, "layers": handle.n_layers, "width": handle.d_model,
            "dtype": str(getattr(handle, "dtype", getattr(hf, "dtype", ""))).replace("torch.", ""),
            "device": str(getattr(handle, "device", "")),
            "attention": str(getattr(cfg, "_attn_implementation", "") or "default")}


__all__ = ["calibrate", "Calibration", "Inputs", "resolve"]
