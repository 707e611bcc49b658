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

from trajscope.safe_paths import safe_name
from trajscope.trajectory import SCHEMA_VERSION, Trajectory

ENV = "TRAJSCOPE_RUNS_DIR"


def runs_dir() -> pathlib.Path:
    """Where the app saves generated runs: ``$TRAJSCOPE_RUNS_DIR`` or ``./runs``."""
    return pathlib.Path(os.environ.get(ENV) or "runs")


def save_run(traj: Trajectory, directory: str | os.PathLike | None = None, float16: bool = True) -> pathlib.Path:
    """Save ``traj`` as ``<directory>/<run id>`` (the id made a safe name: it never climbs out), its tensors in
    float16 unless ``float16`` is False (:func:`trajscope.ui.storage.compact_tensors`; the run on screen keeps
    its own tensors). Returns the path.

    Raises:
        TrajscopeError: the directory cannot be written (the message names it).
    """
    from trajscope.ui.storage import compact_tensors

    copy = Trajectory(traj.meta, traj.tokens, traj.attention, traj.activations, compact_tensors(traj.tensors, float16),
                      features=traj.features, probe=traj.probe)
    return copy.save(pathlib.Path(directory or runs_dir()) / safe_name(traj.run_id))


def list_runs(directory: str | os.PathLike | None = None, limit: int = 50) -> dict[str, str]:
    """``{label: path}`` of the saved runs, newest first (at most ``limit``).

    A label reads ``"<directory name> · <model> · <n> steps"`` (the app names a run's directory after its
    run id). The list is every run of the server's runs directory, so it shows no prompt text: one
    session's prompts are not shown to the others (the run opens with its prompt for whoever chooses
    it). A directory whose ``meta.json`` cannot be read as a run's settings is listed too, as
    ``"<directory name> · not readable: <reason>"``: one bad file never breaks the list (or the page),
    and choosing it shows the full sentence. Hidden entries (``.NAME.xxxx`` temporary directories of a
    save in progress or interrupted, see :mod:`trajscope.leftovers`) are never listed.
    """
    root = pathlib.Path(directory or runs_dir())
    try:
        entries = list(root.iterdir()) if root.is_dir() else []
    except OSError:
        return {}
    found = []
    for d in entries:
        meta = d / "meta.json"
        try:
            if d.name.startswith(".") or not meta.is_file():
                continue
            found.append((meta.stat().st_mtime, d, run_label(d)))
        except OSError:
            continue
    return {label: str(d) for _, d, label in sorted(found, key=lambda t: t[0], reverse=True)[:limit]}


def run_label(d: pathlib.Path) -> str:
    """How the saved-runs list names run directory ``d``; a bad ``meta.json`` gets its one-sentence reason."""
    try:
        m = json.loads((d / "meta.json").read_text(encoding="utf-8"))
    except OSError as exc:
        return f"{d.name} · not readable: meta.json cannot be read ({exc.strerror or exc})."
    except ValueError:  # JSON or UTF-8
        return f"{d.name} · not readable: meta.json is not valid JSON."
    if not isinstance(m, dict):
        kind = {list: "list", str: "string", bool: "true/false", type(None): "null"}.get(type(m), "number")
        return f"{d.name} · not readable: meta.json holds a JSON {kind}, not a run's settings."
    model_meta = m.get("model") if isinstance(m.get("model"), dict) else {}
    model = pathlib.PurePath(str(model_meta.get("model_id") or "?")).name[:40]
    sampling = m.get("sampling") if isinstance(m.get("sampling"), dict) else {}
    steps = str(m.get("n_steps", sampling.get("max_new_tokens", "?")))[:12]
    version = m.get("schema_version")
    old = "" if version in (None, SCHEMA_VERSION) else f" · schema {str(version)[:12]}"
    return f"{d.name} · {model} · {steps} steps{old}"  # directory names are unique; run ids may repeat
