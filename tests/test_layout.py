"""gptcore's imports form no cycle and never point up a floor (docs/architecture.md: the ground floor, then data,
model, eval and report, train, and gptcore/config.py, which gathers every section's config class, on top)."""
from __future__ import annotations

from pathlib import Path

from stages.deps import ROOT, imported_modules, module_file

FLOORS = {"data": 1, "model": 2, "eval": 3, "report": 3, "train": 4}  # a module at the top of gptcore/: 0


def floor(module: str) -> int:
    parts = module.split(".")
    return 5 if module == "gptcore.config" else FLOORS[parts[1]] if len(parts) > 2 else 0


def import_graph(root: Path) -> dict[str, set[str]]:
    """gptcore module -> the gptcore modules it imports (at the top or inside a function), as stages.deps reads them."""
    graph = {}
    for f in root.glob("gptcore/**/*.py"):
        name = ".".join(f.relative_to(root).with_suffix("").parts)
        if not name.endswith("__init__"):  # a package's own file runs no code of ours
            graph[name] = {m for m in imported_modules(f, root) if m.startswith("gptcore.") and m != name
                           and (dep := module_file(m, root)) is not None and dep.name != "__init__.py"}
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
    assert layering_faults(graph) == []


def test_the_layering_check_sees_an_upward_import_and_a_cycle():
    graph = {"gptcore.process": {"gptcore.data.shards"}, "gptcore.data.shards": {"gptcore.data.corpus"},
             "gptcore.data.corpus": {"gptcore.data.shards"}}
    assert layering_faults(graph) == ["gptcore.process -> gptcore.data.shards points up",
                                      "cycle: gptcore.data.corpus -> gptcore.data.shards -> gptcore.data.corpus"]
