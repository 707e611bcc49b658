"""The drift study's reference: a prefill profile built by running the model over a prompt set.

:func:`build_profile` captures the prefill of every prompt (one step, every
layer's residual kept) and fits a :class:`~trajscope.profile.ReferenceProfile`
with :func:`~trajscope.profile.profile_from_residuals`. With ``split`` (named id
lists from :func:`trajscope.stats.split_ids`), only the ``fit`` prompts fit the
moments and only the ``calibrate`` prompts set the threshold; the split travels
in ``profile.info["split"]`` so that a drift report evaluates on the rest. It
lives apart from :mod:`trajscope.profile` so that scoring against a profile
(used by metrics and the UI) never imports the capture engine.
:func:`named_split` and :func:`prompt_ids` name the prompts that split.
"""

from __future__ import annotations

from typing import Any, Sequence

from trajscope import positions
from trajscope.capture import capture
from trajscope.errors import TrajscopeError
from trajscope.profile import ReferenceProfile, profile_from_residuals

SPLIT_NAMES = ("fit", "calibrate", "evaluate")
SPLIT_FRACTIONS = (0.4, 0.3, 0.3)


def build_profile(model: Any, prompts: Sequence[str | Sequence[int]], *, fpr: float = 0.01, skip_first: bool = positions.SKIP_SINK,
                  heldout_fraction: float = 0.3, seed: int = 0, progress: bool = True,
                  ids: Sequence[Any] | None = None, split: dict[str, Any] | None = None) -> ReferenceProfile:
    """Capture the prefill of every prompt (one step, all layers) and fit a profile.

    Args:
        model: a :class:`~trajscope.model.ModelHandle`.
        prompts: prompt texts or token-id lists (at least two).
        skip_first: leave position 0 out (the attention sink: :data:`trajscope.positions.SKIP_SINK`);
            recorded in ``profile.info`` with :func:`trajscope.positions.sink_meta`.
        ids: one id per prompt (needed with ``split``).
        split: ``{"fit": [ids], "calibrate": [ids], ...}``; prompts in neither list are not run. Without it a
            seeded permutation keeps ``heldout_fraction`` of the prompts for calibration.
    """
    from tqdm.auto import tqdm

    if len(prompts) < 2:
        raise TrajscopeError("A profile needs at least two prompts (one to fit, one to calibrate).")
    if split is not None:
        if ids is None or len(ids) != len(prompts):
            raise TrajscopeError("A profile built on a named split needs one id per prompt.")
        pos = {i: k for k, i in enumerate(ids)}
        missing = [i for i in [*split["fit"], *split["calibrate"]] if i not in pos]
        if missing:
            raise TrajscopeError(f"The split names prompts that are not in the prompt set, e.g. {missing[0]!r}.")
        chosen = [pos[i] for i in split["fit"]] + [pos[i] for i in split["calibrate"]]
        prompts = [prompts[k] for k in chosen]
    res = []
    for prompt in tqdm(prompts, desc="prefill profile", unit="prompt", disable=not progress):
        traj = capture(model, prompt, max_new_tokens=1, residual_layers="all", stop_at_eos=False)
        start = positions.first_reference_pos(skip_first)
        res.append({layer: traj.residual(layer)[start: traj.prompt_len] for layer in range(model.n_layers)})
    info = {"model_id": model.model_id, "revision": model.revision(), "n_layers": model.n_layers,
            "d_model": model.d_model, "skip_first": skip_first, **positions.sink_meta(skip_first)}
    if split is None:
        return profile_from_residuals(res, fpr=fpr, heldout_fraction=heldout_fraction, seed=seed, info=info)
    n_fit = len(split["fit"])
    info["split"] = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in split.items()}
    return profile_from_residuals(res, fpr=fpr, seed=seed, info=info, fit=range(n_fit),
                                  calibrate=range(n_fit, len(res)))


def named_split(ids: Sequence[Any], seed: int = 0, fractions: Sequence[float] = SPLIT_FRACTIONS) -> dict[str, Any]:
    """The fit / calibrate / evaluate split of prompt ids (:func:`trajscope.stats.split_ids`) with its settings.

    Returns:
        ``{"fit": [ids], "calibrate": [ids], "evaluate": [ids], "seed": seed, "fractions": [..]}``.
    """
    from trajscope.stats import split_ids

    if len(set(ids)) != len(ids):
        raise TrajscopeError("Prompt ids must be unique to split them into fit / calibrate / evaluate sets.")
    parts = split_ids(list(ids), fractions=fractions, names=SPLIT_NAMES, seed=seed)
    return {**parts, "seed": int(seed), "fractions": [float(f) for f in fractions]}


def prompt_ids(items: Sequence[dict]) -> list[str]:
    """Each prompt record's ``id`` (as a string), or ``prompt-<k>`` (its 0-based index) for records without one."""
    return [str(it["id"]) if it.get("id") is not None else f"prompt-{k}" for k, it in enumerate(items)]
