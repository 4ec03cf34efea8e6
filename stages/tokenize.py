"""Stage `tokenize`: data/raw/ -> data/shards/ ({val,train}_NNNNNN.npy + manifest.json + vocabulary file).

Resumes an interrupted run and leaves finished shards alone when the params fingerprint still matches
(dvc.yaml marks data/shards `persist: true`, so DVC does not delete them before rerunning the stage)."""
from __future__ import annotations

from pathlib import Path

from gptcore.data.params import TOKENIZE
from gptcore.data.tokenize import tokenize
from gptcore.process import stage_lifetime
from stages.common import load_params, user_errors

RAW = Path("data/raw")
SHARDS = Path("data/shards")


def main() -> None:
    """Tokenize data/raw/ into data/shards/ by params.yaml's `tokenize:`; one line naming the problem on bad input."""
    with user_errors("tokenize"):
        m = tokenize(RAW, SHARDS, load_params(TOKENIZE))
    print(f"[tokenize] {m['documents']:,} documents -> {m['tokens']['val']:,} val + {m['tokens']['train']:,} train "
          f"tokens in {len(m['shards'])} shards ({m['dtype']}, tokenizer {m['tokenizer']['name']}) -> {SHARDS}")


if __name__ == "__main__":
    with stage_lifetime("tokenize"):
        main()
