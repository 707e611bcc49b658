"""The import graph of ``trajscope/``, read with ``ast`` (no module runs): no cycles, no upward imports.

Every ``import`` and ``from … import`` counts, at module level and inside functions alike (a lazy
import is still a dependency). The rules (issue 29's acceptance):

- no import cycles between modules (``trajscope/__init__`` aside: it only re-exports);
- ``trajscope/metrics/`` imports nothing from ``trajscope.studies``, ``trajscope.ui`` or
  ``trajscope.cli``, directly or through other modules;
- ``trajscope/sae/`` holds the SAE object only (``model``, ``config``, ``io``) and imports nothing
  above it (errors, the atomic-write helpers and itself);
- ``trajscope/ui/views/`` imports no ``trajscope.capture``, ``trajscope.sae``,
  ``trajscope.features`` or ``trajscope.model`` module: views take those through
  ``trajscope.ui``'s state, artefacts and runner modules.

Each rule is a pure function over an edge list, and each is shown failing on a planted violation.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Iterable, Mapping

ROOT = pathlib.Path(__file__).resolve().parents[1] / "trajscope"

SAE_OBJECT = {"trajscope.sae", "trajscope.sae.model", "trajscope.sae.config", "trajscope.sae.io"}
SAE_MAY_IMPORT = ("trajscope.sae", "trajscope.errors", "trajscope.io")
VIEWS_MAY_NOT = ("trajscope.capture", "trajscope.sae", "trajscope.features", "trajscope.model")
METRICS_MAY_NOT = ("trajscope.studies", "trajscope.ui", "trajscope.cli")

Graph = Mapping[str, set[str]]


def _in(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


def module_names(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """``dotted.name -> file`` for every ``.py`` under ``root`` (a package directory)."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from pkg import mod`` resolves to ``pkg.mod``)."""
    modules = module_names(root)
    top = root.name

    def resolve(mod: str, name: str | None) -> str | None:
        if name and f"{mod}.{name}" in modules:
            return f"{mod}.{name}"
        while mod and mod not in modules:
            mod = mod.rpartition(".")[0]
        return mod or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {resolve(a.name, None) for a in node.names if a.name.split(".")[0] == top}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                if base.split(".")[0] == top:
                    found |= {resolve(base, a.name) for a in node.names}
        graph[name] = {m for m in found if m and m != name}
    return graph


