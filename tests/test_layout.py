"""The package's shape, checked by walking its imports with ``ast`` (no module is executed).

- (no import cycles and no upward imports: :mod:`tests.test_import_graph`);
- only the model boundary (``trajscope/model/``) imports nnsight or reaches into the raw
  Hugging Face module (``torch_module()``, ``._module``, ``handle.nn``, forward hooks);
- ``trajscope.metrics`` never reaches capture, profile building, the model or the UI, even
  through other modules;
- UI state modules (``trajscope/ui/*state*.py``) never reach Panel;
- no source file is much longer than the style guide's ~400 lines.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "trajscope"
BOUNDARY = "trajscope.model"
VLLM = "trajscope.vllm"  # its own boundary: hooks on vLLM's model, inside vLLM's worker
MAX_LINES = 430  # "about 400" (STYLE.md)


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(mod: str, name: str | None) -> str | None:
    """The trajscope module that ``from mod import name`` (or ``import mod``) loads."""
    if name and f"{mod}.{name}" in MODULES:
        return f"{mod}.{name}"
    while mod and mod not in MODULES:
        mod = mod.rpartition(".")[0]
    return mod or None


def _imports(name: str) -> tuple[set[str], set[str]]:
    """(trajscope modules imported, outside top-level packages imported) by one module."""
    tree = ast.parse(MODULES[name].read_text())
    inner, outer = set(), set()
    is_pkg = MODULES[name].name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "trajscope":
                    inner.add(_resolve(alias.name, None))
                else:
                    outer.add(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name if is_pkg else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            if base.split(".")[0] == "trajscope":
                for alias in node.names:
                    inner.add(_resolve(base, alias.name))
            else:
                outer.add(base.split(".")[0])
    inner.discard(None)
    inner.discard(name)
    return inner, outer


GRAPH = {m: _imports(m) for m in MODULES}


def _closure(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        for n in GRAPH[m][0]:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def _in(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


def test_the_walk_sees_the_package():
    assert {"trajscope.model", "trajscope.capture", "trajscope.positions", "trajscope.metrics.attention"} <= set(MODULES)
    assert "trajscope.model" in GRAPH["trajscope.capture"][0]
    assert "nnsight" in GRAPH["trajscope.model.generation"][1]


def test_no_module_imports_the_package_root_for_its_own_use():
    users = [m for m in MODULES if m != "trajscope" and "trajscope" in GRAPH[m][0] and not _in(m, "trajscope.ui")]
    assert not users, f"import the defining module, not 'trajscope': {users}"


def _raw_model_uses(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            if node.attr in ("torch_module", "_module", "register_forward_hook", "register_forward_pre_hook"):
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
            elif node.attr == "nn" and not (isinstance(node.value, ast.Name) and node.value.id == "torch"):
                found.append(f"{path.name}:{node.lineno} .nn")
    return found


def test_only_the_model_boundary_runs_the_model():
    offenders = {m: sorted(GRAPH[m][1] & {"nnsight"}) for m in MODULES if not _in(m, BOUNDARY)}
    assert not {m: v for m, v in offenders.items() if v}, "nnsight imported outside trajscope.model"
    raw = {m: _raw_model_uses(p) for m, p in MODULES.items() if not _in(m, BOUNDARY) and not _in(m, VLLM)}
    assert not {m: v for m, v in raw.items() if v}, f"raw Hugging Face module used outside the boundary: {raw}"


@pytest.mark.parametrize("metric", sorted(m for m in MODULES if _in(m, "trajscope.metrics")))
def test_metrics_stay_pure(metric):
    bad = {m for m in _closure(metric) for pkg in ("trajscope.capture", "trajscope.studies",
                                                    "trajscope.model", "trajscope.ui", "trajscope.features.harvest")
           if _in(m, pkg)}
    outside = set().union(*(GRAPH[m][1] for m in _closure(metric) | {metric}))
    assert not bad, f"{metric} reaches {sorted(bad)}"
    assert not outside & {"nnsight", "panel", "holoviews", "transformers"}, f"{metric} reaches {outside}"


@pytest.mark.parametrize("state", sorted(m for m in MODULES if _in(m, "trajscope.ui") and "state" in m.rpartition(".")[2]))
def test_ui_state_never_reaches_panel(state):
    outside = set().union(*(GRAPH[m][1] for m in _closure(state) | {state}))
    assert "panel" not in outside and "holoviews" not in outside, f"{state} reaches {outside & {'panel', 'holoviews'}}"


def test_files_stay_short():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_the_walker_catches_what_it_looks_for(tmp_path):
    """The checks can fail: a planted raw-module call is found, and the closure follows imports."""
    f = tmp_path / "bad.py"
    f.write_text("def f(h):\n    return h.torch_module()(x), h.nn.trace\n")
    assert len(_raw_model_uses(f)) == 2
    assert "trajscope.capture" in _closure("trajscope.features.harvest")
