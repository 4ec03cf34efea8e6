"""gptcore's imports form no cycle and never point up a floor (docs/architecture.md: the ground floor, then data,
model, eval and report, train, and gptcore/conf.py and gptcore/presets.py, which gather every section's config class,
on top). Every module counts, a package's __init__.py included, and so does every import: at the top, inside a
function, or only for type checking (`if TYPE_CHECKING:`), since each one ties the two modules together."""
from __future__ import annotations

import ast
from pathlib import Path

from tools.stage_deps import ROOT, module_file

FLOORS = {"data": 1, "model": 2, "eval": 3, "report": 3, "train": 4}  # a module at the top of gptcore/: 0
TOP = {"gptcore.conf", "gptcore.presets"}


def floor(module: str) -> int:
    parts = module.split(".")
    return 5 if module in TOP else FLOORS[parts[1]] if len(parts) > 2 else 0


def module_name(f: Path, root: Path) -> str:
    parts = f.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def explicit_imports(f: Path, root: Path) -> set[str]:
    """The modules `f`'s import statements name, anywhere in it (type-only ones too): `from a.b import c` is a.b, or
    a.b.c where c is a module. A package a module merely sits in is no import of its own."""
    pkg = f.relative_to(root).with_suffix("").parts[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), filename=str(f))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*pkg[:len(pkg) - node.level + 1], *([node.module] if node.module else [])]) \
                if node.level else node.module or ""
            subs = {f"{base}.{a.name}" for a in node.names if module_file(f"{base}.{a.name}", root) is not None}
            out.update(subs or {base})
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """gptcore module (a package by its __init__.py) -> the gptcore modules it imports."""
    graph = {}
    for f in root.glob("gptcore/**/*.py"):
        name = module_name(f, root)
        graph[name] = {m for m in explicit_imports(f, root) if m.startswith("gptcore.") and m != name
                       and module_file(m, root) is not None}
    return graph


def layering_faults(graph: dict[str, set[str]]) -> list[str]:
    """Each import that points up a floor, and each import cycle, as a line."""
    faults = [f"{m} -> {d} points up" for m, deps in graph.items() for d in deps if floor(d) > floor(m)]
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        for d in sorted(graph.get(m, ())):
            if d in path:
                faults.append("cycle: " + " -> ".join(path[path.index(d):] + [d]))
            elif d not in done:
                visit(d, path + [d])
        done.add(m)
    for m in sorted(graph):
        if m not in done:
            visit(m, [m])
    return faults


def test_gptcore_imports_point_down_and_form_no_cycle():
    graph = import_graph(ROOT)
    assert len(graph) > 20 and "gptcore.errors" in graph["gptcore.train.trainer"]  # the graph was read
    assert {"gptcore.train.optimizers.adamw", "gptcore.train.optimizers.muon"} <= graph["gptcore.train.optimizers"]
    assert layering_faults(graph) == []


def test_the_layering_check_sees_an_upward_import_and_a_cycle():
    graph = {"gptcore.process": {"gptcore.data.shards"}, "gptcore.data.shards": {"gptcore.data.corpus"},
             "gptcore.data.corpus": {"gptcore.data.shards"}}
    assert layering_faults(graph) == ["gptcore.process -> gptcore.data.shards points up",
                                      "cycle: gptcore.data.corpus -> gptcore.data.shards -> gptcore.data.corpus"]


def test_a_type_only_import_and_a_package_init_count(tmp_path):
    """The two ways a cycle hid before: through a registry's __init__.py, and through `if TYPE_CHECKING:`."""
    pkg = tmp_path / "gptcore" / "train" / "things"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "gptcore", tmp_path / "gptcore" / "train"):
        (d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from gptcore.train.config import X\n")
    (tmp_path / "gptcore" / "train" / "config.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gptcore.train.things import T\n")
    faults = layering_faults(import_graph(tmp_path))
    assert faults == ["cycle: gptcore.train.config -> gptcore.train.things -> gptcore.train.config"]
