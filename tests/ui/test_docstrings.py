"""Every public parameter of trajscope's UI classes documents itself (``doc=``), as in Panel's own test."""

import inspect

import param
import pytest

import trajscope.studies.compaction.card
import trajscope.studies.compaction.state
import trajscope.studies.eviction.card
import trajscope.studies.eviction.state
import trajscope.studies.drift.card
import trajscope.studies.drift.state
import trajscope.studies.steering.card
import trajscope.studies.steering.state
import trajscope.ui.state
import trajscope.ui.views.app
import trajscope.ui.views.attention
import trajscope.ui.views.controls
import trajscope.ui.views.export
import trajscope.ui.views.feature_card
import trajscope.ui.views.features
import trajscope.ui.views.keys
import trajscope.ui.views.player
import trajscope.ui.views.telemetry
import trajscope.ui.views.tokens

MODULES = [trajscope.ui.state, trajscope.studies.compaction.state, trajscope.studies.compaction.card,
           trajscope.studies.eviction.state, trajscope.studies.eviction.card, trajscope.ui.views.app, trajscope.ui.views.attention, trajscope.ui.views.controls,
           trajscope.ui.views.export, trajscope.ui.views.feature_card,
           trajscope.ui.views.features, trajscope.ui.views.keys, trajscope.ui.views.player,
           trajscope.ui.views.telemetry, trajscope.ui.views.tokens,
           # the registered studies' cards and their state
           trajscope.studies.drift.card, trajscope.studies.drift.state, trajscope.studies.steering.card,
           trajscope.studies.steering.state]


def ui_classes():
    seen = {}
    for mod in MODULES:
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if issubclass(cls, param.Parameterized) and cls.__module__.startswith("trajscope."):
                seen[cls.__qualname__] = cls
    return sorted(seen.values(), key=lambda c: c.__name__)


def test_found_the_classes():
    names = {c.__name__ for c in ui_classes()}
    assert {"AppState", "TrajScope", "Controls", "StepPlayer", "TokenStrip", "AttentionView", "TelemetryView",
            "ExportView", "ArrowKeys", "DriftView", "DriftSettings", "SteeringView", "SteeringSettings"} <= names


@pytest.mark.parametrize("cls", ui_classes(), ids=lambda c: c.__name__)
def test_every_public_param_has_doc(cls):
    own = [name for name, p in cls.param.objects("existing").items()
           if not name.startswith("_") and p.owner.__module__.startswith("trajscope.")]
    missing = [n for n in own if not (cls.param[n].doc or "").strip()]
    assert not missing, f"{cls.__name__} params without doc=: {missing}"
    assert (cls.__doc__ or "").strip(), f"{cls.__name__} has no docstring"
