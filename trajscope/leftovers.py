"""Leftovers of interrupted saves: the hidden temporary directories a killed save leaves in a runs folder.

:meth:`trajscope.Trajectory.save` writes a run into a hidden sibling directory
and renames it into place, so a visible run directory is always whole. A save
killed half-way (``kill -9`` of the CLI or the server) leaves that hidden
directory behind, with partial Parquet files. The names say who made them:

- ``.NAME.tmp-<pid>@<host>-<random>``: a run being written by process ``pid``
  on machine ``host``;
- ``.NAME.old-<pid>@<host>``: the previous run of that name, moved aside by
  that process while the new one is renamed in;
- ``.NAME.<8 random characters>``: the same, from trajscope before the pid was
  in the name (only recognised when it holds nothing but run files).

:func:`clean` runs at the start of every save into a folder and removes those
that no running process can own: made on this machine by a pid that is not
alive, or older than :data:`MAX_AGE_S` (a pid can be reused, and a folder
shared over the network holds other machines' saves, whose pids mean nothing
here), or, without a pid, older than :data:`LEGACY_AGE_S`. The running process's own entries are left alone
unless that old (another thread may be saving). :func:`is_temporary` is how the
saved-runs list, reports and exports recognise them, to never show or read one.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import shutil
import socket
import time

__all__ = ["LEGACY_AGE_S", "MAX_AGE_S", "aside_name", "clean", "is_temporary", "temp_prefix"]

log = logging.getLogger(__name__)

MAX_AGE_S = 3600.0  # no save takes an hour: older entries are leftovers even if their pid is alive again
LEGACY_AGE_S = 600.0  # entries without a pid: ten minutes
_PID = re.compile(r"^\..+\.(?:tmp|old)-(\d+)(?:@([A-Za-z0-9_.]+))?(?:-[^/]*)?$")
_LEGACY = re.compile(r"^\..+\.[a-z0-9_]{8}$")
_RUN_FILES = re.compile(r"^(meta\.json|[a-z_]+\.parquet|tensors\.safetensors)$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"


def temp_prefix(name: str) -> str:
    """The ``tempfile.mkdtemp`` prefix of a save of run directory ``name`` by this process."""
    return f".{name}.tmp-{os.getpid()}@{_host()}-"


def aside_name(name: str) -> str:
    """Where a save by this process moves the previous run directory ``name`` while it renames the new one in."""
    return f".{name}.old-{os.getpid()}@{_host()}"


def _owner(name: str) -> tuple[int, str | None] | None:
    """``(pid, host)`` of a save's temporary directory name (host None in names without one); else None."""
    m = _PID.match(name)
    return None if m is None else (int(m.group(1)), m.group(2))


def _is_legacy(path: pathlib.Path) -> bool:
    if not _LEGACY.match(path.name) or not path.is_dir() or path.is_symlink():
        return False
    try:
        return all(_RUN_FILES.match(f.name) and f.is_file() for f in path.iterdir())
    except OSError:
        return False


def is_temporary(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a save's temporary directory (in progress or left over), not a run."""
    p = pathlib.Path(path)
    return _owner(p.name) is not None or _is_legacy(p)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def clean(directory: str | os.PathLike, now: float | None = None) -> list[pathlib.Path]:
    """Remove the leftovers of interrupted saves in ``directory`` (see the module docstring).

    Never raises: a folder that cannot be listed or an entry that cannot be removed is left as it is.

    Returns:
        The directories removed.
    """
    now = time.time() if now is None else now
    removed = []
    try:
        entries = [p for p in pathlib.Path(directory).iterdir() if p.name.startswith(".")]
    except OSError:
        return removed
    for p in entries:
        try:
            if p.is_symlink() or not p.is_dir():
                continue
            age = now - p.stat().st_mtime
            owner = _owner(p.name)
            if owner is not None:
                pid, host = owner
                here = host in (None, _host())
                stale = age > MAX_AGE_S or (here and pid != os.getpid() and not _alive(pid))
            else:
                stale = _is_legacy(p) and age > LEGACY_AGE_S
            if stale:
                shutil.rmtree(p)
                removed.append(p)
                log.info("removed %s, left by an interrupted save", p)
        except OSError:
            continue
    return removed
