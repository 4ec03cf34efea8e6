"""Hydra's recompose trap, made visible: when train replaces a finished run of other params (every `dvc exp run`
composes params.yaml from conf/ afresh, so an earlier -S is gone unless repeated), its resume decision says so on
one line naming each key that differs, old -> new (gptcore.train.checkpoints.retrain_note)."""
from __future__ import annotations

from gptcore.train import checkpoints

TRAP = ("`dvc exp run` composes params.yaml from conf/ afresh, so an earlier experiment's -S values hold only where "
        "repeated")


def params(max_steps: int, max_lr: float = 1e-3) -> dict:
    return {"model": {"init_from": "scratch", "n_layer": 4}, "train": {"max_steps": max_steps, "max_lr": max_lr}}


def save(ckpt_dir, step: int, run: dict) -> None:
    checkpoints.save_checkpoint(ckpt_dir, step, {"step": step, "params": run,
                                                "fingerprint": checkpoints.run_fingerprint(run)}, keep=2)


def test_a_finished_shortened_run_replaced_names_the_keys_and_the_recompose(tmp_path):
    short = params(50)  # dvc exp run -S train.max_steps=50, finished
    save(tmp_path, 25, short)
    save(tmp_path, 50, short)
    resume, notes = checkpoints.prepare_resume(tmp_path, params(200), is_main=True)  # the next plain dvc exp run
    assert resume is None
    assert notes[0] == (f"{tmp_path / 'ckpt_0000050.pt'} was written by a run with other params, so it is not "
                        f"resumed; starting fresh (train.max_steps: 50 -> 200): the run it replaces had finished "
                        f"(step 50 of 50); {TRAP}")
    assert "\n" not in notes[0]
    # the finished run is kept, and comes back when its params are run again (the -S repeated)
    resume, notes = checkpoints.prepare_resume(tmp_path, short, is_main=True)
    assert resume is not None and resume["step"] == 50


def test_every_differing_key_is_named_old_to_new():
    old, new = params(50, 1e-3), params(200, 3e-3)
    new["model"]["n_layer"] = 2
    diff = checkpoints.param_diff(old, new)
    note = checkpoints.retrain_note({"step": 50, "params": old}, diff)
    assert note.startswith("starting fresh (model.n_layer: 4 -> 2; train.max_lr: 0.001 -> 0.003; "
                           "train.max_steps: 50 -> 200): the run it replaces had finished (step 50 of 50); ")


def test_an_unfinished_run_keeps_the_plain_note(tmp_path):
    """An unfinished run of other params gets the plain note: the sentence is for what the trap leaves, a finished
    run trained again."""
    save(tmp_path, 30, params(50))
    resume, notes = checkpoints.prepare_resume(tmp_path, params(200), is_main=True)
    assert resume is None and notes[0].endswith("starting fresh (train.max_steps: 50 -> 200)")
    diff = ["train.max_lr: 0.001 -> 0.002"]
    assert checkpoints.retrain_note({"step": 30, "params": params(50)}, diff) == f"starting fresh ({diff[0]})"
    assert checkpoints.retrain_note({"step": 3}, ["(params not recorded)"]) == "starting fresh ((params not recorded))"
