"""Feature labels: the names a user gives SAE features, kept beside the SAE.

An SAE's features are numbered, not named; after reading a feature's top
contexts (:mod:`trajscope.features.index`) a user writes down what it seems to detect
("for-loop header"). Labels live in ``labels.json`` in the SAE directory — a JSON
object ``{"123": "for-loop header", ...}`` — so they travel with the SAE and any
tool can read them. Each change is written at once, atomically (temporary file
in the same directory, then ``os.replace``). When the directory cannot be
written, the label is kept in memory for the session and :attr:`FeatureLabels.problem`
says so in one sentence; nothing typed is lost.
"""

from __future__ import annotations

import json
import os
import pathlib

from trajscope.io import atomic_write_text

LABELS_FILE = "labels.json"


def feature_name(feature: int, label: str | None = None) -> str:
    """``"f123"``, or ``"f123 · for-loop header"`` when the feature has a label."""
    return f"f{int(feature)} · {label}" if label else f"f{int(feature)}"


class FeatureLabels:
    """The labels of one SAE's features, read from and written to ``<directory>/labels.json``.

    Args:
        directory: the SAE directory (None: in memory only).
    """

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = None if directory is None else pathlib.Path(directory)
        self.labels: dict[int, str] = {}
        self.problem = ""
        path = self.path
        if path is not None and path.is_file():
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
                self.labels = {int(k): str(v) for k, v in dict(raw).items() if str(v).strip()}
            except (ValueError, TypeError, OSError) as exc:
                self.problem = f"{path} could not be read ({exc}); labels start empty and are not saved over it."
                self.directory = None

    @property
    def path(self) -> pathlib.Path | None:
        """``<directory>/labels.json`` (None when in memory only)."""
        return None if self.directory is None else self.directory / LABELS_FILE

    def get(self, feature: int) -> str:
        """The label of ``feature`` ("" when it has none)."""
        return self.labels.get(int(feature), "")

    def name(self, feature: int) -> str:
        """``feature`` as shown everywhere: ``"f123 · label"`` or ``"f123"``."""
        return feature_name(feature, self.get(feature))

    def set(self, feature: int, text: str) -> bool:
        """Label ``feature`` (empty text removes the label) and save. Returns True when it was written to disk.

        An unwritable directory keeps the label in memory and sets :attr:`problem`.
        """
        text = " ".join(str(text).split())
        if text:
            self.labels[int(feature)] = text
        else:
            self.labels.pop(int(feature), None)
        return self.save()

    def save(self) -> bool:
        """Write every label to ``labels.json`` (atomically); False, with :attr:`problem` set, if that fails."""
        if self.path is None:
            self.problem = self.problem or "These labels are kept in memory only (no SAE directory)."
            return False
        data = {str(k): v for k, v in sorted(self.labels.items())}
        try:
            atomic_write_text(self.path, json.dumps(data, indent=1, ensure_ascii=False))
        except OSError as exc:
            self.problem = (f"The SAE directory {self.directory} is not writable ({exc.strerror or exc}); labels are "
                            "kept for this session only. Copy the SAE to a writable directory to save them.")
            return False
        self.problem = ""
        return True
