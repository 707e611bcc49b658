"""The drift study's reference: a prefill profile built by running the model over a prompt set.

:func:`build_profile` captures the prefill of every prompt (one step, every
layer's residual kept) and fits a :class:`~trajscope.profile.ReferenceProfile`
with :func:`~trajscope.profile.profile_from_residuals`. With ``split`` (named id
lists from :func:`trajscope.stats.split_ids`), only the ``fit`` prompts fit the
moments and only the ``calibrate`` prompts set the threshold; the split travels
in ``profile.info["split"]`` so that a drift report evaluates on the rest. It
lives apart from :mod:`trajscope.profile` so that scoring against a profile
(used by metrics and the UI) never imports the capture engine.

:func:`named_split` splits **by source file**: prompts cut from one file are
correlated, so fit, calibrate and evaluate take whole files
(:func:`trajscope.stats.split_ids` with ``groups``), and an evaluate prompt is out
of file. A prompt's file is its record's ``file`` field, else its id up to the
first ``#`` or ``:`` (``base64.py:51:b64encode`` → ``base64.py``; an id with
neither is its own file): :func:`source_files`. :func:`check_file_disjoint`
refuses a split whose parts share a file. :func:`prompt_ids` names the prompts.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

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
        check_file_disjoint(split, split.get("file_of") or {})
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


def file_of(prompt_id: Any) -> str:
    """A prompt id's source file: the id up to the first ``#`` or ``:`` (the whole id when it has neither)."""
    return re.split(r"[#:]", str(prompt_id), maxsplit=1)[0] or str(prompt_id)


def source_files(items: Sequence[dict]) -> list[str]:
    """Each prompt record's source file: its ``file`` field, else :func:`file_of` its id (:func:`prompt_ids`)."""
    return [str(it["file"]) if it.get("file") else file_of(i) for it, i in zip(items, prompt_ids(items))]


def named_split(ids: Sequence[Any], seed: int = 0, fractions: Sequence[float] = SPLIT_FRACTIONS,
                groups: Sequence[str] | None = None) -> dict[str, Any]:
    """The fit / calibrate / evaluate split of prompt ids by source file, with its settings.

    Args:
        ids: distinct prompt ids.
        seed, fractions: of :func:`trajscope.stats.split_ids` (fractions of the *files*).
        groups: each prompt's source file (default :func:`file_of` its id).
    Returns:
        ``{"fit": [ids], "calibrate": [ids], "evaluate": [ids], "seed": seed, "fractions": [..],
        "by": "source file", "files": {part: [files]}, "file_of": {id: file}}``.
    """
    from trajscope.stats import split_ids

    ids = list(ids)
    if len(set(ids)) != len(ids):
        raise TrajscopeError("Prompt ids must be unique to split them into fit / calibrate / evaluate sets.")
    groups = [file_of(i) for i in ids] if groups is None else [str(g) for g in groups]
    if len(groups) != len(ids):
        raise TrajscopeError(f"named_split needs one source file per prompt ({len(ids)} ids, {len(groups)} files).")
    if len(set(groups)) < len(SPLIT_NAMES):
        raise TrajscopeError(f"The drift split is by source file and needs prompts from at least {len(SPLIT_NAMES)} "
                             f"files; these {len(ids)} prompts come from {len(set(groups))} "
                             f"({', '.join(sorted(set(groups))[:3])}).")
    parts = split_ids(ids, fractions=fractions, names=SPLIT_NAMES, seed=seed, groups=groups)
    where = dict(zip(ids, groups))
    split = {**parts, "seed": int(seed), "fractions": [float(f) for f in fractions], "by": "source file",
             "files": {k: sorted({where[i] for i in parts[k]}) for k in SPLIT_NAMES}, "file_of": where}
    check_file_disjoint(split, where)
    return split


def check_file_disjoint(split: Mapping[str, Any], file_by_id: Mapping[Any, str] | None = None) -> None:
    """Refuse a split whose parts (fit, calibrate, evaluate where present) share a source file.

    Args:
        split: ``{"fit": [ids], "calibrate": [ids], "evaluate": [ids]?, ...}``.
        file_by_id: each id's source file (ids not in it: :func:`file_of` the id).
    """
    where = dict(file_by_id or {})
    files = {k: {where.get(i, file_of(i)) for i in split.get(k) or []} for k in SPLIT_NAMES}
    for a, b in (("fit", "calibrate"), ("fit", "evaluate"), ("calibrate", "evaluate")):
        shared = sorted(files[a] & files[b])
        if shared:
            raise TrajscopeError(f"The {a} and {b} prompts share {len(shared)} source file(s), e.g. '{shared[0]}'; "
                                 "the drift split must keep files disjoint (split with named_split).")


def prompt_ids(items: Sequence[dict]) -> list[str]:
    """Each prompt record's ``id`` (as a string), or ``prompt-<k>`` (its 0-based index) for records without one."""
    return [str(it["id"]) if it.get("id") is not None else f"prompt-{k}" for k, it in enumerate(items)]
