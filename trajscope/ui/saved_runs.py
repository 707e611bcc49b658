"""The session's runs directory: every run generated in the app is saved there and listed.

A reload of the page (or a second browser tab) starts a new session with empty
state; the runs directory is what survives it. The operator chooses the
directory with ``TRAJSCOPE_RUNS_DIR`` (default: ``runs/`` under the directory
the app was started from, the same place the CLI's examples write to). Saving
is atomic (:meth:`trajscope.Trajectory.save`), so a listed run is always whole.
No Panel here.
"""

from __future__ import annotations

import json
import os
import pathlib

from trajscope.trajectory import Trajectory

ENV = "TRAJSCOPE_RUNS_DIR"


def runs_dir() -> pathlib.Path:
    """Where the app saves generated runs: ``$TRAJSCOPE_RUNS_DIR`` or ``./runs``."""
    return pathlib.Path(os.environ.get(ENV) or "runs")


def save_run(traj: Trajectory, directory: str | os.PathLike | None = None, float16: bool = True) -> pathlib.Path:
    """Save ``traj`` as ``<directory>/<run_id>``, its tensors in float16 unless ``float16`` is False
    (:func:`trajscope.ui.storage.compact_tensors`; the run on screen keeps its own tensors). Returns the path.

    Raises:
        TrajscopeError: the directory cannot be written (the message names it).
    """
    from trajscope.ui.storage import compact_tensors

    copy = Trajectory(traj.meta, traj.tokens, traj.attention, traj.activations, compact_tensors(traj.tensors, float16),
                      features=traj.features, probe=traj.probe)
    return copy.save(pathlib.Path(directory or runs_dir()) / traj.run_id)


def list_runs(directory: str | os.PathLike | None = None, limit: int = 50) -> dict[str, str]:
    """``{label: path}`` of the saved runs, newest first (at most ``limit``).

    A label reads ``"<directory name> · <model> · <n> steps"`` (the app names a run's directory after its
    run id). The list is every run of the server's runs directory, so it shows no prompt text: one
    session's prompts are not shown to the others (the run opens with its prompt for whoever chooses
    it). Directories without a readable ``meta.json`` are left out (a half-written or foreign directory
    never breaks the list).
    """
    root = pathlib.Path(directory or runs_dir())
    if not root.is_dir():
        return {}
    found = []
    for d in root.iterdir():
        meta = d / "meta.json"
        if d.name.startswith(".") or not meta.is_file():
            continue
        try:
            m = json.loads(meta.read_text())
            found.append((meta.stat().st_mtime, d, m))
        except (OSError, ValueError):
            continue
    out = {}
    for _, d, m in sorted(found, key=lambda t: t[0], reverse=True)[:limit]:
        model = pathlib.PurePath(str((m.get("model") or {}).get("model_id") or "?")).name
        steps = m.get("n_steps", m.get("sampling", {}).get("max_new_tokens", "?"))
        out[f"{d.name} · {model} · {steps} steps"] = str(d)  # directory names are unique; run ids may repeat
    return out
