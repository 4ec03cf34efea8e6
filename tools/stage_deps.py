"""Write each dvc.yaml stage's code deps: every project file its command imports, found by reading the imports.

`python -m tools.stage_deps` rewrites the `.py` entries of every stage's `deps:` (data deps and comments stay as
they are); `python -m tools.stage_deps --check` exits 1 naming the stages whose committed deps differ (a test runs
it). A code dep DVC lacks serves stale results; one the stage does not run reruns it for nothing.
"""
from __future__ import annotations

import ast
import re
import sys
from io import StringIO
from pathlib import Path
from typing import Iterator

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gptcore", "stages")


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The project file of a dotted module name (a package's __init__.py), or None outside the project."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*name.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def _run_time_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of `tree` but those under `if TYPE_CHECKING:`, which never run."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            continue
        yield node
        yield from _run_time_nodes(node)


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module an import statement anywhere in `path` may load (function bodies included, type-only imports
    under `if TYPE_CHECKING:` not): `from a.b import c` counts a.b and a.b.c (c may be a submodule), and each parent
    package (importing a.b runs a/__init__.py)."""
    pkg = path.relative_to(root).with_suffix("").parts[:-1]
    names: set[str] = set()
    for node in _run_time_nodes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*pkg[:len(pkg) - node.level + 1], *([node.module] if node.module else [])]) \
                if node.level else node.module or ""
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return {".".join(n.split(".")[:i]) for n in names for i in range(1, n.count(".") + 2)}


def closure(entry: str, root: Path = ROOT) -> set[str]:
    """Project files (repo-relative, POSIX) that running module `entry` imports, transitively."""
    seen: set[Path] = set()
    todo = [module_file(".".join(entry.split(".")[:i]), root) for i in range(1, entry.count(".") + 2)]
    while todo:
        p = todo.pop()
        if p is None or p in seen:
            continue
        seen.add(p)
        todo.extend(module_file(m, root) for m in imported_modules(p, root))
    return {p.relative_to(root).as_posix() for p in seen}


def stage_entries(cmd: str) -> set[str]:
    """Project modules a stage command runs: `-m stages.x`, `-m gptcore.y`, or a script path stages/x.py."""
    mods = set(re.findall(r"-m\s+((?:stages|gptcore)(?:\.\w+)+)", cmd))
    mods.update(p[:-3].replace("/", ".") for p in re.findall(r"(?:stages|gptcore)/[\w/]+\.py", cmd))
    return mods


def code_deps(cmd: str, root: Path = ROOT) -> list[str]:
    """The sorted code deps of a stage command."""
    return sorted(set().union(*(closure(e, root) for e in stage_entries(cmd))))


def regenerate(dvc_yaml: Path, root: Path = ROOT) -> tuple[str, list[str]]:
    """dvc.yaml's text with every stage's code deps (the files under `root` it imports) rewritten, and the names of
    the stages that changed."""
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 120
    yaml.indent(mapping=2, sequence=4, offset=2)
    doc = yaml.load(dvc_yaml.read_text(encoding="utf-8"))
    changed = []
    for name, spec in doc["stages"].items():
        deps = spec.setdefault("deps", [])
        old = [d for d in deps if isinstance(d, str) and d.endswith(".py")]
        new = code_deps(spec["cmd"], root)
        if old != new:
            changed.append(name)
            for d in old:
                deps.remove(d)
            deps.extend(new)
    out = StringIO()
    yaml.dump(doc, out)
    return out.getvalue(), changed


def main(argv: list[str] | None = None) -> int:
    """Rewrite dvc.yaml's code deps (or, with --check, only say which stages are stale); the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    path = ROOT / "dvc.yaml"
    text, changed = regenerate(path)
    if "--check" in argv:
        if changed:
            print(f"dvc.yaml: the code deps of {', '.join(changed)} differ from what they import: run "
                  f"`python -m tools.stage_deps` and commit dvc.yaml", file=sys.stderr)
        return 1 if changed else 0
    if changed:
        path.write_text(text, encoding="utf-8")
    print(f"dvc.yaml: code deps of {', '.join(changed) or 'no stage'} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
