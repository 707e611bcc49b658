"""Logging: where trajscope's log goes, and the id that ties a sentence on a page to a traceback.

Every module logs through ``logging.getLogger(__name__)`` (the ``trajscope`` hierarchy). A user
sees one sentence; the log keeps the traceback. :func:`error_id` is the short id both carry, so
an operator can find the traceback of what a browser showed. :func:`log_to_file` sends the
``trajscope`` loggers to a file as well (the served app calls it): ``$TRAJSCOPE_LOG`` or
``$TRAJSCOPE_CACHE/logs/app.log`` (default ``~/.cache/trajscope/logs/app.log``).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import pathlib
import uuid

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def error_id() -> str:
    """A short id that ties the sentence a browser or terminal shows to the log's traceback."""
    return uuid.uuid4().hex[:8]


def default_log_file() -> pathlib.Path:
    """``$TRAJSCOPE_LOG``, else ``$TRAJSCOPE_CACHE/logs/app.log`` (cache default ``~/.cache/trajscope``)."""
    if os.environ.get("TRAJSCOPE_LOG"):
        return pathlib.Path(os.environ["TRAJSCOPE_LOG"]).expanduser()
    cache = pathlib.Path(os.environ.get("TRAJSCOPE_CACHE") or "~/.cache/trajscope").expanduser()
    return cache / "logs" / "app.log"


def log_to_file(path: str | os.PathLike | None = None, level: int = logging.INFO) -> pathlib.Path | None:
    """Add a rotating file handler (5 MB × 3) for the ``trajscope`` loggers; returns its path.

    Calling it again with the same path adds nothing. When the file cannot be opened, the
    log stays on stderr and a warning says why (the app still serves); returns None then.
    """
    target = pathlib.Path(path).expanduser() if path else default_log_file()
    logger = logging.getLogger("trajscope")
    for h in logger.handlers:
        if isinstance(h, logging.FileHandler) and pathlib.Path(h.baseFilename) == target.resolve():
            return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(target, maxBytes=5_000_000, backupCount=3, encoding="utf-8")
    except OSError as exc:
        logger.warning("cannot write the log file %s (%s); logging to stderr only", target, exc.strerror or exc)
        return None
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)
    return target


def failure_sentence(what: str, exc: BaseException, log: logging.Logger) -> str:
    """Log ``exc`` with its traceback under a new error id; return the one sentence a user sees."""
    err = error_id()
    log.error("%s failed [error %s]", what, err, exc_info=(type(exc), exc, exc.__traceback__))
    from trajscope.errors import first_sentence

    return f"{what} failed: {type(exc).__name__}: {first_sentence(exc, 200)} (error {err}; the log has the details)."
