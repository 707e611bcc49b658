"""Paths out of data: a name read from a file, or typed in a page, is never a path until it is made one here.

A run's ``run_id`` comes from its ``meta.json``, which anybody can edit; used as
a directory or archive entry name as is, ``../../x`` or ``/etc`` would write (or
delete) outside the folder meant. Three rules, one function each:

- :func:`safe_name`: any text → one harmless path segment (letters, digits,
  ``.``, ``_``, ``-``; no leading dot, at most :data:`MAX_NAME` characters).
  Archive entries and directory names built from data use it.
- :func:`check_path_text`: a typed path with a NUL byte or longer than the
  system allows gets one sentence instead of a traceback.
- :func:`inside`: a file of a run directory (perhaps a symlink) is opened only if
  it resolves inside that directory.
"""

from __future__ import annotations

import os
import pathlib
import re

from trajscope.errors import TrajscopeError

__all__ = ["MAX_NAME", "MAX_PATH", "check_path_text", "inside", "safe_name"]

MAX_NAME = 100  # characters of a name made from data (file systems allow 255 bytes)
MAX_PATH = 4096  # characters of a typed path (Linux PATH_MAX)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: object, default: str = "run") -> str:
    """``text`` as a single path segment that cannot climb, hide or be absolute.

    Args:
        text: a run id or any name read from data.
        default: what an empty result becomes.
    Returns:
        e.g. ``"../../x"`` → ``"x"``, ``"/etc/passwd"`` → ``"etc_passwd"``, ``"20261124-a1"`` unchanged.
    """
    name = _UNSAFE.sub("_", str(text)).lstrip("._-")[:MAX_NAME].rstrip(".")
    name = re.sub(r"\.{2,}", ".", name)
    return name or default


def check_path_text(text: str, what: str) -> str:
    """``text`` unchanged if it can be a path at all.

    Raises:
        TrajscopeError: a NUL byte, or longer than :data:`MAX_PATH` characters (or a part longer than 255 bytes).
    """
    if "\0" in text:
        raise TrajscopeError(f"The {what} path contains a NUL byte; type it again without it.")
    if len(text) > MAX_PATH or any(len(part.encode("utf-8", "replace")) > 255 for part in re.split(r"[\\/]", text)):
        raise TrajscopeError(f"The {what} path is too long ({len(text):,} characters); paths have at most "
                             f"{MAX_PATH:,} characters and 255 per part.")
    return text


def inside(path: str | os.PathLike, root: str | os.PathLike) -> pathlib.Path:
    """``path`` if it resolves (symlinks followed) inside ``root``.

    Raises:
        TrajscopeError: it leads out of ``root`` (a symlink out of a run directory, or ``..``).
    """
    p, r = pathlib.Path(path), pathlib.Path(root).resolve()
    resolved = p.resolve()
    if resolved != r and r not in resolved.parents:
        raise TrajscopeError(f"'{p}' leads outside '{root}' (a link or '..'); trajscope does not follow it.")
    return resolved
