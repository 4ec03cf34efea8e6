"""wandb as an opt-in logger beside dvclive (gptcore/report/steplog.py), tested offline: the W&B run's own file
(run-<id>.wandb, read back here with a reader of its record format written in this test) holds the same metric
names at the same steps as dvclive's TSVs, the run is named after the DVC experiment, and only rank 0 logs."""
from __future__ import annotations

import csv
import json
import math
import os
import struct
import subprocess
import sys

import pytest
from stagekit import train_config

from gptcore.report.steplog import StepLogger, wandb_sinks

BLOCK = 32768  # the record log's block size (LevelDB's log format, which W&B's datastore uses)


def wandb_records(path):
    """Every protobuf Record of a W&B run file: a 7-byte header (':W&B', magic, version), then LevelDB-log chunks
    (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) that never straddle a 32 KiB block."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # the tail of a block too small for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def offline_run(root):
    import wandb

    wandb.teardown()  # run.finish() may return before wandb-core has flushed the run file (seen: 7 bytes, the header)
    runs = list(root.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(runs) == 1, runs
    history, name, summary = [], None, {}
    for r in wandb_records(runs[0]):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            row = {_key(i): json.loads(i.value_json) for i in r.history.item}
            history.append({k: v for k, v in row.items() if not k.startswith("_")})  # W&B's own _step, _runtime
        elif kind == "run":
            name = name or r.run.display_name
        elif kind == "summary":
            summary.update({_key(i): json.loads(i.value_json) for i in r.summary.update})
    return name, history, summary


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("DVC_EXP_NAME", "qs-lr")
    return tmp_path


def dvclive_rows(live_dir):
    rows = {}
    for tsv in (live_dir / "plots" / "metrics").glob("*.tsv"):
        with open(tsv, encoding="utf-8") as f:
            for r in csv.DictReader(f, delimiter="\t"):
                rows.setdefault(int(r["step"]), {})[tsv.stem] = float(r[tsv.stem])
    return rows


def test_offline_run_has_dvclive_names_and_steps(offline):
    train = train_config(wandb_log=True, wandb_project="gptcore-test")
    logger = StepLogger(offline / "live", also=wandb_sinks(train, {"train": {"max_lr": 1e-3}}, is_main=True))
    logger.log_constants({"params": 1234})
    for step in (0, 1, 2, 5):
        logger.log(step, {"train_loss": 10.0 - step, "lr": 1e-3 * step, "val_loss": 9.0 if step == 5 else None,
                          "grad_norm": math.nan if step == 1 else 0.5})
    logger.close()

    name, history, summary = offline_run(offline)
    assert name == "qs-lr"  # DVC_EXP_NAME, as dvc exp run sets it
    ours = {row.pop("step"): row for row in history}
    assert ours == dvclive_rows(offline / "live")  # same names, same steps, the same values left out
    assert summary["params"] == 1234 and summary["train_loss"] == 5.0


def test_only_rank_0_and_only_when_asked(offline):
    assert wandb_sinks(train_config(wandb_log=True, wandb_project="p"), {}, is_main=False) == []
    assert wandb_sinks(train_config(wandb_log=False, wandb_project="p"), {}, is_main=True) == []

    class Sink:
        calls = 0

        def log(self, *a):
            Sink.calls += 1

    quiet = StepLogger(offline / "live", enabled=False, also=[Sink()])
    quiet.log(0, {"train_loss": 1.0})
    quiet.close()
    assert Sink.calls == 0 and not (offline / "wandb").exists()


def test_online_without_an_account_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), WANDB_MODE="online", WANDB_DIR=str(tmp_path), WANDB_SILENT="true")
    code = "from gptcore.report.steplog import WandbLog\nWandbLog('gptcore', {})"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode != 0
    assert ("UserError: train.wandb_log: W&B could not start a run" in proc.stderr
            and "WANDB_MODE=offline" in proc.stderr)


@pytest.mark.slow  # a train stage in a subprocess
def test_train_stage_with_wandb_log_offline(tmp_path):
    from stagekit import env, make_project, stage_cmd, write_gpt2_shards

    project = make_project(tmp_path / "p", write_gpt2_shards(tmp_path / "shards"), wandb_log=True,
                           wandb_project="gptcore-test")
    e = {k: v for k, v in env().items() if not k.startswith("WANDB_")}
    e.update(WANDB_MODE="offline", WANDB_SILENT="true", DVC_EXP_NAME="qs-wandb")
    proc = subprocess.run(stage_cmd("train"), cwd=project, env=e, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    name, history, summary = offline_run(project)
    assert name == "qs-wandb"
    ours = {}
    for row in history:
        ours.setdefault(row.pop("step"), {}).update(row)
    assert ours == dvclive_rows(project / "metrics" / "train")
    assert summary["params"] > 0
