"""The verdict table: for each artefact, per decode regime, does it transfer from prefill?

Every verdict reads numbers a study already wrote (its Result's summaries or summary table), never
recomputes one, and applies a rule stated here and printed under the table. A verdict is one of

- **transfers**: the decode number is no worse than the prefill (reference) number beyond the reference's
  own interval and seed range;
- **degrades**: worse beyond that noise, but still doing its job;
- **fails**: not doing its job in decode;
- **undecided**: the interval is too wide to tell, or n is below the floor at which a bootstrap interval
  means anything here (fewer than 8 prompts, or 4 source files where the interval is over files): n too
  small.

The rules, per artefact (``lo``/``hi``: the 95 % interval a study reports):

- **SAE** (``sae-drift``, per SAE mix; regime *decode*): the prefill band is the prefill FVU interval widened
  to its seed range. Transfers when decode's FVU interval ends at or below the band's top; fails when its
  lower end is at or above 0.5 (less than half of decode's variance explained); degrades when it starts
  above the band's top (and below 0.5); otherwise undecided.
- **SAE, CE loss recovered** (``sae-bench``, per SAE mix; regime *decode*): the same against the prefill
  interval with higher better: transfers when decode's interval starts at or above the prefill band's
  bottom; fails when its upper end is below 0.8; degrades when it lies wholly below the band; otherwise
  undecided.
- **Steering vector** (``steering``, per strength; regime *from step k*): the reference is the earliest start
  step's effect over the equal window. Transfers when step k's interval starts at or above the reference's
  lower end; fails when it reaches 0 (lower end ≤ 0: no effect detected); degrades when it lies wholly
  below the reference's lower end; otherwise undecided.
- **Steering vector, success** (``steering-success``; regime *from step k*): the same rule on the behavioural
  success rate (Wilson interval) by start step; fails when its upper end is below 0.1; undecided whenever
  the reference's own interval reaches 0 (no success shown to compare with).
- **Monitor** (``monitor``, per monitor; regime *each planted shift*, its AUROC against its own null arm):
  fails when the AUROC interval ends at or below 0.6 (no useful detection beyond noise) or its threshold,
  fitted on clean runs of other files, fires on held-out clean runs above its target rate (the held-out FPR
  interval starts above the target); transfers when the AUROC interval starts at or above 0.7 and the FPR
  holds; degrades when the whole AUROC interval lies below 0.7; otherwise undecided.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any, Sequence

from trajscope.studies.registry import Result

AUROC_USEFUL = 0.7
AUROC_FAILS = 0.6
FVU_FAILS = 0.5
CE_FAILS = 0.8
SUCCESS_FAILS = 0.1
MIN_PROMPTS = 8  # below this many prompts (or 4 source files, for intervals over files) a verdict is undecided
MIN_FILES = 4
RULES = {
    "sae": "decode FVU interval vs the prefill FVU interval widened to its seed range: at or below its top → "
           f"transfers; lower end ≥ {FVU_FAILS} → fails; wholly above its top → degrades; else undecided",
    "sae-ce": "decode CE loss recovered (normalised by zero ablation) vs the prefill interval widened to its seed "
              f"range: lower end at or above its bottom → transfers; upper end < {CE_FAILS} → fails; wholly below its "
              "bottom → degrades; else undecided",
    "vector": "effect over the equal window from step k vs from the earliest start step: lower end at or above the "
              "reference's lower end → transfers; lower end ≤ 0 → fails; wholly below the reference's lower end → "
              "degrades; else undecided",
    "vector-success": "behavioural success rate when steering starts at decode step k vs at the earliest step: lower "
                      f"end at or above the reference's lower end → transfers; upper end < {SUCCESS_FAILS} → fails; "
                      "wholly below the reference's lower end → degrades; else (or when the reference's own interval "
                      "reaches 0) undecided",
    "monitor": f"detection AUROC interval (against the shift's own null) and held-out false-positive rate: held-out "
               f"FPR above target, or AUROC upper end ≤ {AUROC_FAILS} → fails; AUROC lower end ≥ {AUROC_USEFUL} → "
               f"transfers; AUROC upper end < {AUROC_USEFUL} → degrades; else undecided",
}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One cell of the table: an artefact in one regime, the verdict, and the numbers it rests on."""

    kind: str  # sae, vector, monitor
    artefact: str
    regime: str
    verdict: str
    evidence: str
    section: str  # the report section's anchor
    job: str  # the study folder's name


def _f(x: Any) -> float | None:
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def fmt(x: Any) -> str:
    """A number as the report prints it (3 significant digits; 'n/a' for none)."""
    v = _f(x)
    return "n/a" if v is None else f"{v:.3g}"


