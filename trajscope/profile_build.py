"""Building a prefill profile by running the model over a prompt set.

:func:`build_profile` captures the prefill of every prompt (one step, every
layer's residual kept) and fits a :class:`~trajscope.profile.ReferenceProfile`
with :func:`~trajscope.profile.profile_from_residuals`. It lives apart from
:mod:`trajscope.profile` so that scoring against a profile (used by metrics and
the UI) never imports the capture engine.
"""

from __future__ import annotations

from typing import Any, Sequence

from trajscope.capture import capture
from trajscope.errors import TrajscopeError
from trajscope.profile import ReferenceProfile, profile_from_residuals


def build_profile(model: Any, prompts: Sequence[str], *, fpr: float = 0.01, skip_first: bool = True,
                  heldout_fraction: float = 0.3, seed: int = 0, progress: bool = True) -> ReferenceProfile:
    """Capture the prefill of every prompt (one step, all layers) and fit a profile.

    Args:
        model: a :class:`~trajscope.model.ModelHandle`.
        prompts: prompt texts (at least two).
        skip_first: leave position 0 out (attention-sink activations).
    """
    from tqdm.auto import tqdm

    if len(prompts) < 2:
        raise TrajscopeError("A profile needs at least two prompts (one to fit, one to calibrate).")
    res = []
    for prompt in tqdm(prompts, desc="prefill profile", unit="prompt", disable=not progress):
        traj = capture(model, prompt, max_new_tokens=1, residual_layers="all", stop_at_eos=False)
        start = 1 if skip_first else 0
        res.append({layer: traj.residual(layer)[start: traj.prompt_len] for layer in range(model.n_layers)})
    info = {"model_id": model.model_id, "revision": model.revision(), "n_layers": model.n_layers,
            "d_model": model.d_model, "skip_first": skip_first}
    return profile_from_residuals(res, fpr=fpr, heldout_fraction=heldout_fraction, seed=seed, info=info)
