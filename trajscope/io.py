"""Files on disk: written whole or not at all, and run directories found under a folder.

Atomic writes (one helper of each kind; every writer in trajscope uses them):

- :func:`atomic_file` yields a temporary path in the target's folder; on success
  the file is ``os.replace``-d onto the target (mode 0644), on any error the
  temporary file is removed and the target is untouched.
  :func:`atomic_write_text` is the text-file case.
- :func:`atomic_dir` yields a temporary folder beside the target
  (``.<name>.XXXX``); on success the folder gets ordinary permissions (umask)
  and is renamed onto the target (an existing target is moved aside first and
  removed after), on any error the temporary folder is removed. A reader sees
  the old folder or the new one, never a mix.

Finding runs (:func:`find_runs`): a directory is a run when it holds
``meta.json``; any other directory is searched below, recursively, so
``runs/`` written by ``capture --prompts … --out runs/code`` (a folder of run
folders) names every run in it. Hidden folders (the temporaries above) are
skipped.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
from typing import Iterable, Iterator

from trajscope.errors import TrajscopeError

RUN_MARKER = "meta.json"


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[pathlib.Path]:
    """Write ``path`` through a temporary file in the same folder, then ``os.replace`` it into place.

    Yields:
        The temporary path to write (it exists, empty). Raises whatever the body or the rename raises,
        after removing the temporary file.
    """
    path = pathlib.Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    tmp = pathlib.Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_file`)."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[pathlib.Path]:
    """Build a folder at a temporary name beside ``path``, then rename it onto ``path``.

    The temporary folder is named by :func:`trajscope.leftovers.temp_prefix` (its owner's pid and
    host), and leftovers of interrupted saves in the same folder are removed first
    (:func:`trajscope.leftovers.clean`).

    Yields:
        The temporary folder to fill. On success it replaces ``path`` (an existing ``path`` is moved
        aside, then removed); on any error it is removed and ``path`` is untouched. ``OSError`` from
        creating or renaming propagates.
    """
    from trajscope import leftovers

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    leftovers.clean(path.parent)  # what interrupted saves left beside it, when no live process owns it
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=leftovers.temp_prefix(path.name), dir=path.parent))
    try:
        yield tmp
        old = None
        if path.exists():
            old = path.with_name(leftovers.aside_name(path.name))
            path.rename(old)
        honour_umask(tmp)
        try:
            tmp.rename(path)
        except BaseException:
            if old is not None:
                old.rename(path)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def honour_umask(directory: pathlib.Path) -> None:
    """Give a finished folder and the files in it the permissions of ordinary new ones (mkdtemp makes 0700)."""
    mask = os.umask(0)
    os.umask(mask)
    directory.chmod(0o777 & ~mask)
    for f in directory.rglob("*"):
        f.chmod((0o777 if f.is_dir() else 0o666) & ~mask)


def is_run_dir(path: pathlib.Path) -> bool:
    """True when ``path`` is a directory holding ``meta.json``."""
    return (path / RUN_MARKER).is_file()


def find_runs(paths: Iterable[str | os.PathLike]) -> list[pathlib.Path]:
    """The run directories that ``paths`` name, in order: each run as given, each other folder searched below.

    Args:
        paths: run directories, or folders that hold run directories at any depth.
    Returns:
        Run directories (each holds ``meta.json``); runs under one folder in sorted path order, no duplicates.
    Raises:
        TrajscopeError: a path that does not exist, is a file, or holds no run directory.
    """
    out: list[pathlib.Path] = []
    seen: set[pathlib.Path] = set()
    for p in map(pathlib.Path, paths):
        if is_run_dir(p):
            found = [p]
        elif p.is_dir():
            found = sorted(pathlib.Path(root) for root, _, files in _walk(p) if RUN_MARKER in files)
            if not found:
                raise TrajscopeError(f"'{p}' is not a trajscope run directory and holds none: no meta.json in it "
                                     "or below it.")
        elif p.exists():
            raise TrajscopeError(f"'{p}' is a file, not a trajscope run directory.")
        else:
            raise TrajscopeError(f"'{p}' does not exist.")
        for f in found:
            if f.resolve() not in seen:
                seen.add(f.resolve())
                out.append(f)
    return out


def _walk(top: pathlib.Path):
    """``os.walk`` that does not descend into runs or hidden folders."""
    for root, dirs, files in os.walk(top):
        dirs[:] = [] if RUN_MARKER in files else sorted(d for d in dirs if not d.startswith("."))
        yield root, dirs, files
