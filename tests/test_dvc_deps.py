"""DVC never serves stale results: each stage depends on every project file it runs, and the committed dvc.lock
(with the metrics it records) comes from the committed code and params."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import yaml
from ruamel.yaml import YAML

from tools.stage_deps import closure, main, regenerate

ROOT = Path(__file__).resolve().parents[1]


def dvc_stages() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


def test_every_stage_lists_exactly_the_code_it_imports(capsys):
    """dvc.yaml's code deps are written by `python -m tools.stage_deps`; the committed file must be what it writes."""
    assert main(["--check"]) == 0, capsys.readouterr().err


def test_the_deps_command_repairs_a_missing_and_a_stale_dep(tmp_path):
    text = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    broken = text.replace("      - gptcore/atomic.py\n", "", 1).replace(
        "      - stages/compare.py\n", "      - stages/compare.py\n      - gptcore/train/trainer.py\n", 1)
    assert broken != text
    (tmp_path / "dvc.yaml").write_text(broken, encoding="utf-8")
    fixed, changed = regenerate(tmp_path / "dvc.yaml", ROOT)
    assert fixed == text and changed == ["fetch", "compare"]


def test_closure_sees_function_level_and_from_package_imports():
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
