"""What evaluate's figures were measured on, metrics/measured_on.json: compare sets a figure beside a published one only
where this record matches conf/baselines.yaml's (docs/evaluation.md lists its fields)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from gptcore.data.shards import read_manifest
from gptcore.eval.harness import Tasks
from gptcore.eval.hellaswag import hellaswag_file


def val_split(shard_dir: str | Path, scored_tokens: int) -> dict[str, Any]:
    """The identity of `shard_dir`'s val split, from its manifest (docs/evaluation.md)."""
    m = read_manifest(shard_dir)
    source = m.get("source") or {}
    val = [s for s in m["shards"] if s["split"] == "val"]
    return {"tokenizer": (m.get("tokenizer") or {}).get("name"), "source": source.get("source"),
            "dataset": source.get("name"), "config": source.get("config"), "revision": source.get("revision"),
            "split_tokens": (m.get("params") or {}).get("val_tokens"), "val_tokens": sum(s["tokens"] for s in val),
            "val_sha256": [s.get("sha256") for s in val], "fingerprint": m.get("fingerprint"),
            "scored_tokens": scored_tokens}


def measured_on(p: dict[str, Any], shard_dir: str | Path, lm_tasks: Tasks | None,
                hellaswag_dir: str | Path = "data/hellaswag") -> dict[str, Any]:
    """The record for an `eval:` section `p` (validated), made before any pass, once the data has been read."""
    record: dict[str, Any] = {"val_split": val_split(shard_dir, p["val_tokens"])}
    if p["task"] == "hellaswag":
        record["hellaswag"] = hellaswag_file(p["hellaswag_path"], hellaswag_dir)
    if lm_tasks is not None:
        record["lm_eval"] = {"tasks": lm_tasks.sources, "python": [str(f) for f in lm_tasks.python]}
    return record
