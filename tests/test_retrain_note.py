"""Hydra's recompose trap, made visible only where it bites: when train replaces a finished run of other params and a
key went back to the preset's value (every `dvc exp run` composes params.yaml from conf/ afresh, so an earlier -S is
gone unless repeated), its resume line says so, naming the -S to repeat. A change the user asked for gets the plain
line, and a switch of preset one short line naming the two presets (gptcore.train.run_folder.retrain_note,
gptcore.presets)."""
from __future__ import annotations

import torch

from gptcore.model.config import ModelConfig
from gptcore.presets import composed, preset_table, preset_values
from gptcore.train import checkpoints, run_folder
from gptcore.train.config import TrainConfig, fingerprint_params

PRESET = {"model.n_layer": 4, "train.max_steps": 200, "train.max_lr": 1e-3}  # what the preset composes to
PRESETS = run_folder.Presets("p", {"p": PRESET})


def params(max_steps: int, max_lr: float = 1e-3) -> dict:
    return {"model": {"init_from": "scratch", "n_layer": 4}, "train": {"max_steps": max_steps, "max_lr": max_lr}}


def save(ckpt_dir, step: int, run: dict) -> None:
    """A checkpoint of `run` at `step` (one tensor is all the run folder's logic reads of it)."""
    checkpoints.write(ckpt_dir, step, {"w": torch.zeros(4)}, {"params": run,
                                                              "fingerprint": run_folder.run_fingerprint(run)})
    checkpoints.remove_old(ckpt_dir, keep=2)


def test_a_finished_run_replaced_by_the_preset_s_value_names_the_s_to_repeat(tmp_path):
    short = params(50)  # dvc exp run -S train.max_steps=50, finished
    save(tmp_path, 25, short)
    save(tmp_path, 50, short)
    resume, notes = run_folder.prepare_resume(tmp_path, params(200), is_main=True, presets=PRESETS)  # a plain one
    assert resume is None
    assert notes[0] == (f"{tmp_path / 'ckpt_0000050'} was written by a run with other params, so it is not "
                        f"resumed; starting fresh (train.max_steps: 50 -> 200): the finished run it replaces (step "
                        f"50 of 50) had train.max_steps=50, and this run has the preset's; `dvc exp run` composes "
                        f"params.yaml from conf/ afresh, so an earlier -S holds only where repeated "
                        f"(-S train.max_steps=50)")
    assert "\n" not in notes[0]
    # the finished run is kept, and comes back when its params are run again (the -S repeated)
    resume, notes = run_folder.prepare_resume(tmp_path, short, is_main=True, presets=PRESETS)
    assert resume is not None and resume["step"] == 50


def test_a_change_the_user_asked_for_gets_the_plain_line(tmp_path):
    """-S train.max_lr=3e-3 after the preset's run: 3e-3 is not the preset's value, so nothing was lost."""
    save(tmp_path, 200, params(200))
    resume, notes = run_folder.prepare_resume(tmp_path, params(200, 3e-3), is_main=True, presets=PRESETS)
    assert resume is None and notes[0].endswith("starting fresh (train.max_lr: 0.001 -> 0.003)")


def test_every_differing_key_is_named_old_to_new_and_only_reverted_ones_get_the_sentence():
    old, new = params(50, 3e-3), params(200, 1e-3)
    new["model"]["n_layer"] = 2
    note = run_folder.retrain_note({"step": 50, "params": old}, run_folder.param_changes(old, new), PRESETS)
    assert note.startswith("starting fresh (model.n_layer: 4 -> 2; train.max_lr: 0.003 -> 0.001; "
                           "train.max_steps: 50 -> 200): the finished run it replaces (step 50 of 50) had "
                           "train.max_lr=0.003, train.max_steps=50, and this run has the preset's;")
    assert note.endswith("(-S train.max_lr=0.003 -S train.max_steps=50)")


def test_an_unfinished_run_keeps_the_plain_note(tmp_path):
    save(tmp_path, 30, params(50))
    resume, notes = run_folder.prepare_resume(tmp_path, params(200), is_main=True, presets=PRESETS)
    assert resume is None and notes[0].endswith("starting fresh (train.max_steps: 50 -> 200)")
    assert run_folder.retrain_note({"step": 3}, []) == "starting fresh ((params not recorded))"


def test_the_preset_s_values_are_what_dvc_composes():
    """Checked against DVC's own composition of the smoke preset (built on the quick start's)."""
    from test_dvc_experience import compose

    _, p = compose("preset=smoke")
    values = preset_values("smoke")
    for section in ("model", "train"):
        for key, value in p[section].items():
            assert values[f"{section}.{key}"] == value, key
    assert preset_values("no_such_preset") == {} and preset_values(None) == {}


def run_of(preset: str, **train) -> dict:
    """The params a checkpoint of `dvc exp run -S preset=<preset>` (with -S train.<key>=<value>) records."""
    p = composed(preset)
    return fingerprint_params(ModelConfig.read(p["model"]), TrainConfig.read({**p["train"], **train}),
                              {"shards": "the same"})


def test_a_switch_of_preset_is_one_short_line(tmp_path):
    """README's first lines: the smoke run, then `dvc exp run` (the quick start): every model and budget key
    differs, and each is the new preset's own value; the line names the switch, not the keys."""
    save(tmp_path, 40, run_of("smoke"))
    resume, notes = run_folder.prepare_resume(tmp_path, run_of("quickstart"), is_main=True,
                                              presets=run_folder.Presets("quickstart", preset_table()))
    changes = run_folder.param_changes(run_of("smoke"), run_of("quickstart"))
    assert resume is None and len(changes) > 5
    assert notes[0] == (f"{tmp_path / 'ckpt_0000040'} was written by a run with other params, so it is not "
                        f"resumed; starting fresh (preset smoke -> quickstart, {len(changes)} params differ)")
    assert len(notes[0]) - len(str(tmp_path)) < 150


def test_a_switch_of_preset_that_drops_an_s_names_that_one_alone(tmp_path):
    """The smoke run had -S train.max_lr=3e-3 and the quick start has its preset's 1e-3: that -S, and only that
    one, is named to repeat."""
    save(tmp_path, 40, run_of("smoke", max_lr=3e-3))
    _, notes = run_folder.prepare_resume(tmp_path, run_of("quickstart"), is_main=True,
                                         presets=run_folder.Presets("quickstart", preset_table()))
    assert "(preset smoke -> quickstart, " in notes[0] and notes[0].endswith("(-S train.max_lr=0.003)")
    assert notes[0].count("-S ") == 2  # `an earlier -S holds ...` and the one to repeat
    assert len(notes[0]) - len(str(tmp_path)) < 400


def test_the_closest_preset_is_the_one_a_run_was_composed_from():
    table = preset_table()
    assert run_folder.Presets("quickstart", table).closest(run_of("smoke")) == "smoke"
    assert run_folder.Presets("quickstart", table).closest(run_of("quickstart", max_lr=3e-3)) == "quickstart"
    assert run_folder.Presets("smoke", {"smoke": {}, "q": {"train.max_lr": 1.0}}).closest({}) == "q"  # {}: no values
    assert run_folder.Presets(None).closest(run_of("smoke")) is None
