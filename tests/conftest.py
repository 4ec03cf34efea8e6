"""Shared pytest set-up for gptcore's tests, and the one temp clone the end-to-end tests share."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
# make `import gptcore` work from a plain checkout (no `pip install -e .`) whatever the working directory
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MICRO_PRESET = """\
# @package _global_
# A micro budget for tests: the quick-start's data and tokenizer, a 1-layer model, 6 steps.
defaults:
  - quickstart
  - _self_

preset: micro
fetch:
  max_docs: 2
tokenize:
  val_tokens: 8192
model:
  n_layer: 1
  n_head: 2
  n_embd: 32
  block_size: 32
train:
  micro_batch: 8
  total_batch_tokens: 256
  max_steps: 6
  warmup_steps: 1
  eval_every: 3
  val_tokens: 1024
  eval_batch: 8
  ckpt_every: 100
eval:
  val_tokens: 2048
  eval_batch: 8
  cloze_examples: 20
  cloze_context: 16
  cloze_ending: 4
  samples: 1
  sample_tokens: 8
"""


def pytest_configure(config):
    """pytest-xdist hands out the files in the order the hook below leaves them, not by its own count of tests."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: what is left decides
def pytest_collection_modifyitems(config, items):
    """The files whose selected tests are all slow first, then those with the most slow tests; within each, the most
    tests first (xdist's own order). xdist's order alone left the one-test end-to-end files (the README flows
    through DVC, each minutes long) to the end of a run, one worker busy with the last of them while the other
    waited. The fast subset selects no slow test, so its order is xdist's own."""
    by_file: dict[str, list] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)

    def heavy_first(name: str) -> tuple[bool, int, int]:
        slow = sum(1 for item in by_file[name] if item.get_closest_marker("slow"))
        return slow < len(by_file[name]), -slow, -len(by_file[name])
    items[:] = [item for name in sorted(by_file, key=heavy_first) for item in by_file[name]]


def clone_env(clone: Path) -> dict[str, str]:
    """The environment the clone's commands run in: its own code first, the venv's dvc/torchrun/gptcore-* on PATH."""
    # COLUMNS: `dvc exp show` fits its table to the terminal and would cut columns
    e = dict(os.environ, PYTHONPATH=str(clone), OMP_NUM_THREADS="1", COLUMNS="300")
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e['PATH']}"
    return e


def run_in(clone: Path, *cmd: str, timeout: int = 900) -> str:
    """Run a command in the clone; its stdout, or a failure showing the end of both streams."""
    proc = subprocess.run(cmd, cwd=clone, env=clone_env(clone), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} (exit {proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


@pytest.fixture(scope="session")
def micro_repro(tmp_path_factory) -> SimpleNamespace:
    """ONE micro run of the committed HEAD for every end-to-end test: a temp clone, a micro preset added and committed
    as a user would, params.yaml composed from it as `dvc exp run -S preset=micro` writes it, and `dvc repro` run
    once in the whole test run. The first pytest-xdist worker that needs it builds it under a lock; every worker,
    that one included, gets a copy of its own, since its tests run experiments in it.

    What the fresh repro produced is kept (metrics, `dvc metrics show`, a second `dvc repro`) before later tests
    run experiments in the same workspace."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's folder, above each worker's
    built, record = shared / "micro_repro" / "repo", shared / "micro_repro" / "record.json"
    with FileLock(str(shared / "micro_repro.lock")):
        if not record.is_file():
            _build_micro_repro(built, record)
    path = tmp_path_factory.mktemp("e2e") / "repo"
    shutil.copytree(built, path, symlinks=True)
    return SimpleNamespace(path=path, **json.loads(record.read_text(encoding="utf-8")))


def micro_base(path: Path) -> Path:
    """The micro run's workspace as experiment `micro-base`: recorded without rerunning where micro_repro's `dvc repro`
    left it, or put back to it where another test file's experiment is in the workspace (the files of a pytest-xdist
    worker share its one copy of the session's clone)."""
    shown = subprocess.run(["dvc", "exp", "show", "--json"], cwd=path, env=clone_env(path), capture_output=True,
                           text=True, timeout=600).stdout
    if '"micro-base"' in shown:
        run_in(path, "dvc", "exp", "apply", "micro-base")
    else:
        run_in(path, "dvc", "exp", "run", "-n", "micro-base", "-S", "preset=micro")  # recorded, not rerun
    return path


def _build_micro_repro(path: Path, record: Path) -> None:
    """micro_repro's clone at `path`, and what its `dvc repro` gave in `record` (JSON)."""
    from dvc.utils.hydra import compose_and_dump

    subprocess.run(["git", "clone", "-q", str(ROOT), str(path)], check=True, timeout=120)
    (path / "conf" / "preset" / "micro.yaml").write_text(MICRO_PRESET, encoding="utf-8")
    for cmd in (["git", "add", "conf/preset/micro.yaml"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "micro preset"]):
        subprocess.run(cmd, cwd=path, check=True)
    compose_and_dump(path / "params.yaml", str(path / "conf"), None, "config", "", ["preset=micro"])
    repro = run_in(path, "dvc", "repro")
    metrics = {name: json.loads((path / name).read_text(encoding="utf-8"))
               for name in ("metrics/train/metrics.json", "metrics/eval.json", "metrics/summary.json")}
    files = {name: (path / name).is_file() for name in ("model/model.pt", "metrics/samples.txt")}
    shown = run_in(path, "dvc", "metrics", "show")
    again = run_in(path, "dvc", "repro")
    record.write_text(json.dumps({"repro": repro, "metrics": metrics, "files": files, "shown": shown, "again": again}),
                      encoding="utf-8")
