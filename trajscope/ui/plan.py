"""CapturePlan: what the app will capture, frozen at the moment Generate is clicked.

The app decides what a run records from what is on screen, so every visible
analysis has its data: the SAE card needs the residuals of the SAE's layer, the
Drift card the residuals of the layers its profile scores, the attention
heatmap the full rows of the layer shown. On top of that the user names layers
explicitly ("keep residuals of layers", "keep full attention rows of layers").

Explicit layers are validated against the model (a typo is an error); layers
that only follow from the screen are *wanted*: those the loaded model lacks are
dropped (the card then says why it is empty) instead of failing the run. The
model is only known after loading, so a plan holds a frozen
:class:`~trajscope.capture.CaptureConfig` (explicit layers) plus the wanted
layers, and :meth:`CapturePlan.for_model` resolves both for a model. Nothing in
it is read from the app state after the click. No Panel here.

Wanted layers are per model: an SAE or profile fitted on a model of another
width (the sample SAE on SmolLM2) wants nothing of this one, and the shipped
SAE / profile that fit the loaded model (:mod:`trajscope.ui.artefacts`) add
their layers, so a run keeps what the cards need *for its model*.
"""

from __future__ import annotations

import dataclasses

from trajscope.capture.config import CaptureConfig, resolve_layers


def _merge(explicit, wanted: tuple[int, ...], n_layers: int, what: str):
    """``"all"`` stays all; otherwise the explicit (validated) layers plus the wanted ones that exist."""
    if explicit == "all":
        return "all"
    layers = set(resolve_layers(explicit, n_layers, what))
    layers |= {w for w in wanted if 0 <= w < n_layers}
    return tuple(sorted(layers)) or None


@dataclasses.dataclass(frozen=True)
class CapturePlan:
    """A capture config plus the layers the visible analyses want.

    Attributes:
        config: the settings the user typed (explicit layer lists included).
        want_residuals: layers whose residuals the SAE / Drift cards need.
        want_attention: layers whose full attention rows the attention view needs.
        float16: the saved run's attention rows in float16 (:mod:`trajscope.ui.storage`).
        want_if_width: ``(layer, width)`` pairs: residual layers wanted only on a model of that width
            (the SAE's and the profile's layers).
        shipped: add the layers of the shipped SAE and profile that fit the model.
        attention_middle: keep the full rows of the model's middle layer (the layer a run of a model not
            on screen yet opens on) instead of ``want_attention``.
    """

    config: CaptureConfig
    want_residuals: tuple[int, ...] = ()
    want_attention: tuple[int, ...] = ()
    float16: bool = True
    want_if_width: tuple[tuple[int, int], ...] = ()
    shipped: bool = False
    attention_middle: bool = False

    def wanted_residuals(self, n_layers: int, d_model: int | None = None, model_id: str | None = None) -> tuple[int, ...]:
        """Residual layers the cards want on this model (see the class docstring)."""
        want = set(self.want_residuals) | {layer for layer, width in self.want_if_width if width == d_model}
        if self.shipped and d_model is not None:
            from trajscope.ui import artefacts
            from trajscope.sae.model import SAE

            facts = {"model_id": model_id, "n_layers": n_layers, "d_model": d_model}
            sae = artefacts.find_sae(facts)
            if sae is not None:
                want.add(int(SAE.load(str(sae)).cfg.layer))
            if artefacts.find_profile(facts) is not None:
                want |= set(artefacts.drift_layers(n_layers))
        return tuple(sorted(w for w in want if 0 <= w < n_layers))

    def kept_layers(self, n_layers: int, d_model: int | None = None, model_id: str | None = None) -> tuple[int, int]:
        """``(attention layers, residual layers)`` this plan keeps on that model (counts).

        Raises:
            TrajscopeError: an explicit layer outside ``0..n_layers-1``.
        """
        c = self.for_model(n_layers, d_model, model_id)

        def count(spec):
            return n_layers if spec == "all" else len(spec or ())

        return count(c.attention_layers), count(c.residual_layers)

    def for_model(self, n_layers: int, d_model: int | None = None, model_id: str | None = None) -> CaptureConfig:
        """The config to capture with on a model of ``n_layers`` blocks, ``d_model`` wide (when known).

        Raises:
            TrajscopeError: an explicit layer outside ``0..n_layers-1``.
        """
        c = self.config
        return c.replace(
            residual_layers=_merge(c.residual_layers, self.wanted_residuals(n_layers, d_model, model_id), n_layers,
                                   "Keep residuals of layers"),
            attention_layers=_merge(c.attention_layers,
                                    (n_layers // 2,) if self.attention_middle else self.want_attention, n_layers,
                                    "Keep full attention rows of layers"))
