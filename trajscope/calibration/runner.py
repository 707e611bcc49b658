"""Run the calibration report's studies within a budget, resumably.

Each :class:`~trajscope.calibration.plan.Job` writes its study's Result into its own folder under the output
(``studies/<study>[-<artefact>]/``). The Result's marker (``<study>.result.json``) is written last, so a
folder with a marker whose config holds the job's settings (every setting the job gives a value) is a
finished study: a second call (after a kill, or to
extend a report) skips it and reruns only what has no marker, starting that folder afresh. A study that
fails is recorded with its one sentence and the others go on. With a budget, a study that would start after
the budget is spent is not run and the report says so.

``calibration.json`` in the output records every job's state (done, resumed, failed, missing, over budget)
and its wall time; it is rewritten after each job, so it tells how far a killed run got.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import sys
import time
from typing import Any, Callable, Sequence

from trajscope.calibration.inputs import Inputs
from trajscope.calibration.plan import Job, study_of
from trajscope.errors import TrajscopeError, first_sentence
from trajscope.studies.registry import Result, marker_name

STATUS_FILE = "calibration.json"


@dataclasses.dataclass
class JobState:
    """What happened to one job: ``state`` is done, resumed, failed, missing or budget; ``why`` its sentence."""

    job: Job
    state: str
    why: str = ""
    seconds: float = 0.0

    def record(self) -> dict[str, Any]:
        """A JSON-ready record (for ``calibration.json``)."""
        return {"key": self.job.key, "study": self.job.study, "section": self.job.section,
                "folder": self.job.folder, "state": self.state, "why": self.why, "seconds": round(self.seconds, 2)}


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def finished(job: Job, out: pathlib.Path) -> bool:
    """Whether ``job``'s folder holds its study's Result for the same config (module docstring)."""
    marker = out / job.folder / marker_name(job.study)
    if not marker.is_file():
        return False
    try:
        stored = json.loads(marker.read_text(encoding="utf-8")).get("config")
    except (OSError, ValueError, AttributeError):
        return False
    if not isinstance(stored, dict):
        return False
    stored = _normal(stored)  # a study may record more than its config (a resolved layer, the vector's name)
    return all(v is None or stored.get(k) == v for k, v in _normal(dataclasses.asdict(job.config())).items())


def select_prompts(records: Sequence[dict], most: int | None) -> list[dict]:
    """At most ``most`` records, taken round-robin over their source files (file order kept)."""
    from trajscope.studies.monitor.config import file_of

    if most is None or most >= len(records):
        return list(records)
    by_file: dict[str, list[dict]] = {}
    for r in records:
        by_file.setdefault(file_of(r["id"]), []).append(r)
    queues, out = list(by_file.values()), []
    while len(out) < most:
        for q in queues:
            if q and len(out) < most:
                out.append(q.pop(0))
    return sorted(out, key=lambda r: list(records).index(r))


def job_prompts(model: Any, inputs: Inputs, job: Job, config: Any) -> list[Any] | None:
    """The ``(id, token ids)`` prompts ``job`` runs on, or None for a study that reads its own input: at most
    ``job.max_prompts`` (round-robin over files), from unseen files only for a held-out job, with the
    config's header and the job's token cut. A study that reads its own input but takes the report's prompts
    (``"prompts"`` in ``Study.uses``) gets records ``{"id", "prompt": token ids, "segments"}`` instead, each
    position's chat segment (token ids rendered from a chat prompt carry no turns of their own)."""
    from trajscope.studies.prompts import encode_prompts, study_items

    study = study_of(job)
    own = bool(getattr(study.config, "OWN_INPUT", None))
    if own and "prompts" not in study.uses:
        return None
    pool = inputs.unseen(inputs.records) if job.held_out else list(inputs.records)
    if not pool:
        raise TrajscopeError("every prompt comes from a file the artefacts were fitted on; give prompts from other "
                             "files")
    items, cut = study_items(model, select_prompts(pool, job.max_prompts), config, job.max_tokens)
    pairs = encode_prompts(model, items, cut)
    if not own:
        return pairs
    return [{"id": i, "prompt": ids, "segments": _segments(model, it, len(ids))} for it, (i, ids) in zip(items, pairs)]


def _segments(model: Any, item: dict, n: int) -> list[str]:
    """The chat segments of the first ``n`` positions of ``item`` as :func:`encode_prompts` tokenises it."""
    from trajscope import positions
    from trajscope.chat import encode_chat

    if "messages" in item:
        return list(encode_chat(model.tokenizer, item["messages"]).segments[:n])
    return [positions.PLAIN_PROMPT_SEGMENT] * n


def _progress(desc: str) -> tuple[Callable[[int, int], None], Callable[[], None]]:
    from tqdm.auto import tqdm

    bar = tqdm(desc=desc, unit="item", file=sys.stderr, disable=None, leave=True)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return update, bar.close


def run_jobs(model: Any, inputs: Inputs, jobs: Sequence[Job], out: pathlib.Path, budget_s: float | None = None,
             threads: int | None = None, on_state: Callable[[JobState], None] | None = None) -> list[JobState]:
    """Run every job not already finished in ``out``; returns each job's state (module docstring)."""
    start = time.perf_counter()
    states: list[JobState] = []
    for job in jobs:
        if job.missing:
            state = JobState(job, "missing", f"needs a {job.missing}, none given or shipped for this model")
        elif finished(job, out):
            state = JobState(job, "resumed", "finished in an earlier call")
        elif budget_s is not None and time.perf_counter() - start > budget_s:
            state = JobState(job, "budget", f"the budget of {budget_s / 60:g} minutes was spent before it started")
        else:
            state = _run_one(model, inputs, job, out, threads)
        states.append(state)
        _write_status(out, inputs, states, jobs)
        if on_state:
            on_state(state)
    return states


def _run_one(model: Any, inputs: Inputs, job: Job, out: pathlib.Path, threads: int | None) -> JobState:
    study = study_of(job)
    folder = out / job.folder
    t0 = time.perf_counter()
    try:
        config = job.config()
        prompts = job_prompts(model, inputs, job, config)
        if folder.exists():
            shutil.rmtree(folder)  # an unfinished study starts afresh
        update, close = _progress(job.key)
        try:
            with model.numerics(threads=threads):
                result: Result = study.run(model, prompts, config, progress=update)
        finally:
            close()
        result.save(folder, family=study.family)
    except TrajscopeError as exc:
        return JobState(job, "failed", str(exc), time.perf_counter() - t0)
    except Exception as exc:  # a study's own failure: recorded, the report goes on
        import traceback

        traceback.print_exc(file=sys.stderr)
        return JobState(job, "failed", f"{type(exc).__name__}: {first_sentence(exc, 200)}", time.perf_counter() - t0)
    return JobState(job, "done", "", time.perf_counter() - t0)


def _write_status(out: pathlib.Path, inputs: Inputs, states: Sequence[JobState], jobs: Sequence[Job]) -> None:
    from trajscope.io import atomic_write_text

    done = {s.job.key for s in states}
    records = [s.record() for s in states] + [{"key": j.key, "study": j.study, "section": j.section,
                                               "folder": j.folder, "state": "pending"} for j in jobs if j.key not in done]
    atomic_write_text(out / STATUS_FILE, json.dumps({"inputs": inputs.describe(), "jobs": records}, indent=1))
