"""The sweep table (gptcore.report.table) on a `dvc exp show --json` document written here, means and standard
deviations computed by hand."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from gptcore.report.table import experiments, markdown, summarize, versus
from gptcore.report.table import main as table_main

ROOT = Path(__file__).resolve().parents[1]


def exp(name: str, preset: str, lr: float, seed: int, val: float, tokens: int | None, params: int) -> dict:
    """One experiment as DVC 3 writes it under a commit's "experiments"."""
    data = {
        "rev": name[:7] + "0" * 33,
        "params": {"params.yaml": {"data": {"preset": preset, "train": {"max_lr": lr, "seed": seed}}}},
        "metrics": {
            "metrics/eval.json": {"data": {"eval": {"val_loss": val, "bits_per_char": val / 2}}},
            "metrics/summary.json": {"data": {"speedrun": {"tokens_to_target": tokens, "reached": tokens is not None}}},
            "metrics/train/metrics.json": {"data": {"step": 200, "params": params, "flops_per_token": 6 * params}},
        },
    }
    return {"revs": [{"rev": data["rev"], "name": name, "data": data}]}


DOC = [
    {"rev": "workspace", "name": None, "data": {"rev": "workspace", "params": {}, "metrics": {}}, "experiments": None},
    {"rev": "a" * 40, "name": "main", "data": {"rev": "a" * 40, "params": {}, "metrics": {}}, "experiments": [
        exp("gpt2-s1", "quickstart", 1e-3, 1, 6.00, 819200, 7_250_000),
        exp("gpt2-s2", "quickstart", 1e-3, 2, 6.04, None, 7_250_000),
        exp("gpt2-s3", "quickstart", 1e-3, 3, 5.98, 798720, 7_250_000),
        exp("modern-s1", "modern_quickstart", 3e-3, 1, 5.20, 204800, 13_600_000),
        exp("modern-s2", "modern_quickstart", 3e-3, 2, 5.26, 184320, 13_600_000),
        {"revs": [{"rev": "q" * 40, "name": "queued", "data": {"rev": "q" * 40, "params": {}, "metrics": {}}}]},
    ]},
]


def test_groups_pool_seeds_and_give_mean_and_sample_std():
    rows = experiments(DOC)
    assert [r["name"] for r in rows] == ["gpt2-s1", "gpt2-s2", "gpt2-s3", "modern-s1", "modern-s2"]
    varying, groups = summarize(rows, ["eval.val_loss", "speedrun.tokens_to_target", "params"])
    assert varying == ["preset", "train.max_lr"]  # the seed is pooled over, not grouped by
    gpt2, modern = groups
    assert (gpt2["params"], gpt2["n"]) == ({"preset": "quickstart", "train.max_lr": 1e-3}, 3)
    # by hand: mean 6.00667, deviations (-0.00667, 0.03333, -0.02667), sum of squares / (3 - 1)
    mean = (6.00 + 6.04 + 5.98) / 3
    std = math.sqrt(((6.00 - mean) ** 2 + (6.04 - mean) ** 2 + (5.98 - mean) ** 2) / 2)
    assert gpt2["metrics"]["eval.val_loss"]["mean"] == pytest.approx(mean)
    assert gpt2["metrics"]["eval.val_loss"]["std"] == pytest.approx(std) == pytest.approx(0.030551, abs=1e-6)
    # one seed never reached the target: averaged over the two that did, and the count says so
    tokens = gpt2["metrics"]["speedrun.tokens_to_target"]
    assert (tokens["mean"], tokens["count"]) == ((819200 + 798720) / 2, 2)
    assert tokens["std"] == pytest.approx(abs(819200 - 798720) / math.sqrt(2))
    assert modern["metrics"]["eval.val_loss"]["std"] == pytest.approx(0.06 / math.sqrt(2))
    assert modern["metrics"]["params"] == {"mean": 13_600_000, "std": 0.0, "count": 2}


