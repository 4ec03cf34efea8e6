"""The shape issue 24 asks of the code, held: a training run is followed through at most 15 modules, each stage
recipe reads in one screen, and no function in gptcore/ or stages/ runs over 60 lines."""
from __future__ import annotations

import ast
from pathlib import Path

from stages.deps import ROOT, closure

RECIPES = ("fetch", "tokenize", "train", "evaluate", "compare")


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
