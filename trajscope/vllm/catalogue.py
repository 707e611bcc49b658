"""The artefacts a vLLM server offers to requests: SAEs, prefill profiles and steering vectors, by name.

A server is started with ``TRAJSCOPE_VLLM_ARTEFACTS`` set to one or more
directories (``os.pathsep``-separated), each laid out like ``sample_data/smollm2``:

- ``saes/<name>/`` — SAEs in SAELens' format (``cfg.json`` + weights); the name is the folder's;
- ``profile.safetensors`` — a prefill profile named after the directory (``smollm2``), and
  ``profiles/<name>.safetensors`` — more profiles named by file stem;
- ``vectors/<name>.safetensors`` (or ``.npy``) — steering directions named by file stem.

A request names what it wants (:mod:`trajscope.vllm.request`); it never sends a path, so a
client cannot make the server read a file it was not given. When two directories offer the
same name, the first one listed wins. Files are read the first time a request names them and
kept (the weights are small beside the model).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

from trajscope.errors import TrajscopeError

ENV_ARTEFACTS = "TRAJSCOPE_VLLM_ARTEFACTS"


@dataclasses.dataclass
class Catalogue:
    """Named artefact paths, and the ones loaded so far.

    Attributes:
        saes, profiles, vectors: ``name -> path``.
    """

    saes: dict[str, pathlib.Path] = dataclasses.field(default_factory=dict)
    profiles: dict[str, pathlib.Path] = dataclasses.field(default_factory=dict)
    vectors: dict[str, pathlib.Path] = dataclasses.field(default_factory=dict)
    _loaded: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def scan(cls, roots: str | os.PathLike | list | None) -> "Catalogue":
        """Index the artefact directories ``roots`` (a list, or an ``os.pathsep``-separated string)."""
        if roots is None:
            return cls()
        if isinstance(roots, (str, os.PathLike)):
            roots = [r for r in str(roots).split(os.pathsep) if r]
        cat = cls()
        for root in map(pathlib.Path, roots):
            if not root.is_dir():
                raise TrajscopeError(f"The artefact directory '{root}' ({ENV_ARTEFACTS}) does not exist.")
            for d in sorted((root / "saes").glob("*/cfg.json")):
                cat.saes.setdefault(d.parent.name, d.parent)
            if (root / "profile.safetensors").is_file():
                cat.profiles.setdefault(root.resolve().name, root / "profile.safetensors")
            for f in sorted((root / "profiles").glob("*.safetensors")):
                cat.profiles.setdefault(f.stem, f)
            for f in sorted([*(root / "vectors").glob("*.safetensors"), *(root / "vectors").glob("*.npy")]):
                cat.vectors.setdefault(f.stem, f)
        return cat

    @classmethod
    def from_env(cls) -> "Catalogue":
        """The catalogue of ``$TRAJSCOPE_VLLM_ARTEFACTS`` (empty when unset)."""
        return cls.scan(os.environ.get(ENV_ARTEFACTS) or None)

    def _get(self, kind: str, name: str, table: dict[str, pathlib.Path], loader) -> Any:
        if name not in table:
            offered = ", ".join(sorted(table)) or "none"
            raise TrajscopeError(f"Unknown {kind} '{name}': this server offers {offered} "
                                 f"(set {ENV_ARTEFACTS} to add more).")
        key = (kind, name)
        if key not in self._loaded:
            self._loaded[key] = loader(table[name])
        return self._loaded[key]

    def sae(self, name: str) -> Any:
        """The SAE named ``name`` (a :class:`trajscope.sae.SAE`, float32, evaluation mode)."""
        from trajscope.sae.model import SAE

        return self._get("SAE", name, self.saes, lambda p: SAE.load(str(p)).float().eval())

    def profile(self, name: str) -> Any:
        """The :class:`trajscope.profile.ReferenceProfile` named ``name``."""
        from trajscope.profile import ReferenceProfile

        return self._get("profile", name, self.profiles, ReferenceProfile.load)

    def vector(self, name: str, layer: int | None = None) -> Any:
        """The :class:`trajscope.steering.SteeringVector` named ``name`` (its stored settings; ``layer`` overrides
        the stored layer and is needed when the file names none)."""
        from trajscope.steering import SteeringVector

        by_layer = self._get("steering vector", name, self.vectors, lambda p: {})
        if layer not in by_layer:
            by_layer[layer] = SteeringVector.load(self.vectors[name], layer=layer, name=name)
        return by_layer[layer]