def interval(value: Any, lo: Any, hi: Any) -> str:
    """``value [lo, hi]`` as the report prints it."""
    return f"{fmt(value)} [{fmt(lo)}, {fmt(hi)}]"


def too_few(n_prompts: Any = None, n_files: Any = None) -> bool:
    """Whether a verdict's n is below the floor (module docstring); an unknown n is not held against it."""
    p, f = _f(n_prompts), _f(n_files)
    return (p is not None and p < MIN_PROMPTS) or (f is not None and f < MIN_FILES)


def _phase_pairs(summaries: dict[str, Any], metric: str):
    """``(mix, prefill, decode)`` for every mix whose ``<metric> prefill <mix>`` and ``<metric> decode <mix>``
    summaries are both there (mix differences, ``… − …``, left out)."""
    for key, pre in summaries.items():
        if not key.startswith(f"{metric} prefill ") or " − " in key or not isinstance(pre, dict):
            continue
        mix = key.removeprefix(f"{metric} prefill ")
        dec = summaries.get(f"{metric} decode {mix}")
        if isinstance(dec, dict):
            yield mix, pre, dec


def sae_verdicts(result: Result, job: str) -> list[Verdict]:
    """One verdict per SAE mix of a ``sae-drift`` Result (regime decode; rule in the module docstring)."""
    out = []
    for mix, pre, dec in _phase_pairs(result.summaries, "fvu"):
        tops = [v for v in (_f(pre.get("hi")), _f(pre.get("seed_max"))) if v is not None]
        lo, hi = _f(dec.get("lo")), _f(dec.get("hi"))
        if not tops or lo is None or hi is None or too_few(dec.get("n_prompts")):
            verdict = "undecided"
        else:
            top = max(tops)
            verdict = ("transfers" if hi <= top else "fails" if lo >= FVU_FAILS else "degrades" if lo > top
                       else "undecided")
        band = f"[{fmt(pre.get('lo'))}, {fmt(max(tops) if tops else None)}]"
        ev = (f"FVU decode {interval(dec.get('value'), lo, hi)} (n = {dec.get('n')} rows, {dec.get('n_prompts')} "
              f"prompts) vs prefill band {band}")
        out.append(Verdict("sae", mix, "decode", verdict, ev, "sae", job))
    return out


def sae_ce_verdicts(result: Result, job: str) -> list[Verdict]:
    """One verdict per SAE mix of a ``sae-bench`` Result: decode CE loss recovered against prefill's."""
    out = []
    for mix, pre, dec in _phase_pairs(result.summaries, "ce recovered"):
        bottoms = [v for v in (_f(pre.get("lo")), _f(pre.get("seed_min"))) if v is not None]
        lo, hi = _f(dec.get("lo")), _f(dec.get("hi"))
        if not bottoms or lo is None or hi is None or too_few(n_files=dec.get("n_files")):
            verdict = "undecided"
        else:
            bottom = min(bottoms)
            verdict = ("transfers" if lo >= bottom else "fails" if hi < CE_FAILS else "degrades" if hi < bottom
                       else "undecided")
        band = f"[{fmt(min(bottoms) if bottoms else None)}, {fmt(pre.get('hi'))}]"
        rows = f", {dec.get('rows')}" if dec.get("rows") else ""
        ev = (f"CE recovered decode {interval(dec.get('value'), lo, hi)} (n = {dec.get('n')} rows, "
              f"{dec.get('n_files')} files{rows}) vs prefill band {band}")
        out.append(Verdict("sae-ce", mix, "decode", verdict, ev, "sae", job))
    return out


def vector_verdicts(result: Result, job: str, artefact: str) -> list[Verdict]:
    """One verdict per (strength, start step after the earliest) of a ``steering`` Result."""
    rows = [r for r in (result.summaries.get("effect") or []) if isinstance(r, dict)]
    out = []
    for strength in sorted({r.get("strength") for r in rows}, key=lambda x: (x is None, x)):
        mine = sorted((r for r in rows if r.get("strength") == strength), key=lambda r: r.get("start_step") or 0)
        if not mine:
            continue
        ref = mine[0]
        ref_lo = _f(ref.get("lo"))
        for r in mine[1:]:
            lo, hi = _f(r.get("lo")), _f(r.get("hi"))
            if lo is None or hi is None or ref_lo is None or too_few(r.get("n_prompts")):
                verdict = "undecided"
            else:
                verdict = ("fails" if lo <= 0 else "transfers" if lo >= ref_lo else "degrades" if hi < ref_lo
                           else "undecided")
            ev = (f"effect {interval(r.get('value'), lo, hi)} from step {r.get('start_step')} vs "
                  f"{interval(ref.get('value'), ref.get('lo'), ref.get('hi'))} from step {ref.get('start_step')} "
                  f"(strength {fmt(strength)}, {r.get('n_prompts')} prompts)")
            out.append(Verdict("vector", artefact, f"from step {r.get('start_step')} (strength {fmt(strength)})",
                               verdict, ev, "steering", job))
    return out