def test_markdown_table_rows():
    varying, groups = summarize(experiments(DOC), ["eval.val_loss", "speedrun.tokens_to_target"])
    lines = markdown(varying, groups, ["eval.val_loss", "speedrun.tokens_to_target"]).splitlines()
    assert lines[0] == "| preset | train.max_lr | seeds | eval.val_loss | speedrun.tokens_to_target |"
    assert lines[2] == "| quickstart | 0.001 | 3 | 6.007 ± 0.03055 | 808,960 ± 14,482 (2/3) |"
    assert lines[3] == "| modern_quickstart | 0.003 | 2 | 5.23 ± 0.04243 | 194,560 ± 14,482 |"


def command(capsys, *argv: str) -> subprocess.CompletedProcess:
    """`gptcore-exp-table <argv>` run in this process (its entry point, its error contract): the exit status and
    what it printed, as a process would have them (`sys.exit(message)` prints the message and exits with 1)."""
    capsys.readouterr()
    status = 0
    try:
        table_main(list(argv))
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        status = 1 if isinstance(e.code, str) else e.code or 0
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, status, out, err)


def test_command_reads_a_file_and_refuses_a_document_without_experiments(tmp_path, capsys):
    good, empty = tmp_path / "exps.json", tmp_path / "empty.json"
    good.write_text(json.dumps(DOC))
    empty.write_text(json.dumps(DOC[:1]))
    out = command(capsys, str(good), "--metrics", "eval.val_loss")
    assert out.returncode == 0 and "| modern_quickstart | 0.003 | 2 | 5.23 ± 0.04243 |" in out.stdout
    out = command(capsys, str(good), "--only", "^modern", "--show", "preset", "--metrics", "eval.val_loss")
    # one group left, so no param differs: no param column
    assert out.stdout.splitlines()[0] == "| seeds | eval.val_loss |" and "| 2 | 5.23 ± 0.04243 |" in out.stdout
    out = command(capsys, str(good), "--sort", "train.max_lr", "--metrics", "eval.val_loss")
    assert [ln.split(" | ")[1] for ln in out.stdout.splitlines()[2:]] == ["0.001", "0.003"]  # by value
    out = command(capsys, str(good), "--names", "--show", "--metrics", "eval.val_loss")
    assert out.stdout.splitlines()[0] == "| experiments | seeds | eval.val_loss |"
    assert "| gpt2-s1, gpt2-s2, gpt2-s3 | 3 | 6.007 ± 0.03055 |" in out.stdout
    out = command(capsys, str(empty))
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "no finished experiment" in out.stderr
    # the console script itself, once, in a process of its own
    out = subprocess.run([sys.executable, "-m", "gptcore.report.table", str(empty)], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "no finished experiment" in out.stderr


def test_difference_from_a_baseline_pools_the_seed_to_seed_spread():
    one_seed = exp("modern-lr6e-3", "modern_quickstart", 6e-3, 1, 5.31, 245760, 13_600_000)
    doc = [{**DOC[1], "experiments": [*DOC[1]["experiments"], one_seed]}]
    _, groups = summarize(experiments(doc), ["eval.val_loss"])
    gpt2, modern, lone = groups
    d = versus(groups, gpt2, "eval.val_loss")
    # by hand: variances 0.030551^2 (3 seeds) and 0.042426^2 (2 seeds), pooled with weights 2 and 1
    pooled = math.sqrt((2 * 0.0305505 ** 2 + 1 * 0.0424264 ** 2) / 3)
    assert d[1]["diff"] == pytest.approx(5.23 - 6.006667, abs=1e-5)
    assert d[1]["sd"] == pytest.approx(pooled, abs=1e-6) == pytest.approx(0.034960, abs=1e-6)
    assert d[1]["sd_diff"] == pytest.approx(pooled * math.sqrt(1 / 2 + 1 / 3), abs=1e-6)
    assert d[1]["beyond_2sd"] and d[0]["diff"] == 0 and not d[0]["beyond_2sd"]
    # a one-seed row borrows the baseline's spread alone
    base = versus(groups, modern, "eval.val_loss")[2]
    assert base["sd"] == pytest.approx(0.0424264, abs=1e-6) and base["diff"] == pytest.approx(0.08)
    assert base["sd_diff"] == pytest.approx(0.0424264 * math.sqrt(1 + 1 / 2), abs=1e-6)
    assert not base["beyond_2sd"]  # 0.08 < 2 * 0.0424
    lines = markdown(["train.max_lr"], groups, ["eval.val_loss"], base=modern).splitlines()
    assert lines[0] == "| train.max_lr | seeds | eval.val_loss | Δ eval.val_loss | > 2 sd |"
    assert lines[3] == "| 0.003 | 2 | 5.23 ± 0.04243 | (baseline) |  |"
    assert lines[4] == "| 0.006 | 1 | 5.31 | +0.080 ± 0.052 | no |"
    assert lines[2] == "| 0.001 | 3 | 6.007 ± 0.03055 | +0.777 ± 0.032 | yes |"


def test_baseline_must_name_one_group(tmp_path, capsys):
    good = tmp_path / "exps.json"
    good.write_text(json.dumps(DOC))
    args = [str(good), "--metrics", "eval.val_loss"]
    out = command(capsys, *args, "--baseline", "^modern")
    assert out.returncode == 0 and "| quickstart | 0.001 | 3 | 6.007 ± 0.03055 | +0.777 ± 0.032 | yes |" in out.stdout
    for regex, why in [("-s1$", "names experiments of 2 groups"), ("^nobody", "of 0 groups (none)"),
                       ("(", "not a regular expression")]:
        out = command(capsys, *args, f"--baseline={regex}")
        assert out.returncode == 1 and out.stderr.count("\n") == 1 and why in out.stderr, out.stderr


def table(argv: list[str], capsys) -> tuple[int, str, str]:
    """gptcore-exp-table's main (the console script's entry point) run here: exit status, stdout, stderr."""
    from gptcore.report.table import main

    try:
        main(argv)
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
        if isinstance(e.code, str):  # sys.exit(line): Python prints it on stderr
            print(e.code, file=sys.stderr)
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.mark.parametrize("doc, says", [
    (["a", 1], "[0] is a string, not a mapping"),
    ({"experiments": []}, "the document is a mapping, not a list"),
    ([{"experiments": 5}], "[0].experiments is a number, not a list"),
    ([{"experiments": [{"revs": [{"name": "x", "data": {"metrics": [1, 2]}}]}]}],
     "[0].experiments[0].revs[0].data.metrics is a list, not a mapping"),
    ([{"experiments": [{"revs": [{"name": "x", "data": {"metrics": {"m.json": {"data": [3]}}}}]}]}],
     "[0].experiments[0].revs[0].data.metrics['m.json'].data is a list, not a mapping"),
    ([{"experiments": [{"revs": [{"data": {"params": {"params.yaml": "x"}}}]}]}],
     "[0].experiments[0].revs[0].data.params['params.yaml'] is a string, not a mapping"),
])
def test_json_of_another_shape_is_one_line_naming_the_place(tmp_path, capsys, doc, says):
    """Each of these was an AttributeError or TypeError traceback."""
    path = tmp_path / "exps.json"
    path.write_text(json.dumps(doc))
    status, out, err = table([str(path)], capsys)
    assert status == 1 and out == "" and err == (f"[gptcore-exp-table] {path}: {says}: expected what `dvc exp show "
                                                 f"--json` prints\n")


@pytest.mark.parametrize("args, says", [
    (["--show", "train.maxlr"], "--show 'train.maxlr': no experiment has this param (did you mean train.max_lr?); "
                                "the param columns here: preset, train.max_lr"),
    (["--sort", "nothing"], "--sort 'nothing': no experiment has this param; the param columns here: preset, "
                            "train.max_lr"),
    (["--ignore", "train.sed"], "--ignore 'train.sed': no experiment has this param (did you mean train.seed?)"),
    (["--metrics", "eval.valloss"], "--metrics 'eval.valloss': no experiment has this metric (did you mean "
                                    "eval.val_loss?); the metrics there are: eval.bits_per_char, eval.val_loss"),
    (["--only", "^nobody"], "--only '^nobody': matches none of the experiments (gpt2-s1, gpt2-s2, gpt2-s3, "
                            "modern-s1, modern-s2)"),
])
def test_an_argument_naming_nothing_there_is_refused_with_what_there_is(tmp_path, capsys, args, says):
    """--show and --sort once dropped an unknown column in silence (exit 0); --only matching nothing blamed the
    file."""
    path = tmp_path / "exps.json"
    path.write_text(json.dumps(DOC))
    status, out, err = table([str(path), *args], capsys)
    assert status == 1 and out == "" and err.startswith(f"[gptcore-exp-table] {says}") and err.count("\n") == 1, err


def table_of(capsys, *argv: str) -> str:
    """What `gptcore-exp-table <argv>` prints, run in this process."""
    capsys.readouterr()
    table_main(list(argv))
    return capsys.readouterr().out


def test_changed_shows_each_experiment_s_preset_and_what_its_s_changed(tmp_path, capsys):
    """README's view of experiments across presets: a preset sets many keys apart from another (here the smoke run's
    shape and budget, the modern recipe's optimizer); --changed shows `preset` and the keys that differ between
    experiments of one preset (the -S values: a rate, the parallel mode), whatever the presets in the list."""
    def run(name: str, preset: str, val: float, **train) -> dict:
        e = exp(name, preset, train.pop("max_lr", 1e-3), 1337, val, None, 7_250_000)
        data = e["revs"][0]["data"]["params"]["params.yaml"]["data"]
        data["train"].update({"parallel": "ddp", "nproc": 1, "micro_batch": 32, "max_steps": 200, "optimizer": "adamw",
                              **train})
        data["model"] = {"n_layer": 2 if preset == "smoke" else 4}
        return e

    doc = [{**DOC[1], "experiments": [
        run("qs-lr", "quickstart", 6.05, max_lr=3e-3), run("lr6e-4", "quickstart", 6.12, max_lr=6e-4),
        run("fsdp", "quickstart", 5.95, parallel="fsdp", nproc=2, micro_batch=16),
        run("smoke", "smoke", 8.98, micro_batch=16, max_steps=40),
        run("modern", "modern_quickstart", 5.01, max_lr=6e-3, optimizer="muon")]}]
    path = tmp_path / "exps.json"
    path.write_text(json.dumps(doc))
    args = [str(path), "--names", "--metrics", "eval.val_loss"]
    lines = table_of(capsys, *args, "--changed").splitlines()
    assert lines[0] == ("| experiments | preset | train.max_lr | train.micro_batch | train.nproc | train.parallel "
                        "| seeds | eval.val_loss |")
    assert lines[2:] == ["| qs-lr | quickstart | 0.003 | 32 | 1 | ddp | 1 | 6.05 |",
                         "| lr6e-4 | quickstart | 0.0006 | 32 | 1 | ddp | 1 | 6.12 |",
                         "| fsdp | quickstart | 0.001 | 16 | 2 | fsdp | 1 | 5.95 |",
                         "| smoke | smoke | 0.001 | 16 | 1 | ddp | 1 | 8.98 |",
                         "| modern | modern_quickstart | 0.006 | 32 | 1 | ddp | 1 | 5.01 |"]
    # without it, every key two presets set apart is a column: the model's shape, the budget, the optimizer
    every = table_of(capsys, *args).splitlines()[0]
    assert {"model.n_layer", "train.max_steps", "train.optimizer"} <= set(every.strip("| ").split(" | "))
    # --show adds columns to --changed's
    head = table_of(capsys, *args, "--changed", "--show", "train.optimizer").splitlines()[0]
    assert head.split(" | ")[5:8] == ["train.optimizer", "train.parallel", "seeds"], head


def test_changed_compares_a_lone_experiment_with_the_commit_it_ran_from(tmp_path, capsys):
    """README's first experiment, qs-lr, alone in the list: its -S shows against the committed quick-start run."""
    committed = {"preset": "quickstart", "train": {"max_lr": 1e-3, "seed": 1337}}
    doc = [{"rev": "a" * 40, "name": "main", "data": {"rev": "a" * 40, "params": {"params.yaml": {"data": committed}},
                                                       "metrics": {}},
            "experiments": [exp("qs-lr", "quickstart", 3e-3, 1337, 6.05, None, 7_250_000)]}]
    path = tmp_path / "exps.json"
    path.write_text(json.dumps(doc))
    lines = table_of(capsys, str(path), "--changed", "--metrics", "eval.val_loss").splitlines()
    assert lines[0] == "| preset | train.max_lr | seeds | eval.val_loss |"
    assert lines[2] == "| quickstart | 0.003 | 1 | 6.05 |"
