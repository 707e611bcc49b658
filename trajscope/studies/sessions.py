"""Agent sessions for the compaction study: ``<sys> <T1> <T2> <summary> <T3>``.

A *session* is what an agent's context looks like right after it was compacted
(Memento-style): a system segment, two turns ``T1`` and ``T2`` that the summary
replaces, the summary, and the turn ``T3`` that follows it. A serving stack can
either *mask* T1 and T2 for everything after the summary (keeping the KV states
of the summary, which were computed while T1/T2 were visible) or *restart* from
``<sys> <summary>`` and recompute; :mod:`trajscope.studies.compaction` compares
the two against the full context.

Segments are tokenized one at a time and concatenated (``sys`` with the
tokenizer's special tokens, the others without), which is how turns are
appended in a serving stack and makes every segment's span of positions exact.

Sessions come from a JSON-lines file (:func:`read_sessions`: one object per
line with the string keys ``sys``, ``t1``, ``t2``, ``summary``, ``t3``, and
optionally ``id``, ``fact`` and an integer ``label`` for the probe) or from
:func:`synthetic_sessions`, code-shaped sessions for the shipped sample model (a
small model trained on the Python standard library): a random 4-digit number is
assigned to a name in T1 only, the summary names the function but omits the
number, and T3 stops exactly where the number would be written again
(``assert <name>_id ==``). The probe's label is the number's first digit.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import random
import re
from typing import Any, Sequence

from trajscope.errors import TrajscopeError

SEGMENTS = ("sys", "t1", "t2", "summary", "t3")

_NAMES = ("user", "order", "client", "session", "account", "invoice", "ticket", "device", "batch", "job",
          "record", "node", "report", "profile", "tenant", "channel", "worker", "upload", "task", "cart",
          "event", "member", "project", "payment", "request", "group", "host", "item", "stream", "token")
_T2 = (
    "def load_config(path):\n    with open(path) as f:\n        return f.read()\n",
    "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n    return parser.parse_args(argv)\n",
    "def join_paths(base, name):\n    return os.path.join(base, name)\n",
    "class Cache:\n    def __init__(self):\n        self.data = {}\n",
    "def read_lines(filename):\n    with open(filename) as f:\n        return f.readlines()\n",
)
_T3 = ("assert {name}_id ==", "if {name}_id ==", "    {name}_id =", "print({name}_id, {name}_id ==")


@dataclasses.dataclass(frozen=True)
class Session:
    """One compacted session: the five segments as text, an id, and (optionally) the masked fact.

    Attributes:
        session_id: a unique name (line number for files without ``id``).
        sys, t1, t2, summary, t3: the segments, in context order.
        fact: the text of the fact that appears only in T1 (for tables and reading), or None.
        label: an integer class the probe reads from T3's states (e.g. the fact's first digit), or None.
    """

    session_id: str
    sys: str
    t1: str
    t2: str
    summary: str
    t3: str
    fact: str | None = None
    label: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-lines form (``id`` plus the segment keys, ``fact`` and ``label``)."""
        d = dataclasses.asdict(self)
        d["id"] = d.pop("session_id")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], default_id: str = "0") -> "Session":
        """A session from its JSON-lines form; a missing or non-string segment is one clear error."""
        missing = [k for k in SEGMENTS if not isinstance(d.get(k), str) or not d[k]]
        if missing:
            raise TrajscopeError(f"Session '{d.get('id', default_id)}' is missing the segment(s) "
                                 f"{', '.join(missing)}; every session needs non-empty strings for "
                                 f"{', '.join(SEGMENTS)}.")
        label = d.get("label")
        if label is not None and (isinstance(label, bool) or not isinstance(label, int)):
            raise TrajscopeError(f"Session '{d.get('id', default_id)}': 'label' must be a whole number, not {label!r}.")
        return cls(str(d.get("id", default_id)), *(d[k] for k in SEGMENTS), fact=d.get("fact"), label=label)


