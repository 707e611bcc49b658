"""The steering study's model runs: how a steering vector's effect depends on the decode step where it starts.

For every prompt and seed, one unsteered base run is captured; then, for every
start depth k and strength, (a) the free-running steered run (which tokens
change) and (b) one teacher-forced forward over the base tokens with the vector
active from step k (how the next-token distribution, target logits and the
projection on the direction move). :func:`trajscope.metrics.steering.step_effects` turns these
into the per-step ``steering`` table, and :func:`trajscope.studies.steering.summary.decay_summary`
into the decay summary; :meth:`SweepResult.result` is the study's
:class:`~trajscope.studies.registry.Result`.

Long sweeps show a progress bar and honour a ``cancel`` event; the rows of every
finished (prompt, seed, depth, strength) cell are kept.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Sequence

import polars as pl

from trajscope.capture import capture
from trajscope.errors import TrajscopeError
from trajscope.metrics.steering import step_effects
from trajscope.model import ModelHandle
from trajscope.steering import SteeringVector
from trajscope.studies.registry import Result
from trajscope.studies.steering import summary


@dataclasses.dataclass
class SweepResult:
    """Output of :func:`steering_sweep`.

    Attributes:
        steps: the ``steering`` table, one row per (run, start_step, strength, decode step).
        summary: :func:`~trajscope.studies.steering.summary.decay_summary` of ``steps``.
        texts: base and steered continuations, one row per (run, start_step, strength).
        complete: False when the sweep was cancelled before every cell finished.
    """

    steps: pl.DataFrame
    summary: pl.DataFrame
    texts: pl.DataFrame
    complete: bool = True

    def result(self, config: dict[str, Any] | None = None) -> Result:
        """The steering study's Result: tables ``steering`` (steps), ``steering_summary``, ``steering_texts``,
        and the summary's headline numbers (:func:`~trajscope.studies.steering.summary.headline`)."""
        return Result(study="steering", tables={"steering": self.steps, "steering_summary": self.summary,
                                                "steering_texts": self.texts},
                      config=dict(config or {}), summaries={**summary.headline(self.summary), "complete": self.complete})

    def save(self, out: str) -> list:
        """Write :meth:`result` under ``out`` (``steering*.parquet`` and ``steering.result.json``)."""
        return self.result().save(out)


def target_ids(model: ModelHandle, targets: Sequence[str | int]) -> list[int]:
    """Token ids of target tokens; each string must be exactly one token."""
    out = []
    for t in targets:
        if isinstance(t, int):
            out.append(t)
            continue
        ids = model.tokenizer(t, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise TrajscopeError(f"Target '{t}' is {len(ids)} tokens for this tokenizer; targets must be single tokens.")
        out.append(ids[0])
    return out


def steering_sweep(model: ModelHandle, prompts: Sequence[str | Sequence[int]], vector: SteeringVector, *,
                   depths: Sequence[int] = (1, 10, 50, 200), strengths: Sequence[float] | None = None,
                   window: int = 20, max_new_tokens: int | None = None, seeds: Sequence[int] = (0,),
                   temperature: float = 0.0, targets: Sequence[str | int] = (), cancel: Any = None,
                   progress: bool | Callable[[int, int], None] = True) -> SweepResult:
    """Sweep start depth × strength for one steering vector over prompts and seeds.

    Args:
        model: an opened model.
        prompts: prompt texts or token-id lists.
        vector: the vector (its ``start_step``/``strength`` are replaced per cell).
        depths: start steps k (each ≥ 1).
        strengths: defaults to the vector's own strength.
        window: steered steps averaged into the effect size; runs last ``max(depths) + window`` steps
            unless ``max_new_tokens`` says otherwise.
        seeds: sampling seeds (only matter when ``temperature > 0``).
        targets: single-token strings or ids whose logit change is tracked.
        cancel: a ``threading.Event``; when set, the sweep stops after the current cell.
        progress: True for a progress bar, or a ``(done, total)`` callback called after each cell.
    Returns:
        A :class:`SweepResult`.
    """
    from tqdm.auto import tqdm

    if not prompts:
        raise TrajscopeError("The sweep needs at least one prompt.")
    depths = sorted({int(d) for d in depths})
    if not depths or depths[0] < 1:
        raise TrajscopeError("Sweep depths are decode steps, each ≥ 1.")
    strengths = list(strengths) if strengths else [vector.strength]
    n_new = max_new_tokens or depths[-1] + window
    vector.at(start_step=depths[-1]).validate(model.n_layers, model.d_model, n_new)
    tgt = target_ids(model, targets)
    unit = vector.unit
    rows, texts, complete = [], [], True
    cells = len(prompts) * len(seeds) * len(depths) * len(strengths)
    cells_of = [(pi, prompt, seed) for pi, prompt in enumerate(prompts) for seed in seeds]
    with tqdm(total=cells, desc="steering sweep", unit="run", disable=not progress or callable(progress)) as bar:
        for pi, prompt, seed in cells_of:
            if not complete:
                break
            base = capture(model, prompt, max_new_tokens=n_new, temperature=temperature, seed=seed, stop_at_eos=False)
            P, seq = base.prompt_len, base.token_ids[:-1]
            ref = model.forward(seq, prompt_len=P, layers=[vector.layer])
            run_id = f"p{pi}-s{seed}"
            for strength, k in itertools.product(strengths, depths):
                if cancel is not None and cancel.is_set():
                    complete = False
                    break
                vec = vector.at(start_step=k, strength=strength)
                steered = capture(model, prompt, max_new_tokens=n_new, temperature=temperature, seed=seed,
                                  stop_at_eos=False, steering=[vec])
                forced = model.forward(seq, prompt_len=P, steering=[vec], layers=[vector.layer])
                eff = step_effects(ref.logits, forced.logits, ref.resid[vector.layer],
                                   forced.resid[vector.layer], unit, base.token_ids, steered.token_ids, P, tgt)
                rows.append(eff.with_columns(pl.lit(run_id).alias("run_id"), pl.lit(pi).alias("prompt_idx"),
                                             pl.lit(seed).alias("seed"), pl.lit(k).alias("start_step"),
                                             pl.lit(float(strength)).alias("strength")))
                texts.append({"run_id": run_id, "prompt_idx": pi, "seed": seed, "start_step": k,
                              "strength": float(strength),
                              "prompt": prompt if isinstance(prompt, str) else "".join(base.tokens["text"][:P]),
                              "base": base.generated_text, "steered": steered.generated_text})
                bar.update(1)
                if callable(progress):
                    progress(len(rows), cells)
    if not rows:
        raise TrajscopeError("The sweep was stopped before any run finished; nothing to report.")
    lead = ["run_id", "prompt_idx", "seed", "start_step", "strength"]
    steps = pl.concat(rows).select(lead + [c for c in rows[0].columns if c not in lead])
    return SweepResult(steps=steps, summary=summary.decay_summary(steps, window=window),
                       texts=pl.DataFrame(texts), complete=complete)
