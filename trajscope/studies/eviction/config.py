"""The eviction, needle and eviction-ppl studies' configs: frozen dataclasses whose fields carry their help.

``trajscope study eviction``, ``trajscope study needle`` and ``trajscope study eviction-ppl`` generate their flags from these
(:mod:`trajscope.studies.flags`); each config checks itself in ``__post_init__`` (one sentence,
before any model is loaded).
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any, ClassVar

from trajscope.errors import TrajscopeError
from trajscope.metrics import eviction as ev
from trajscope.studies.eviction.needle import POLICIES as NEEDLE_POLICIES
from trajscope.studies.eviction.needle import STATIC


def _help(text: str, **more: Any) -> dict[str, Any]:
    return {"help": text, **more}


def _check_common(policies: tuple[str, ...], allowed: tuple[str, ...], budgets: tuple[float, ...], window: int,
                  lookahead: int, pyramid_schedule: str = "code") -> None:
    bad = [p for p in policies if p not in allowed]
    if bad or not policies:
        raise TrajscopeError(f"Unknown eviction policy '{bad[0] if bad else ''}': choose among {', '.join(allowed)}.")
    if not budgets:
        raise TrajscopeError("Give at least one budget (--budgets 0.2,0.5).")
    for b in budgets:
        ev.resolve_budget(int(b) if float(b) > 1 and float(b).is_integer() else float(b), 1)
    if window < 1 or lookahead < 1:
        raise TrajscopeError(f"--window and --lookahead must be at least 1 (got {window} and {lookahead}).")
    if pyramid_schedule not in ("code", "paper"):
        raise TrajscopeError(f"Unknown PyramidKV schedule '{pyramid_schedule}': choose 'code' or 'paper'.")


@dataclasses.dataclass(frozen=True)
class EvictionConfig:
    """Do the prompt keys a KV-eviction policy keeps after prefill stay the ones decode attends to, and what does
    evicting the rest cost the next-token distribution?"""

    policies: tuple[str, ...] = field(default=ev.POLICIES, metadata=_help(
        f"eviction policies ({', '.join(ev.POLICIES)})"))
    budgets: tuple[float, ...] = field(default=(0.1, 0.2, 0.5), metadata=_help(
        "kept prompt positions per head: fractions of the prompt in (0, 1] or whole counts"))
    max_new_tokens: int = field(default=32, metadata=_help("decode steps of each full run (EOS does not stop it)"))
    window: int = field(default=16, metadata=_help("observation / recent window w (at most every prompt's length)"))
    lookahead: int = field(default=8, metadata=_help("m: draft, pseudo and oracle queries"))
    k: int = field(default=8, metadata=_help("top-k attended prompt positions for recall"))
    shared: bool = field(default=False, metadata=_help("one kept set per layer instead of per head"))
    no_rerun: bool = field(default=False, metadata=_help("skip the masked re-runs (KL, token agreement)"))
    split: bool = field(default=False, metadata=_help(
        "also split the damage into per-step and accumulated arms (eviction_split tables)"))
    pyramid_schedule: str = field(default="code", metadata=_help(
        "PyramidKV's per-layer budgets: 'code' (KVCache-Factory's integer schedule) or 'paper' (the paper's formula)"))

    def __post_init__(self) -> None:
        _check_common(self.policies, ev.POLICIES, self.budgets, self.window, self.lookahead, self.pyramid_schedule)
        if self.max_new_tokens < 2 or self.k < 1:
            raise TrajscopeError(f"--max-new-tokens must be at least 2 and --k at least 1 "
                                 f"(got {self.max_new_tokens} and {self.k}).")

    def budget_values(self) -> list[float | int]:
        """The budgets as :func:`~trajscope.metrics.eviction.resolve_budget` reads them (whole numbers > 1: counts)."""
        return [int(b) if float(b) > 1 and float(b).is_integer() else float(b) for b in self.budgets]


@dataclasses.dataclass(frozen=True)
class NeedleConfig:
    """Does the model still retrieve a passkey hidden in a long prompt when a KV-eviction policy keeps only part
    of it?"""

    # the study builds its prompts itself: no --prompts, --max-prompts or --max-tokens (trajscope.studies.flags)
    OWN_INPUT: ClassVar[str] = "passkey prompts built offline from --context, --n-prompts, --depths and --seed"

    policies: tuple[str, ...] = field(default=NEEDLE_POLICIES, metadata=_help(
        f"eviction policies ({', '.join(NEEDLE_POLICIES)}); the full cache is always answered too"))
    budgets: tuple[float, ...] = field(default=(0.05, 0.1, 0.2, 1.0), metadata=_help(
        "kept prompt positions per head: fractions of the prompt in (0, 1] or whole counts"))
    window: int = field(default=32, metadata=_help("observation window w"))
    lookahead: int = field(default=8, metadata=_help("m: LAQ draft and pseudo queries"))
    context: int = field(default=2048, metadata=_help("prompt length in tokens"))
    n_prompts: int = field(default=24, metadata=_help("passkey prompts to build"))
    depths: tuple[float, ...] = field(default=(0.1, 0.5, 0.9), metadata=_help(
        "depths of the passkey in the filler (fractions), cycled over the prompts"))
    answer_tokens: int = field(default=12, metadata=_help("greedy answer length"))
    seed: int = field(default=0, metadata=_help("passkeys and filler windows"))
    pyramid_schedule: str = field(default="code", metadata=_help(
        "PyramidKV's per-layer budgets: 'code' (KVCache-Factory's integer schedule) or 'paper' (the paper's formula)"))

    def __post_init__(self) -> None:
        _check_common(self.policies, NEEDLE_POLICIES, self.budgets, self.window, self.lookahead, self.pyramid_schedule)
        if not self.depths or any(not 0 <= d <= 1 for d in self.depths):
            raise TrajscopeError(f"--depths must be fractions in [0, 1]; got {','.join(map(str, self.depths))}.")
        if self.answer_tokens < 1:
            raise TrajscopeError(f"--answer-tokens must be at least 1, not {self.answer_tokens}.")

    def budget_values(self) -> list[float | int]:
        """The budgets as :func:`~trajscope.metrics.eviction.resolve_budget` reads them."""
        return [int(b) if float(b) > 1 and float(b).is_integer() else float(b) for b in self.budgets]


@dataclasses.dataclass(frozen=True)
class PerplexityConfig:
    """How much worse does the model predict held-out text once a KV-eviction policy has compressed the prompt
    before it?"""

    # the study reads held-out standard-library files itself: no --prompts, --max-prompts or --max-tokens
    OWN_INPUT: ClassVar[str] = ("held-out standard-library source files (the end of trajscope prepare's SHA-1 order), "
                                "one text of --prompt-len + --continuation tokens per file")

    policies: tuple[str, ...] = field(default=STATIC, metadata=_help(
        f"eviction policies ({', '.join(STATIC)}); the full cache is always scored too"))
    budgets: tuple[float, ...] = field(default=(0.1, 0.2, 0.5), metadata=_help(
        "kept prompt positions per head: fractions of the prompt in (0, 1] or whole counts"))
    window: int = field(default=32, metadata=_help("observation window w"))
    lookahead: int = field(default=8, metadata=_help("m: LAQ draft and pseudo queries"))
    prompt_len: int = field(default=1024, metadata=_help("tokens of each text that form the compressed prompt"))
    continuation: int = field(default=128, metadata=_help("tokens after the prompt, teacher-forced and scored"))
    n_files: int = field(default=16, metadata=_help("held-out files, one text each (the unit of the intervals)"))
    pyramid_schedule: str = field(default="code", metadata=_help(
        "PyramidKV's per-layer budgets: 'code' (KVCache-Factory's integer schedule) or 'paper' (the paper's formula)"))

    def __post_init__(self) -> None:
        _check_common(self.policies, STATIC, self.budgets, self.window, self.lookahead, self.pyramid_schedule)
        if self.n_files < 2 or self.continuation < 1 or self.prompt_len <= self.window:
            raise TrajscopeError(f"--n-files must be at least 2, --continuation at least 1 and --prompt-len longer "
                                 f"than --window (got {self.n_files}, {self.continuation}, {self.prompt_len}).")

    def budget_values(self) -> list[float | int]:
        """The budgets as :func:`~trajscope.metrics.eviction.resolve_budget` reads them."""
        return [int(b) if float(b) > 1 and float(b).is_integer() else float(b) for b in self.budgets]
