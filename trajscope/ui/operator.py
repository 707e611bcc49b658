"""What the operator of a served app allows, and the checks that enforce it on what browsers type.

``panel serve apps/trajscope.py`` is how a team shares trajscope: the person who
starts the server decides what its users can reach; the browser user never can.
The operator's settings (command line after ``--args``, or environment
variables of the same meaning):

=====================  ===========================  =========================================
option                 environment variable         default
=====================  ===========================  =========================================
``--data-dir DIR``     ``TRAJSCOPE_DATA_DIRS``      ``sample_data/`` and the runs directory
``--models A,B``       ``TRAJSCOPE_MODELS``         the installed short names (``sample``, ``smollm2``)
``--max-new-tokens N`` ``TRAJSCOPE_MAX_NEW_TOKENS`` 1000
``--max-models N``     ``TRAJSCOPE_MAX_MODELS``     2 (loaded models kept, least recently used out)
``--max-generations``  ``TRAJSCOPE_MAX_GENERATIONS`` 1 (generations at once; the rest queue, in order)
``--max-sessions N``   ``TRAJSCOPE_MAX_SESSIONS``   20 (open pages; more get a "server is full" page)
``--max-prompt-chars``  ``TRAJSCOPE_MAX_PROMPT_CHARS`` 5000 (characters of a typed prompt)
``--capture-threads``  ``TRAJSCOPE_CAPTURE_THREADS`` every core PyTorch uses (CPU threads per capture)
=====================  ===========================  =========================================

(``TRAJSCOPE_DATA_DIRS`` separates directories with ``os.pathsep``.) Every path
typed in the browser — a run directory, an SAE, a drift profile, contrast pairs,
a run to compare with — must resolve, after symlinks and ``..``, inside one of
the data directories, else it is refused with one sentence and nothing is read.
Models come from the operator's list (plus the one the app was started with,
which the operator chose). Remote code is never trusted from the browser.

Every limit the page shows is checked here, on the server, before the work it
bounds: the prompt's length before it is tokenised (:meth:`ServeConfig.prompt`),
max new tokens, and generations at once — Generate, Steer and every depth sweep
take a slot of the same queue (:data:`trajscope.ui.runner.QUEUE`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import threading

from trajscope.errors import TrajscopeError
from trajscope.safe_paths import check_path_text


# the whole-number settings (ServeConfig fields, their defaults there): each is --field-name or TRAJSCOPE_FIELD_NAME
WHOLE_SETTINGS = ("max_new_tokens", "max_models", "max_generations", "max_sessions", "max_prompt_chars",
                  "capture_threads")


def _whole(given, env, name: str, default):
    """One whole-number setting: the option when given (not 0), else its environment variable, else ``default``;
    at least 1, except that ``capture_threads`` 0 or unset is None (every core).

    Raises:
        TrajscopeError: the variable is set and is not a whole number (one sentence naming it and its value).
    """
    value = given
    if not value:
        var = "TRAJSCOPE_" + name.upper()
        text = env.get(var, "").strip()
        try:
            value = int(text) if text else default
        except ValueError:
            raise TrajscopeError(f"{var} must be a whole number, not {text!r}.") from None
    if default is None and not value:
        return None
    return max(1, value)


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """The operator's limits (see the module docstring)."""

    data_dirs: tuple[pathlib.Path, ...]
    models: tuple[str, ...] = ("sample",)
    max_new_tokens: int = 1000
    max_models: int = 2
    max_generations: int = 1
    max_sessions: int = 20
    max_prompt_chars: int = 5000
    capture_threads: int | None = None  # None: every core PyTorch uses (trajscope.ui.openmp.capture_threads)

    @classmethod
    def from_args(cls, argv: list[str] | None = None, env: dict | None = None) -> "ServeConfig":
        """From ``--args`` of ``panel serve`` (``argv``) over environment variables over the defaults.

        Raises:
            TrajscopeError: an unknown option or a value that is not a number where one is needed.
        """
        from trajscope.model import available_models, sample_data_dir
        from trajscope.ui.saved_runs import runs_dir

        env = os.environ if env is None else env
        ap = argparse.ArgumentParser(prog="panel serve apps/trajscope.py --args", add_help=False)
        ap.add_argument("--data-dir", action="append", default=None)
        ap.add_argument("--models", default=None)
        whole_options = ["--" + name.replace("_", "-") for name in WHOLE_SETTINGS]
        for option in whole_options:
            ap.add_argument(option, type=int, default=None)
        try:
            args = ap.parse_args(argv or [])
        except SystemExit:
            options = ", ".join(["--data-dir", "--models", *whole_options])
            raise TrajscopeError(f"Unknown server options {argv}; the options are {options}.") from None
        dirs = args.data_dir or [d for d in env.get("TRAJSCOPE_DATA_DIRS", "").split(os.pathsep) if d]
        dirs = dirs or [str(sample_data_dir()), str(runs_dir())]
        models = args.models or env.get("TRAJSCOPE_MODELS") or ",".join(available_models()) or "sample"
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        whole = {name: _whole(getattr(args, name), env, name, defaults[name]) for name in WHOLE_SETTINGS}
        return cls(data_dirs=tuple(pathlib.Path(d).expanduser().resolve() for d in dirs),
                   models=tuple(m.strip() for m in models.split(",") if m.strip()), **whole)

    def path(self, text: str, what: str) -> pathlib.Path:
        """``text`` resolved (symlinks, ``..``) if it lies inside a data directory.

        Raises:
            TrajscopeError: empty, or outside every data directory (the sentence names them).
        """
        if not str(text).strip():
            raise TrajscopeError(f"Type the path of the {what}.")
        p = pathlib.Path(check_path_text(str(text).strip(), what)).expanduser()
        try:
            resolved = p.resolve() if p.is_absolute() else (pathlib.Path.cwd() / p).resolve()
        except (OSError, ValueError, RuntimeError) as exc:  # a link loop, a part too long for this file system
            raise TrajscopeError(f"The {what} path cannot be resolved ({getattr(exc, 'strerror', None) or exc}).") from None
        if any(resolved == d or d in resolved.parents for d in self.data_dirs):
            return resolved
        allowed = ", ".join(str(d) for d in self.data_dirs)
        raise TrajscopeError(f"'{text}' is outside the directories this server reads ({allowed}); the operator "
                             "can add one with --data-dir.")

    def model(self, source: str, trusted: tuple[str, ...] = ()) -> str:
        """``source`` if the operator allows it (their list, or ``trusted``: the app's own start-up model).

        Raises:
            TrajscopeError: a model not on the list (the sentence names the list).
        """
        if source in self.models or source in trusted:
            return source
        names = ", ".join(dict.fromkeys((*self.models, *trusted)))
        raise TrajscopeError(f"Model '{source}' is not on this server's list ({names}); the operator adds models "
                             "with --models.")

    def prompt(self, text: str) -> str:
        """``text`` if it is within the prompt length cap (checked before anything tokenises it).

        Raises:
            TrajscopeError: longer than ``max_prompt_chars``.
        """
        if len(text) > self.max_prompt_chars:
            raise TrajscopeError(f"The prompt is capped at {self.max_prompt_chars:,} characters on this server "
                                 f"(it has {len(text):,}).")
        return text

    def default_model(self) -> str:
        """The model a new page opens on: SmolLM2 when the operator's list has it, else the list's first."""
        from trajscope.model.load import SMOLLM2

        return SMOLLM2 if SMOLLM2 in self.models else self.models[0]

    def new_tokens(self, n: int) -> int:
        """``n`` if within the cap.

        Raises:
            TrajscopeError: above the operator's ``max_new_tokens``.
        """
        if n > self.max_new_tokens:
            raise TrajscopeError(f"Max new tokens is capped at {self.max_new_tokens} on this server (asked: {n}).")
        return n


class SessionCount:
    """Open sessions of this process, against the operator's ``max_sessions``."""

    def __init__(self):
        self._n, self._lock = 0, threading.Lock()

    @property
    def open(self) -> int:
        return self._n

    def enter(self) -> bool:
        """Count a new session if there is room; False when the server is full."""
        with self._lock:
            if self._n >= config().max_sessions:
                return False
            self._n += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._n = max(0, self._n - 1)


SESSIONS = SessionCount()
_CONFIG: ServeConfig | None = None
_CONFIG_LOCK = threading.Lock()


def config() -> ServeConfig:
    """The process's :class:`ServeConfig` (from the environment, until :func:`configure` sets another).

    A config set by :func:`configure` while this call was still reading the environment wins: the lazy
    read never overwrites an explicit one.
    """
    global _CONFIG
    found = _CONFIG
    if found is None:
        read = ServeConfig.from_args()
        with _CONFIG_LOCK:
            if _CONFIG is None:
                _CONFIG = read
            found = _CONFIG
    return found


def configure(cfg: ServeConfig | None) -> None:
    """Set the process's config (``apps/trajscope.py`` does, from ``--args``); None: back to the environment."""
    global _CONFIG
    _CONFIG = cfg
