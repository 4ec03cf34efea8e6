"""Stage `tokenize`: data/raw/ -> data/shards/ ({val,train}_NNNNNN.npy + manifest.json + vocabulary file).

Resumes an interrupted run and leaves finished shards alone when the params fingerprint still matches
(dvc.yaml marks data/shards `persist: true`, so DVC does not delete them before rerunning the stage)."""
from __future__ import annotations

from pathlib import Path

from gptcore.data.config import TokenizeConfig
from gptcore.data.tokenize import tokenize
from stages.boundary import stage

RAW = Path("data/raw")
SHARDS = Path("data/shards")


def main() -> None:
    """Tokenize data/raw/ into data/shards/ by params.yaml's `tokenize:`; one line naming the problem on bad input."""
    with stage("tokenize", reads=[RAW], writes=[SHARDS]) as s:
        m = tokenize(RAW, SHARDS, s.config(TokenizeConfig))
        s.say(f"{m['documents']:,} documents -> {m['tokens']['val']:,} val + {m['tokens']['train']:,} train tokens "
              f"in {len(m['shards'])} shards ({m['dtype']}, tokenizer {m['tokenizer']['name']}) -> {SHARDS}")


if __name__ == "__main__":
    main()
