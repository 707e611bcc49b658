"""CaptureConfig: everything that decides what a capture records and how it samples.

One frozen value, built once (by the CLI from its options, by the app from
what is on screen, by sweeps, harvests and studies from their arguments) and
passed through unchanged, so a run's settings are never rebuilt by hand and a
worker thread can hold an immutable snapshot of them. ``to_dict`` is what a
run's ``meta.json`` records (attachments are summarised, never pickled).

Layer specs (``residual_layers``, ``attention_layers``) are ``None`` (none),
``"all"``, or layer indices (negative counts from the end); :func:`resolve_layers`
turns them into sorted indices for a model and says clearly when one is out of
range.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence, Union

from trajscope.errors import TrajscopeError
from trajscope.steering import SteeringVector

LayerSpec = Union[str, int, Sequence[int], None]


def _freeze_layers(spec: LayerSpec) -> Union[str, tuple[int, ...], None]:
    if spec is None or isinstance(spec, str):
        return spec
    if isinstance(spec, bool):
        raise TrajscopeError(f"A layer spec must be 'all', an index or indices, not {spec!r}.")
    if isinstance(spec, int):
        return (int(spec),)
    try:
        return tuple(int(s) for s in spec)
    except (TypeError, ValueError) as exc:
        raise TrajscopeError(f"A layer spec must be 'all', an index or indices, not {spec!r}.") from exc


def resolve_layers(spec: LayerSpec, n_layers: int, what: str) -> list[int]:
    """Sorted layer indices of ``spec`` for a model with ``n_layers`` blocks.

    Raises:
        TrajscopeError: for a string other than ``"all"`` or an index out of range.
    """
    if spec is None:
        return []
    if spec == "all":
        return list(range(n_layers))
    if isinstance(spec, str):
        raise TrajscopeError(f"{what} must be 'all', a layer index or a list of indices, not '{spec}'.")
    out = []
    for item in _freeze_layers(spec) or ():
        layer = item + n_layers if item < 0 else item
        if not 0 <= layer < n_layers:
            raise TrajscopeError(f"{what}: layer {item} is out of range; the model has layers 0..{n_layers - 1}.")
        out.append(layer)
    return sorted(set(out))


@dataclasses.dataclass(frozen=True)
class CaptureConfig:
    """Settings of one capture (frozen; derive variants with :meth:`replace`).

    Attributes:
        max_new_tokens: N ≥ 1; steps 0..N−1 are captured unless EOS or a stop ends sooner.
        temperature: 0 for greedy; > 0 samples (with ``top_p`` / ``top_k`` when given).
        top_p, top_k: nucleus / top-k sampling limits (None = off; a ``top_k`` of 0 is off too).
        seed: seeds torch's RNG for sampling (the RNG state is restored afterwards).
        stop_at_eos: end when the model emits its EOS token.
        residual_layers: layers whose block outputs are kept as tensors (``"all"``, indices, None).
        attention_layers: layers whose full attention rows are kept as tensors.
        steering: :class:`~trajscope.steering.SteeringVector` s to apply.
        sae: an :class:`~trajscope.sae.model.SAE` whose top features go to the ``features`` table.
        sae_top_k: active features kept per position.
        probe: a :class:`~trajscope.profile.DriftProbe` scored during decode (``probe`` table).
        top_k_keys: top attended keys kept per query row (``attention`` table).
        top_k_tokens: top next-token alternatives kept per position (``tokens`` table).
        prefill_rows: prefill query rows whose per-query outputs are computed: their attention rows
            (summarised in the ``attention`` table) and their next-token distribution (``logprob`` of
            the following token, ``entropy``, top-k in ``tokens``). The last ``prefill_rows`` prompt
            queries (default 32, the observation window of SnapKV-style policies), or ``"all"``; earlier
            prompt positions keep their residual statistics and get nulls there. Decode steps always
            have their row. Keeping full attention tensors (``attention_layers``) computes every row.
    """

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = 0
    stop_at_eos: bool = True
    residual_layers: LayerSpec = None
    attention_layers: LayerSpec = None
    steering: tuple[SteeringVector, ...] = ()
    sae: Any = None
    sae_top_k: int = 16
    probe: Any = None
    top_k_keys: int = 8
    top_k_tokens: int = 5
    prefill_rows: int | str = 32

    def __post_init__(self):
        n = self.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise TrajscopeError(f"max_new_tokens must be a positive whole number, not {n!r}.")
        if self.temperature is None or not 0 <= self.temperature < math.inf:  # NaN fails both comparisons
            raise TrajscopeError(f"temperature must be a finite number ≥ 0 (0 means greedy), not {self.temperature}.")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise TrajscopeError(f"top_p must be in (0, 1], not {self.top_p}.")
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):  # HF raised a ValueError
            raise TrajscopeError(f"top_k must be a whole number ≥ 1, or 0 or None for no limit, not {k!r}.")
        for name in ("top_k_keys", "top_k_tokens", "sae_top_k"):
            if int(getattr(self, name)) < 1:
                raise TrajscopeError(f"{name} must be at least 1, not {getattr(self, name)}.")
        rows = self.prefill_rows
        if not (rows == "all" or (isinstance(rows, int) and not isinstance(rows, bool) and rows >= 1)):
            raise TrajscopeError(f"prefill_rows must be 'all' or a whole number ≥ 1, not {rows!r}.")
        object.__setattr__(self, "residual_layers", _freeze_layers(self.residual_layers))
        object.__setattr__(self, "attention_layers", _freeze_layers(self.attention_layers))
        steering = tuple(self.steering or ())
        for vec in steering:
            if not isinstance(vec, SteeringVector):
                raise TrajscopeError(f"steering takes SteeringVector objects, not {type(vec).__name__}.")
        object.__setattr__(self, "steering", steering)

    @property
    def prefill_row_limit(self) -> int | None:
        """How many prefill rows to compute: None for all (``"all"``, or full attention tensors kept)."""
        return None if (self.prefill_rows == "all" or self.attention_layers) else int(self.prefill_rows)

    def replace(self, **changes: Any) -> "CaptureConfig":
        """A copy with ``changes`` applied (validated like a new config)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TrajscopeError(f"Unknown capture setting(s): {', '.join(sorted(unknown))}.")
        return dataclasses.replace(self, **changes)

    @property
    def sampling(self) -> dict[str, Any]:
        """The sampling settings as ``meta.json`` records them."""
        return {"do_sample": self.temperature > 0, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "seed": self.seed, "max_new_tokens": self.max_new_tokens,
                "stop_at_eos": self.stop_at_eos}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings; steering vectors, the SAE and the probe are summarised."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in ("steering", "sae", "probe")}
        for k in ("residual_layers", "attention_layers"):
            if isinstance(d[k], tuple):
                d[k] = list(d[k])
        d["steering"] = [v.to_dict() for v in self.steering]
        d["sae"] = None if self.sae is None else {"hook_name": self.sae.cfg.hook_name, "d_sae": self.sae.cfg.d_sae,
                                                  "architecture": self.sae.cfg.architecture}
        d["probe"] = None if self.probe is None else self.probe.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], **attachments: Any) -> "CaptureConfig":
        """Rebuild from :meth:`to_dict` (or ``meta["capture"]``); pass ``steering=``, ``sae=``, ``probe=`` objects."""
        names = {f.name for f in dataclasses.fields(cls)} - {"steering", "sae", "probe"}
        return cls(**{k: v for k, v in d.items() if k in names}, **attachments)
