"""Stage `fetch`: params.yaml `fetch:` -> data/raw/ (parquet documents with a text column + fetch.json)."""
from __future__ import annotations

from pathlib import Path

from gptcore.data.config import FetchConfig
from gptcore.data.sources import fetch
from gptcore.data.sources.local import WATCHED, watched
from stages.boundary import stage

RAW = Path("data/raw")


def main() -> None:
    """Fetch params.yaml's `fetch:` source into data/raw/; one line naming the problem on bad input."""
    with stage("fetch", writes=[RAW]) as s:  # a second fetch, or one while tokenize reads, refuses before it deletes
        cfg = s.config(FetchConfig)
        rec = fetch(cfg, RAW, progress=True)
        s.say(*(f"{link} is a symbolic link to {target}" for link, target in rec.get("links", {}).items()))
        if cfg.source == "local" and not watched(cfg.path):  # DVC would not rerun fetch after those files change
            s.say(f"note: fetch.path={cfg.path} is outside {WATCHED}/, which DVC watches: after changing its files, "
                  f"run `dvc repro -f fetch` (or move them into {WATCHED}/)")
        read = rec.get("files_read", len(rec["files"]) if rec["source"] == "hub" else None)  # a package: no files
        s.say(f"{rec['documents']:,} document{'s' * (rec['documents'] != 1)} from {rec['source']} {rec['name']}"
              + (f", {read:,} file{'s' * (read != 1)} read" if read is not None else "") + f" -> {RAW}")


if __name__ == "__main__":
    main()