def read_sessions(path: str | pathlib.Path) -> list[Session]:
    """Sessions from a JSON-lines file, one JSON object per line (see the module docstring).

    Raises:
        TrajscopeError: no such file, invalid JSON, a line that is not an object, a missing segment,
            duplicate ids, or no sessions at all.
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise TrajscopeError(f"No sessions file at '{path}'.")
    out: list[Session] = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrajscopeError(f"{path}, line {n}: not valid JSON ({exc.msg}).") from exc
        if not isinstance(item, dict):
            raise TrajscopeError(f"{path}, line {n}: expected a JSON object with the keys {', '.join(SEGMENTS)}.")
        out.append(Session.from_dict(item, default_id=str(n)))
    if not out:
        raise TrajscopeError(f"The sessions file '{path}' holds no sessions.")
    ids = [s.session_id for s in out]
    if len(set(ids)) != len(ids):
        raise TrajscopeError(f"The sessions file '{path}' repeats a session id; give every line a unique 'id'.")
    return out


def write_sessions(sessions: Sequence[Session], path: str | pathlib.Path) -> pathlib.Path:
    """Write sessions as JSON lines (the format :func:`read_sessions` reads)."""
    path = pathlib.Path(path)
    path.write_text("".join(json.dumps(s.to_dict()) + "\n" for s in sessions), encoding="utf-8")
    return path


def synthetic_sessions(n: int, seed: int = 0) -> list[Session]:
    """``n`` code-shaped sessions with a 4-digit number that only T1 states.

    T1 assigns ``<name>_id = DDDD`` inside ``setup_<name>()``; T2 is an unrelated helper;
    the summary lists both functions without the number; T3 stops where the number would be
    written again. ``label`` = the number's first digit (1–9, uniform), ``fact`` = ``"<name>_id = DDDD"``.
    Same ``n`` and ``seed`` → the same sessions.
    """
    if n < 1:
        raise TrajscopeError(f"Ask for at least one synthetic session, not {n}.")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name = rng.choice(_NAMES)
        number = rng.randint(1000, 9999)
        other = rng.randint(2, 60)
        t1 = (f"def setup_{name}():\n    {name}_id = {number}\n    retries = {other}\n"
              f"    return {name}_id, retries\n\n")
        t2 = rng.choice(_T2) + "\n"
        helper = re.match(r"(?:def|class) (\w+)", t2).group(1)
        summary = f"# summary: setup_{name}() sets the {name} id and retries; {helper} is a helper.\n\n"
        t3 = rng.choice(_T3).format(name=name)
        out.append(Session(f"syn{i:04d}", "# project: service tools\nimport os\n\n", t1, t2, summary, t3,
                           fact=f"{name}_id = {number}", label=int(str(number)[0])))
    return out


@dataclasses.dataclass(frozen=True)
class SessionTokens:
    """A session's token ids per segment and the spans they take in the full and restarted contexts.

    Attributes:
        session_id: the session's id.
        segments: ``{segment: ids}`` for the five segments of :data:`SEGMENTS`.
    """

    session_id: str
    segments: dict[str, list[int]]

    @property
    def ids(self) -> list[int]:
        """The full context ``<sys> <T1> <T2> <summary> <T3>`` (setups A and C)."""
        return [t for k in SEGMENTS for t in self.segments[k]]

    @property
    def restart_ids(self) -> list[int]:
        """The restarted context ``<sys> <summary> <T3>`` (setup B), with fresh positions."""
        return [t for k in ("sys", "summary", "t3") for t in self.segments[k]]

    def span(self, segment: str, restart: bool = False) -> tuple[int, int]:
        """``(start, end)`` positions of ``segment`` in the full (or restarted) context; end is exclusive."""
        order = ("sys", "summary", "t3") if restart else SEGMENTS
        if segment not in order:
            raise TrajscopeError(f"The restarted context has no segment '{segment}'.")
        start = 0
        for k in order:
            if k == segment:
                return start, start + len(self.segments[k])
            start += len(self.segments[k])
        raise AssertionError(segment)

    @property
    def n_t3(self) -> int:
        """Number of T3 tokens (the aligned rows every setup is compared on)."""
        return len(self.segments["t3"])


def tokenize_session(model: Any, session: Session, max_new_tokens: int = 0) -> SessionTokens:
    """Token ids of each segment of ``session`` (``sys`` with special tokens, the rest without).

    Args:
        model: a :class:`~trajscope.model.ModelHandle` (its tokenizer and context length are used).
        session: the session.
        max_new_tokens: tokens that will be generated after T3 (checked against the context window).
    Raises:
        TrajscopeError: a segment that tokenizes to nothing, a summary longer than the context, or a
            session (plus the new tokens) that does not fit in the context window.
    """
    tok = model.tokenizer
    segs = {}
    for k in SEGMENTS:
        ids = tok(getattr(session, k), add_special_tokens=(k == "sys"))["input_ids"]
        if not ids:
            raise TrajscopeError(f"Session '{session.session_id}': the {k} segment tokenizes to no tokens.")
        segs[k] = [int(i) for i in ids]
    C = int(getattr(model, "context_len", 0) or 0)
    if C:
        if len(segs["summary"]) >= C:
            raise TrajscopeError(f"Session '{session.session_id}': the summary has {len(segs['summary'])} tokens, "
                                 f"more than the model's context window of {C}; shorten the summary.")
        total = sum(len(v) for v in segs.values()) + max_new_tokens
        if total > C:
            raise TrajscopeError(f"Session '{session.session_id}' needs {total} positions (all segments plus "
                                 f"{max_new_tokens} new tokens) but the model's context window is {C}; shorten "
                                 f"T1/T2 or ask for fewer new tokens.")
    return SessionTokens(session.session_id, segs)