def cycles(graph: Graph, skip: Iterable[str] = ()) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), ``skip`` left out of the graph."""
    skip = set(skip)
    g = {m: {n for n in e if n not in skip} for m, e in graph.items() if m not in skip}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def reach(graph: Graph, start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for n in graph.get(todo.pop(), ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def metrics_violations(graph: Graph) -> dict[str, list[str]]:
    """Metrics modules that reach studies, UI or CLI (through any chain of imports)."""
    out = {}
    for m in graph:
        if _in(m, "trajscope.metrics"):
            bad = sorted(n for n in reach(graph, m) if any(_in(n, p) for p in METRICS_MAY_NOT))
            if bad:
                out[m] = bad
    return out


def sae_violations(graph: Graph) -> dict[str, list[str]]:
    """Modules in ``trajscope/sae/`` that are not the SAE object, and SAE modules importing above it."""
    out = {}
    for m in graph:
        if not _in(m, "trajscope.sae"):
            continue
        bad = sorted(n for n in graph[m] if not any(_in(n, p) for p in SAE_MAY_IMPORT))
        if m not in SAE_OBJECT:
            bad.insert(0, "(not the SAE object: belongs in trajscope.features)")
        if bad:
            out[m] = bad
    return out


def view_violations(graph: Graph) -> dict[str, list[str]]:
    """View modules importing capture, SAE, features or model modules directly."""
    out = {}
    for m in graph:
        if _in(m, "trajscope.ui.views"):
            bad = sorted(n for n in graph[m] if any(_in(n, p) for p in VIEWS_MAY_NOT))
            if bad:
                out[m] = bad
    return out


GRAPH = import_graph(ROOT)


# ---- the package ---------------------------------------------------------------------------------
def test_the_graph_sees_lazy_and_relative_imports():
    assert "trajscope.model" in GRAPH["trajscope.capture"]
    assert "trajscope.sae.model" in GRAPH["trajscope.capture.attachments"]  # imported inside a function
    assert "trajscope.ui.runner" in GRAPH["trajscope.studies.steering.card"]  # ditto
    assert {"trajscope.sae", "trajscope.features", "trajscope.metrics", "trajscope.ui.views"} <= set(GRAPH)


def test_no_import_cycles():
    assert not cycles(GRAPH, skip={"trajscope"}), "import cycles"


def test_metrics_import_no_studies_ui_or_cli():
    assert not metrics_violations(GRAPH)


def test_sae_holds_the_sae_object_only():
    assert {m for m in GRAPH if _in(m, "trajscope.sae")} == SAE_OBJECT
    assert not sae_violations(GRAPH)


def test_views_import_no_capture_sae_or_model_internals():
    assert not view_violations(GRAPH)


# ---- the rules can fail ---------------------------------------------------------------------------
def test_planted_violations_are_found():
    planted = {
        "trajscope.metrics.a": {"trajscope.metrics.b"},
        "trajscope.metrics.b": {"trajscope.studies.x"},  # metrics reaching a study, one module removed
        "trajscope.studies.x": {"trajscope.metrics.a"},  # and a cycle a → b → x → a
        "trajscope.sae": {"trajscope.sae.model"},
        "trajscope.sae.model": {"trajscope.errors"},
        "trajscope.sae.harvest": {"trajscope.capture"},  # not the object, and above it
        "trajscope.ui.views.v": {"trajscope.ui.artefacts", "trajscope.capture.config"},
        "trajscope.ui.artefacts": {"trajscope.sae.model"},  # allowed: the views' way in
    }
    assert cycles(planted) == [["trajscope.metrics.a", "trajscope.metrics.b", "trajscope.studies.x"]]
    assert cycles(planted, skip={"trajscope.studies.x"}) == []
    assert metrics_violations(planted) == {"trajscope.metrics.a": ["trajscope.studies.x"],
                                           "trajscope.metrics.b": ["trajscope.studies.x"]}
    assert sae_violations(planted) == {"trajscope.sae.harvest": [
        "(not the SAE object: belongs in trajscope.features)", "trajscope.capture"]}
    assert view_violations(planted) == {"trajscope.ui.views.v": ["trajscope.capture.config"]}


def test_the_walk_reads_a_module_tree(tmp_path):
    """A planted tree on disk: a function-level import closing a cycle and a relative import are seen."""
    pkg = tmp_path / "trajscope"
    (pkg / "metrics").mkdir(parents=True)
    (pkg / "ui" / "views").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "metrics" / "__init__.py").write_text("")
    (pkg / "metrics" / "m.py").write_text("from trajscope.ui import state\n")
    (pkg / "ui" / "__init__.py").write_text("")
    (pkg / "ui" / "state.py").write_text("def f():\n    from trajscope.metrics import m\n")
    (pkg / "ui" / "views" / "__init__.py").write_text("")
    (pkg / "ui" / "views" / "v.py").write_text("from ...capture import run\n")
    (pkg / "capture.py").write_text("")
    g = import_graph(pkg)
    assert g["trajscope.metrics.m"] == {"trajscope.ui.state"} and g["trajscope.ui.state"] == {"trajscope.metrics.m"}
    assert cycles(g) == [["trajscope.metrics.m", "trajscope.ui.state"]]
    assert metrics_violations(g) == {"trajscope.metrics.m": ["trajscope.ui.state"]}
    assert view_violations(g) == {"trajscope.ui.views.v": ["trajscope.capture"]}
