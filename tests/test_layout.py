"""The shape issue 24 asks of the code, held: a training run is followed through at most 15 modules, each stage
recipe reads in one screen, no function in gptcore/ or stages/ runs over 60 lines, and gptcore's imports form no
cycle and never point up a floor (docs/architecture.md: the ground floor, then data, model, eval and report, train,
and gptcore/config.py, which gathers every section's schema, on top)."""
from __future__ import annotations

import ast
from pathlib import Path

from stages.deps import ROOT, closure, imported_modules, module_file

RECIPES = ("fetch", "tokenize", "train", "evaluate", "compare")
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


def long_functions(files: list[Path], root: Path = ROOT, limit: int = 60) -> list[str]:
    """`file:function (lines)` for every function or method in `files` longer than `limit` lines."""
    found = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{f.relative_to(root)}:{node.name} ({lines})")
    return found


def test_a_training_run_is_followed_through_at_most_15_modules():
    modules = sorted(f for f in closure("stages.train") if not f.endswith("__init__.py"))
    assert len(modules) <= 15, modules


def test_every_stage_recipe_reads_in_one_screen():
    lengths = {r: len((ROOT / "stages" / f"{r}.py").read_text(encoding="utf-8").splitlines()) for r in RECIPES}
    assert all(n <= 60 for n in lengths.values()), lengths


def test_no_function_runs_over_60_lines():
    assert long_functions(sorted([*ROOT.glob("gptcore/**/*.py"), *ROOT.glob("stages/*.py")])) == []


def test_the_length_check_sees_a_long_method(tmp_path):
    body = "\n".join(f"        x = {i}" for i in range(60))
    (tmp_path / "m.py").write_text(f"class A:\n    def f(self):\n{body}\n\n\ndef g():\n    return 1\n")
    assert long_functions([tmp_path / "m.py"], tmp_path) == ["m.py:f (61)"]


def test_gptcore_imports_point_down_and_form_no_cycle():
    graph = import_graph(ROOT)
    assert len(graph) > 20 and "gptcore.process" in graph["gptcore.train.loop"]  # the graph was read
    assert layering_faults(graph) == []


def test_the_layering_check_sees_an_upward_import_and_a_cycle():
    graph = {"gptcore.process": {"gptcore.data.shards"}, "gptcore.data.shards": {"gptcore.data.corpus"},
             "gptcore.data.corpus": {"gptcore.data.shards"}}
    assert layering_faults(graph) == ["gptcore.process -> gptcore.data.shards points up",
                                      "cycle: gptcore.data.corpus -> gptcore.data.shards -> gptcore.data.corpus"]
