"""Stage `fetch`: params.yaml `fetch:` -> data/raw/ (parquet documents with a text column + fetch.json)."""
from __future__ import annotations

from pathlib import Path

from gptcore.data.params import FETCH
from gptcore.data.sources import fetch
from gptcore.process import FolderLock, stage_lifetime
from stages.common import load_params, user_errors

RAW = Path("data/raw")


def main() -> None:
    """Fetch params.yaml's `fetch:` source into data/raw/; one line naming the problem on bad input."""
    with user_errors("fetch"):
        p = load_params(FETCH)
        with FolderLock(RAW, "fetch"):  # one fetch per folder: a second one refuses before it downloads or deletes
            rec = fetch(p, RAW, progress=True)
    print(f"[fetch] {rec['documents']:,} documents from {rec['source']} {rec['name']} "
          f"in {len(rec['files'])} file(s) -> {RAW}")


if __name__ == "__main__":
    with stage_lifetime("fetch"):
        main()
