"""The compaction study's config: a frozen dataclass whose fields carry their help.

``trajscope study compaction`` generates its flags from it (:mod:`trajscope.studies.flags`). Its input
is a session file or generated sessions, not a prompt set (``OWN_INPUT``), so the command has no
``--prompts``; ``--layers`` (shared) chooses the blocks to compare and probe.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import ClassVar

from trajscope.errors import TrajscopeError


@dataclasses.dataclass(frozen=True)
class CompactionConfig:
    """Is masking compacted turns the same as restarting from the summary, and what does the masked past leave in
    the states?"""

    OWN_INPUT: ClassVar[str] = "sessions <sys> <T1> <T2> <summary> <T3> from --sessions FILE or --synthetic N"

    sessions: str | None = field(default=None, metadata={"help": (
        "JSON-lines file: one object per line with string keys sys, t1, t2, summary, t3 (optional: id, fact, "
        "integer label for the probe)")})
    synthetic: int = field(default=0, metadata={"help": (
        "generate N code-shaped sessions (a 4-digit number only in T1; label = its first digit)")})
    max_new_tokens: int = field(default=16, metadata={"help": "greedy tokens after T3 per setup (0: skip decode)"})
    test_fraction: float = field(default=0.3, metadata={"help": "held-out share of sessions for the probe"})
    no_probe: bool = field(default=False, metadata={"help": "skip the probe (sessions without labels)"})
    seed: int = field(default=0, metadata={"help": "seed of the synthetic sessions, the split and the bootstrap"})
    plant_strength: float = field(default=0.0, metadata={"help": (
        "add strength × a per-class direction to T1's block output (a planted fact); 0 = off")})
    plant_layer: int = field(default=0, metadata={"help": "block whose output the planted signal is added to"})
    n_boot: int = field(default=1000, metadata={"help": "bootstrap resamples for the intervals"})

    def __post_init__(self) -> None:
        if bool(self.sessions) == bool(self.synthetic):
            raise TrajscopeError("Give the sessions as exactly one of --sessions FILE or --synthetic N.")
        if self.synthetic < 0 or self.max_new_tokens < 0 or self.n_boot < 1:
            raise TrajscopeError(f"--synthetic and --max-new-tokens must be ≥ 0 and --n-boot ≥ 1 (got "
                                 f"{self.synthetic}, {self.max_new_tokens}, {self.n_boot}).")
        if not 0 < self.test_fraction < 1:
            raise TrajscopeError(f"--test-fraction must be between 0 and 1, not {self.test_fraction}.")
