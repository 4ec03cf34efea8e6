"""What evaluate's figures were measured on, metrics/measured_on.json: compare sets a figure beside a published one only
where this record matches conf/baselines.yaml's (docs/evaluation.md lists its fields)."""
from __future__ import annotations

from typing import Any

from gptcore.data.shard_set import ShardSet
from gptcore.eval.config import EvalConfig
from gptcore.eval.harness import Tasks
from gptcore.eval.tasks import tasks_named


def val_split(data: ShardSet, scored_tokens: int) -> dict[str, Any]:
    """The identity of the val split, from its manifest (docs/evaluation.md); build-nanogpt's shards, which have no
    manifest, leave unknown what they came from."""
    m = data.manifest or {}
    source = m.get("source") or {}
    val = [s for s in m.get("shards", []) if s["split"] == "val"]
    return {"tokenizer": data.tokenizer.name, "source": source.get("source"),
            "dataset": source.get("name"), "config": source.get("config"), "revision": source.get("revision"),
            "split_tokens": (m.get("params") or {}).get("val_tokens"), "val_tokens": data.tokens["val"],
            "val_sha256": [s.get("sha256") for s in val], "fingerprint": m.get("fingerprint"),
            "scored_tokens": scored_tokens}


def measured_on(cfg: EvalConfig, data: ShardSet, lm_tasks: Tasks | None, scored_tokens: int) -> dict[str, Any]:
    """The record for an `eval:` section whose val loss scores `scored_tokens`, made before any pass, once the data
    has been read."""
    record: dict[str, Any] = {"val_split": val_split(data, scored_tokens)}
    for name, task in tasks_named(cfg.tasks, "eval.tasks").items():
        if (what := task.record(cfg)) is not None:
            record[name] = what
    if lm_tasks is not None:
        record["lm_eval"] = {"tasks": lm_tasks.sources, "python": [str(f) for f in lm_tasks.python]}
    return record
