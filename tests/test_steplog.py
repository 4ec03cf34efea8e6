"""The dvclive step logger across a kill: curves cut at the resume step, a summary truncated mid-write rebuilt."""
import json

from gptcore.report.steplog import StepLogger


def read_rows(live, name):
    lines = (live / "plots" / "metrics" / f"{name}.tsv").read_text(encoding="utf-8").splitlines()
    return [line.split("\t") for line in lines[1:]]


def test_resume_after_a_kill_that_truncated_the_summary(tmp_path):
    live = tmp_path / "train"
    logger = StepLogger(live)
    for step in range(5):
        logger.log(step, {"train_loss": 5.0 - step, "val_loss": 6.0 - step if step % 2 == 0 else None})
    logger.close()
    (live / "metrics.json").write_text('{"train_loss": 1.', encoding="utf-8")  # killed while dvclive wrote it
    logger = StepLogger(live, resume_step=3)
    assert [r[0] for r in read_rows(live, "train_loss")] == ["0", "1", "2"]
    assert json.loads((live / "metrics.json").read_text()) == {"train_loss": 3.0, "val_loss": 4.0, "step": 2}
    logger.log(3, {"train_loss": 1.5})
    logger.close()
    assert [r[0] for r in read_rows(live, "train_loss")] == ["0", "1", "2", "3"]
    assert json.loads((live / "metrics.json").read_text())["train_loss"] == 1.5
