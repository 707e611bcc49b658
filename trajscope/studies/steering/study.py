"""The steering-depth study: does a steering vector's effect depend on the decode step where it starts?

:class:`SteeringConfig` holds its settings (each field's help is a flag of ``trajscope study
steering``): the vector (``vector`` file, or CAA from contrast ``pairs`` at ``layer``), the start
depths, strengths, the equal window, seeds and targets. :func:`run` builds the vector
(:func:`vector_for`), runs :func:`~trajscope.studies.steering.sweep.steering_sweep` on every prompt
and returns the sweep's :class:`~trajscope.studies.registry.Result`: tables ``steering`` (per run
× start depth × strength × decode step), ``steering_summary``
(:func:`~trajscope.studies.steering.summary.decay_summary`, equal windows) and ``steering_texts``,
and the summary's headline numbers.
"""

from __future__ import annotations

import dataclasses
import pathlib
from dataclasses import field
from typing import Any, Callable, Sequence

from trajscope.errors import TrajscopeError
from trajscope.studies.registry import Result

PAIRS = "sample_data/prompts/quotes_pairs.jsonl"


def _help(text: str, **more: Any) -> dict[str, Any]:
    return {"help": text, **more}


@dataclasses.dataclass(frozen=True)
class SteeringConfig:
    """Steering effect by the decode step where steering starts, over equal windows of steered steps."""

    vector: str | None = field(default=None, metadata=_help("steering direction file (.safetensors or .npy); "
                                                            "without it, CAA from --pairs"))
    pairs: str | None = field(default=None, metadata=_help(
        "contrast pairs for CAA (JSON lines: positive, negative); needs --layer"))
    layer: int | None = field(default=None, metadata=_help("block to steer (required with --pairs)"))
    mode: str = field(default="add", metadata=_help("add the direction, or clamp its projection",
                                                    choices=("add", "clamp")))
    depths: tuple[int, ...] = field(default=(1, 10, 50, 200), metadata=_help("start steps k (each >= 1)"))
    strengths: tuple[float, ...] = field(default=(4.0,), metadata=_help("strengths (comma-separated numbers)"))
    window: int = field(default=20, metadata=_help("steered steps averaged into the effect (the same for every depth)"))
    max_new_tokens: int | None = field(default=None, metadata=_help("decode steps per run (default: max depth + window)"))
    seeds: tuple[int, ...] = field(default=(0,), metadata=_help("sampling seeds"))
    temperature: float = field(default=0.0, metadata=_help("sampling temperature (0 = greedy)"))
    targets: tuple[str, ...] = field(default=(), metadata=_help("single-token strings whose logit change is tracked"))

    def __post_init__(self) -> None:
        try:  # the generated flag gives strings; a float tuple either way
            object.__setattr__(self, "strengths", tuple(float(s) for s in self.strengths))
        except (TypeError, ValueError) as exc:
            raise TrajscopeError(f"--strengths must be comma-separated numbers, not {self.strengths!r}.") from exc
        if (self.vector is None) == (self.pairs is None):
            raise TrajscopeError("Give exactly one of --vector FILE or --pairs FILE.jsonl.")
        if self.pairs is not None and self.layer is None:
            raise TrajscopeError("CAA needs --layer.")
        if not self.depths or min(self.depths) < 1:
            raise TrajscopeError("Sweep depths are decode steps, each ≥ 1.")
        if not self.strengths:
            raise TrajscopeError("Give at least one strength.")
        if self.window < 1:
            raise TrajscopeError(f"--window must be at least 1, not {self.window}.")


def vector_for(model: Any, config: SteeringConfig) -> Any:
    """The :class:`~trajscope.steering.SteeringVector` the config names: loaded from ``vector``, or CAA from
    ``pairs`` at ``layer``."""
    from trajscope.prompts import read_pairs
    from trajscope.steering import SteeringVector

    if config.vector:
        return SteeringVector.load(config.vector, layer=config.layer, mode=config.mode)
    return SteeringVector.from_contrast(model, read_pairs(config.pairs), config.layer, mode=config.mode,
                                       name=pathlib.Path(str(config.pairs)).stem)


def run(model: Any, prompts: Sequence[Any], config: SteeringConfig, progress: Callable[[int, int], None] | None = None,
        layers: Sequence[int] | None = None, *, vector: Any = None, cancel: Any = None) -> Result:
    """Run the steering-depth study.

    Args:
        model: a :class:`~trajscope.model.ModelHandle`.
        prompts: prompt texts, token-id lists, records with ``prompt`` or ``(id, token ids)`` pairs.
        config: the study's settings.
        progress: ``(done, total)`` after each (prompt, seed, depth, strength) cell.
        layers: must be None: the vector names the one steered layer (``layer``); ``--layers`` is refused.
        vector: a ready vector (the app card's); default :func:`vector_for` ``(model, config)``.
        cancel: a ``threading.Event`` that stops the sweep after the current cell.
    Returns:
        The sweep's Result (:meth:`~trajscope.studies.steering.sweep.SweepResult.result`); its summaries'
        ``complete`` is False when the sweep was stopped.
    """
    from trajscope.studies.steering.sweep import steering_sweep

    if layers:
        raise TrajscopeError("The steering study steers one block: give it with --layer, not --layers.")
    texts = [p["prompt"] if isinstance(p, dict) else (list(p[1]) if isinstance(p, tuple) else p) for p in prompts]
    vec = vector if vector is not None else vector_for(model, config)
    res = steering_sweep(model, texts, vec, depths=config.depths, strengths=config.strengths, window=config.window,
                         max_new_tokens=config.max_new_tokens, seeds=config.seeds, temperature=config.temperature,
                         targets=config.targets, cancel=cancel, progress=progress or False)
    cfg = {**dataclasses.asdict(config), "layer": vec.layer, "vector_name": getattr(vec, "name", None)}
    return res.result(cfg)
