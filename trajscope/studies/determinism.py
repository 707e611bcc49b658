"""The determinism floor: how much activations move when nothing that matters changes.

Every other serving delta (batching, chunked prefill, prefix reuse) is read against this
envelope. For each dtype the device runs (float32, bfloat16, float16; a dtype it cannot run
is one clear error), each prompt is run once as the base and then again under conditions
that change nothing mathematically:

- ``repeat``: the same forward again (run-to-run noise);
- ``deterministic``: ``torch.use_deterministic_algorithms(True)``;
- ``threads``: another CPU thread count (1, or 2 when running on 1; a different reduction split; CPU only);
- ``tf32``: TF32 matmuls allowed (CUDA only; a precision change, reported but not in the floor).

Two precision references complete it: ``vs_float64`` compares the base with the same model
in float64 (the rounding error of the dtype's own computation) and ``vs_float32`` compares a
lower-precision base with the float32 base (what choosing bf16/fp16 does to a dataset).

:func:`floor_by_layer` turns the table into the floor per dtype and layer::

    floor_rel_l2 = max(max rel L2 over repeat / deterministic / threads,
                       2 × max rel L2 vs float64)

— two computations that are each within ε of the exact value can differ by up to 2ε, so a
delta below the floor is indistinguishable from rounding (max over prompts and positions).

Columns of :func:`determinism_study`'s frame: ``prompt_id``, ``dtype``, ``condition``,
``repeat``, ``layer``, ``pos``, ``l2``, ``rel_l2``, ``cos``, ``greedy_ref``, ``greedy``,
``greedy_diverged`` (argmax next token differs from the reference's), and the provenance
columns (``device``, ``tf32``, ``deterministic``, ``batch_size``, …) of the compared run.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import polars as pl
import torch

from trajscope.errors import TrajscopeError
from trajscope.model.forward import check_dtype
from trajscope.studies.common import Provenance, delta_frame

FLOOR_CONDITIONS = ("repeat", "deterministic", "threads")
DEFAULT_DTYPES = ("float32", "bfloat16", "float16")


def sibling(model: Any, dtype: str) -> Any:
    """``model`` itself when it already runs in ``dtype``, else the same weights loaded in ``dtype``
    on the same device (checked first with :func:`~trajscope.model.forward.check_dtype`)."""
    from trajscope.model.load import load_model

    check_dtype(model.device, dtype)
    if model.dtype == dtype:
        return model
    if model.remote:
        raise TrajscopeError("The determinism study loads the model in several dtypes, so it needs a local model.")
    return load_model(model.source_path or model.model_id, device=model.device, dtype=dtype)


def runnable_dtypes(device: str, wanted: Sequence[str] | None = None) -> list[str]:
    """The dtypes to study: ``wanted`` (each must run on ``device``, else one clear error), or by
    default those of float32 / bfloat16 / float16 that the device runs (others skipped silently)."""
    if wanted:
        for d in wanted:
            check_dtype(device, d)
        return list(dict.fromkeys(wanted))
    out = []
    for d in DEFAULT_DTYPES:
        try:
            check_dtype(device, d)
            out.append(d)
        except TrajscopeError:
            pass
    return out


def _run(model: Any, ids: list[int], layers: list[int], **numerics: Any) -> tuple[Any, Provenance]:
    with model.numerics(**numerics):
        return model.forward(ids, layers=layers), Provenance.of(model)


def determinism_study(model: Any, prompts: Sequence[tuple[str, list[int]]], *, dtypes: Sequence[str] | None = None,
                      repeats: int = 2, layers: Sequence[int] | None = None, float64_reference: bool = True,
                      progress: Any = None) -> pl.DataFrame:
    """Repeat each prompt's forward under floor conditions, per dtype; deltas per layer and position.

    Args:
        model: a local :class:`~trajscope.model.ModelHandle`; other dtypes are loaded beside it.
        prompts: ``(prompt_id, token ids)`` pairs (:func:`trajscope.studies.prompts.encode_prompts`).
        dtypes: dtypes to study (default: float32, bfloat16, float16 where the device runs them).
        repeats: repeated runs per prompt and dtype (``repeat`` condition).
        layers: blocks to compare (default all).
        float64_reference: also compare with a float64 copy (the rounding part of the floor).
        progress: optional callable ``(done, total)``.
    Returns:
        The long frame described in the module docstring.
    """
    if repeats < 1:
        raise TrajscopeError(f"repeats must be at least 1, not {repeats}.")
    layers = list(range(model.n_layers)) if layers is None else [int(x) for x in layers]
    dts = runnable_dtypes(model.device, dtypes)
    handles = {d: sibling(model, d) for d in dts}
    ref64 = None
    if float64_reference:
        try:
            ref64 = sibling(model, "float64")
        except TrajscopeError:
            ref64 = None  # e.g. MPS: the floor is then the measured noise alone
    cuda = model.device.startswith("cuda")
    now, cores = torch.get_num_threads(), os.cpu_count() or 1
    other_threads = 1 if now > 1 else (min(2, cores) if cores > 1 else 0)
    frames = []
    for n, (pid, ids) in enumerate(prompts):
        exact = _run(ref64, ids, layers, tf32=False)[0] if ref64 is not None else None
        bases = {}
        for d, h in handles.items():
            base, prov = _run(h, ids, layers, tf32=False, deterministic=False)
            bases[d] = base
            runs = [("repeat", r, {"tf32": False, "deterministic": False}) for r in range(1, repeats + 1)]
            runs.append(("deterministic", 0, {"tf32": False, "deterministic": True}))
            if not cuda and other_threads:
                runs.append(("threads", 0, {"tf32": False, "threads": other_threads}))
            if cuda and d == "float32":
                runs.append(("tf32", 0, {"tf32": True}))
            for cond, rep, kw in runs:
                other, p = _run(h, ids, layers, **kw)
                frames.append(p.with_columns(delta_frame(base.resid, other.resid, logits_a=base.logits,
                                                         logits_b=other.logits, prompt_id=pid, dtype=d,
                                                         condition=cond, repeat=rep)))
            if exact is not None:
                frames.append(prov.with_columns(delta_frame(exact.resid, base.resid, logits_a=exact.logits,
                                                            logits_b=base.logits, prompt_id=pid, dtype=d,
                                                            condition="vs_float64", repeat=0)))
        for d in dts:
            if d != "float32" and "float32" in bases:
                frames.append(Provenance.of(handles[d], tf32=False, deterministic=False).with_columns(
                    delta_frame(bases["float32"].resid, bases[d].resid, logits_a=bases["float32"].logits,
                                logits_b=bases[d].logits, prompt_id=pid, dtype=d, condition="vs_float32", repeat=0)))
        if progress is not None:
            progress(n + 1, len(prompts))
    return pl.concat(frames, how="vertical_relaxed")


def floor_by_layer(det: pl.DataFrame) -> pl.DataFrame:
    """The determinism floor per dtype and layer (module docstring).

    Returns:
        ``dtype``, ``layer``, ``noise_rel_l2`` (max over the floor conditions), ``rounding_rel_l2``
        (max vs float64; null without that reference), ``floor_rel_l2``, ``noise_l2``, ``floor_l2``
        (the same in absolute L2) and ``n_prompts``.
    """
    noise = det.filter(pl.col("condition").is_in(FLOOR_CONDITIONS)).group_by("dtype", "layer").agg(
        noise_rel_l2=pl.col("rel_l2").max(), noise_l2=pl.col("l2").max(), n_prompts=pl.col("prompt_id").n_unique())
    rnd = det.filter(pl.col("condition") == "vs_float64").group_by("dtype", "layer").agg(
        rounding_rel_l2=pl.col("rel_l2").max(), rounding_l2=pl.col("l2").max())
    out = noise.join(rnd, on=["dtype", "layer"], how="left").with_columns(
        floor_rel_l2=pl.max_horizontal("noise_rel_l2", 2 * pl.col("rounding_rel_l2").fill_null(0.0)),
        floor_l2=pl.max_horizontal("noise_l2", 2 * pl.col("rounding_l2").fill_null(0.0)))
    return out.select("dtype", "layer", "noise_rel_l2", "rounding_rel_l2", "floor_rel_l2", "noise_l2", "floor_l2",
                      "n_prompts").sort("dtype", "layer")


def measure_floor(model: Any, prompts: Sequence[tuple[str, list[int]]], layers: Sequence[int] | None = None) -> pl.DataFrame:
    """The floor of ``model``'s own dtype only (what the other studies compare against by default)."""
    return floor_by_layer(determinism_study(model, prompts, dtypes=[model.dtype], repeats=1, layers=layers))
