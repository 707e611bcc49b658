"""Resumable stages: each finished stage leaves a marker and is skipped on the next run.

A stage is a name and a function ``fn(ctx, directory)`` that writes its outputs
into ``OUT/<name>/``. The runner clears a stage directory that has no marker
(a stage killed half-way leaves nothing that a later stage could read), runs the
stage, then writes ``OUT/<name>/DONE.json`` (wall seconds, finish time) last.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import time
from typing import Any, Callable, Sequence

MARKER = "DONE.json"


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step of the build: ``fn(ctx, directory)`` writes its files into ``directory``."""

    name: str
    fn: Callable[[Any, pathlib.Path], dict | None]
    doc: str = ""


def is_done(out: pathlib.Path, name: str) -> bool:
    """Whether stage ``name`` finished in ``out`` (its marker exists)."""
    return (pathlib.Path(out) / name / MARKER).is_file()


def run_stages(out: str | pathlib.Path, stages: Sequence[Stage], ctx: Any,
               log: Callable[[str], None] = print) -> dict[str, str]:
    """Run each unfinished stage in order; returns ``{name: "skipped" | "ran"}``."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    status = {}
    for stage in stages:
        d = out / stage.name
        if is_done(out, stage.name):
            log(f"[{stage.name}] done earlier, skipped")
            status[stage.name] = "skipped"
            continue
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        log(f"[{stage.name}] {stage.doc}")
        t0 = time.perf_counter()
        extra = stage.fn(ctx, d) or {}
        wall = time.perf_counter() - t0
        (d / MARKER).write_text(json.dumps({"stage": stage.name, "wall_s": round(wall, 1),
                                            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                            **extra}, indent=1), encoding="utf-8")
        log(f"[{stage.name}] finished in {wall:.0f} s")
        status[stage.name] = "ran"
    return status
