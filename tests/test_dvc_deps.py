"""DVC never serves stale results: each stage depends on every project file it runs, and the committed dvc.lock
(with the metrics it records) comes from the committed code and params."""
from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

import pytest
import yaml
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gptcore", "stages")


def module_file(name: str) -> Path | None:
    """The project file of a dotted module name (a package's __init__.py), or None outside the project."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement in `path` may load (anywhere in the file, function bodies included):
    `from a.b import c` counts a.b and a.b.c (c may be a submodule), and each parent package."""
    pkg = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    out = set()
    for n in names:  # importing a.b.c runs a/__init__.py and a/b/__init__.py first
        parts = n.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def closure(entry: str) -> set[str]:
    """Project files (repo-relative) that running module `entry` imports, transitively."""
    seen: set[Path] = set()
    todo = [p for p in (module_file(m) for m in imported_modules_of_name(entry)) if p]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo.extend(q for q in (module_file(m) for m in imported_modules(p)) if q and q not in seen)
    return {p.relative_to(ROOT).as_posix() for p in seen}


def imported_modules_of_name(entry: str) -> set[str]:
    parts = entry.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def stage_entries(cmd: str) -> set[str]:
    """Project modules a stage command runs: `-m stages.x`, `-m gptcore.y`, or a script path stages/x.py."""
    mods = set(re.findall(r"-m\s+((?:stages|gptcore)(?:\.\w+)+)", cmd))
    mods.update(p[:-3].replace("/", ".") for p in re.findall(r"(?:stages|gptcore)/[\w/]+\.py", cmd))
    return mods


def dvc_stages() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


@pytest.mark.parametrize("stage", sorted(dvc_stages()))
def test_stage_deps_cover_its_import_closure(stage):
    spec = dvc_stages()[stage]
    entries = stage_entries(spec["cmd"])
    assert entries, f"dvc.yaml stage {stage}: no project module found in its cmd {spec['cmd']!r}"
    needed = set().union(*(closure(e) for e in entries))
    deps = {d if isinstance(d, str) else next(iter(d)) for d in spec.get("deps", [])}
    missing = sorted(needed - deps)
    assert not missing, f"dvc.yaml stage {stage} runs these files but does not list them as deps: {missing}"
    # and no code dep it does not run (a stale entry reruns the stage for nothing, or names a moved file)
    extra = sorted(d for d in deps if d.endswith(".py") and d not in needed)
    assert not extra, f"dvc.yaml stage {stage} lists code it does not import: {extra}"


def test_closure_sees_function_level_and_from_package_imports(tmp_path):
    """The walker itself: a function-body import and `from gptcore.data import shards` both count."""
    files = closure("stages.evaluate")
    assert "gptcore/data/shards.py" in files and "gptcore/atomic.py" in files and "gptcore/__init__.py" in files
    assert "stages/train.py" not in files and not any(f.startswith("gptcore/train/") for f in files)


# ---------------------------------------------------------------------------------------------
# the committed dvc.lock

def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _dir_md5(path: Path) -> str:
    """DVC's hash of a directory: md5 of the JSON list of its files' {md5, relpath}, sorted by relpath."""
    entries = [{"md5": _md5(f), "relpath": f.relative_to(path).as_posix()}
               for f in sorted(path.rglob("*")) if f.is_file()] if path.is_dir() else []
    entries.sort(key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode()).hexdigest() + ".dir"


def _interpolate(cmd: str, params: dict) -> str:
    def value(m: re.Match) -> str:
        v = params
        for k in m.group(1).split("."):
            v = v[k]
        return str(v)
    return re.sub(r"\$\{([\w.]+)\}", value, cmd)


def _cached_outs() -> list[str]:
    """Outs DVC keeps in its cache (not in git): a clone has no copy to hash."""
    out = []
    for spec in dvc_stages().values():
        for key in ("outs", "metrics", "plots"):
            for o in spec.get(key, []):
                path, opts = (o, {}) if isinstance(o, str) else next(iter(o.items()))
                if (opts or {}).get("cache", True):
                    out.append(path)
    # and what the repo's .gitignore keeps out of git (checkpoints/: cache: false, too big for git)
    for line in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines():
        if line.startswith("/") and not any(c in line for c in "*?["):
            out.append(line.strip("/"))
    return out


def _in_git(path: str, cached: list[str]) -> bool:
    return not any(path == c or path.startswith(c.rstrip("/") + "/") for c in cached)


def test_committed_dvc_lock_matches_the_committed_code_params_and_metrics():
    """What `dvc status` checks, without DVC: every stage's cmd, params, code deps and committed outs hash as the
    lock records. Fails after a change to stage code until the quick-start is rerun and its lock committed."""
    # YAML 1.2, as DVC reads and writes them: PyYAML (1.1) takes the lock's `1e-08` for a string
    yaml12 = YAML(typ="safe")
    lock = yaml12.load((ROOT / "dvc.lock").read_text(encoding="utf-8"))["stages"]
    params = yaml12.load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    stale, cached = [], _cached_outs()
    for name, spec in dvc_stages().items():
        if name not in lock:
            stale.append(f"{name}: not in dvc.lock")
            continue
        rec = lock[name]
        if rec.get("cmd") != _interpolate(spec["cmd"], params):
            stale.append(f"{name}: cmd {rec.get('cmd')!r} in the lock, dvc.yaml runs {spec['cmd']!r}")
        want_deps = {d if isinstance(d, str) else next(iter(d)) for d in spec.get("deps", [])}
        locked = {d["path"]: d for d in rec.get("deps", [])}
        for missing in sorted(want_deps - set(locked)):
            stale.append(f"{name}: dep {missing} not in the lock")
        for sec in spec.get("params", []):
            if rec.get("params", {}).get("params.yaml", {}).get(sec) != params.get(sec):
                stale.append(f"{name}: params section {sec} differs from the lock's")
        outs = [o for key in ("outs", "metrics", "plots") for o in rec.get(key, [])]
        for entry in list(locked.values()) + outs:
            path = ROOT / entry["path"]
            if not _in_git(entry["path"], cached):
                continue
            if not path.exists() and not entry.get("md5", "").endswith(".dir"):  # git keeps no empty folder
                stale.append(f"{name}: {entry['path']} is in the lock but not in this checkout")
                continue
            got = _dir_md5(path) if entry.get("md5", "").endswith(".dir") else _md5(path)
            if got != entry.get("md5"):
                stale.append(f"{name}: {entry['path']} md5 {got}, the lock says {entry.get('md5')}")
    assert not stale, "dvc.lock is stale (rerun the quick-start `dvc repro` and commit it):\n" + "\n".join(stale)