def success_verdicts(result: Result, job: str, artefact: str) -> list[Verdict]:
    """One verdict per start step after the earliest of a ``steering-success`` Result (its success rate by depth)."""
    rows = sorted((r for r in (result.summaries.get("by_depth") or []) if isinstance(r, dict)),
                  key=lambda r: r.get("start_step") or 0)
    out = []
    if not rows:
        return out
    ref = rows[0].get("success") or {}
    ref_lo = _f(ref.get("lo"))
    for r in rows[1:]:
        succ = r.get("success") or {}
        lo, hi = _f(succ.get("lo")), _f(succ.get("hi"))
        if lo is None or hi is None or ref_lo is None or too_few(r.get("n")):
            verdict = "undecided"
        else:
            verdict = ("fails" if hi < SUCCESS_FAILS else "undecided" if ref_lo <= 0  # no success shown at the reference
                       else "transfers" if lo >= ref_lo else "degrades" if hi < ref_lo else "undecided")
        ev = (f"success {interval(succ.get('value'), lo, hi)} from step {r.get('start_step')} vs "
              f"{interval(ref.get('value'), ref.get('lo'), ref.get('hi'))} from step {rows[0].get('start_step')} "
              f"({r.get('n')} prompts)")
        out.append(Verdict("vector-success", artefact, f"success from step {r.get('start_step')}", verdict, ev,
                           "steering", job))
    return out


def monitor_verdicts(result: Result, job: str) -> list[Verdict]:
    """One verdict per (monitor, planted shift) of a ``monitor`` Result: each shifted arm's AUROC against its own
    null (``monitor_vs_null``: steering at s against s = 0, topic and forced against their replay), with the
    monitor's held-out false-positive rate from ``monitor_summary``."""
    try:
        summary = result.table("monitor_summary")
    except Exception:  # no summary table: nothing to judge (the section says why)
        return []
    try:
        arms = result.table("monitor_vs_null")
    except Exception:  # an older Result: AUROC against clean runs, steering arms only
        arms = summary.filter(summary["measure"] == "AUROC")
        arms = arms.filter(arms["strength"].fill_null(0) > 0)
    fpr = {r["monitor"]: r for r in summary.iter_rows(named=True) if r.get("measure") == "AUROC"}
    out = []
    for r in arms.iter_rows(named=True):
        lo, hi = _f(r.get("lo")), _f(r.get("hi"))
        f = fpr.get(r.get("monitor"), {})
        fpr_lo, target = _f(f.get("fpr_heldout_lo")), _f(f.get("fpr_target"))
        fpr_bad = fpr_lo is not None and target is not None and fpr_lo > target
        if lo is None or hi is None or too_few(r.get("n_prompts")):
            verdict = "undecided"
        else:
            verdict = ("fails" if hi <= AUROC_FAILS or fpr_bad else "transfers" if lo >= AUROC_USEFUL
                       else "degrades" if hi < AUROC_USEFUL else "undecided")
        null = f" vs {r['null']}" if r.get("null") else ""
        ev = (f"AUROC{null} {interval(r.get('value'), lo, hi)} ({r.get('n_prompts')} prompts); held-out FPR "
              f"{interval(f.get('fpr_heldout'), f.get('fpr_heldout_lo'), f.get('fpr_heldout_hi'))} "
              f"vs target {fmt(target)}")
        regime = str(r.get("label") or r.get("shift"))
        out.append(Verdict("monitor", str(r.get("monitor")), regime, verdict, ev, "monitor", job))
    return out


def verdicts(results: Sequence[tuple[str, str, str, Result]]) -> list[Verdict]:
    """Every verdict of the report from ``(study, job, label, Result)`` of the finished jobs."""
    out: list[Verdict] = []
    for study, job, label, result in results:
        if study == "sae-drift":
            out += sae_verdicts(result, job)
        elif study == "sae-bench":
            out += sae_ce_verdicts(result, job)
        elif study == "steering":
            out += vector_verdicts(result, job, label or pathlib.PurePath(str(result.config.get("vector") or "vector")).stem)
        elif study == "steering-success":
            out += success_verdicts(result, job, label or pathlib.PurePath(str(result.config.get("vector") or
                                                                                 "vector")).stem)
        elif study == "monitor":
            out += monitor_verdicts(result, job)
    return out
