"""What every source shares: a `Source` (its own checks of the `fetch:` section, and how it fetches), and the writer of
the documents a package or local source yields: parquet files built aside and swapped in whole, then fetch.json."""
from __future__ import annotations

import itertools
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sized

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from gptcore.atomic import publish, swap_dir, temp_beside, write_json
from gptcore.data.config import FetchConfig
from gptcore.data.corpus import FETCH_RECORD
from gptcore.digests import file_sha256
from gptcore.errors import UserError
from gptcore.folders import staged_dir

ROW_GROUP_DOCS = 1024  # at most this many documents per parquet row group in the files fetch writes
ROW_GROUP_BYTES = 1 << 20  # ... and about this much text (corpus.Corpus.tasks gathers row groups into tasks)
DOCS_PER_FILE = 1_000_000


@dataclass(frozen=True)
class Source:
    """One choice of `fetch.source`: `check(cfg)` refuses, before anything is read, a `fetch:` section this source
    cannot use (a ParamError naming the key); `fetch(cfg, out_dir, progress, transport)` writes out_dir's documents
    and fetch.json and returns its record (`transport`: how a download talks to its server, None for the real one; a
    source that downloads nothing ignores it)."""

    check: Callable[[FetchConfig], None]
    fetch: Callable[[FetchConfig, Path, bool, Any], dict]


def _batched(docs: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(docs)
    while batch := list(itertools.islice(it, size)):
        yield batch


def _row_groups(batches: Iterable[list[str]], max_docs: int | None, docs_per_file: int,
                bar: tqdm) -> Iterator[list[str]]:
    """The documents (the first max_docs) regrouped for the parquet files: a group closes at about ROW_GROUP_BYTES of
    text, ROW_GROUP_DOCS documents or the end of a file of docs_per_file."""
    group: list[str] = []
    size = total = 0
    for d in itertools.islice(itertools.chain.from_iterable(batches), max_docs):
        group.append(d)
        size += len(d)
        total += 1
        if size >= ROW_GROUP_BYTES or len(group) == ROW_GROUP_DOCS or total % docs_per_file == 0:
            bar.update(len(group))
            yield group
            group, size = [], 0
    if group:
        bar.update(len(group))
        yield group


def write_documents(batches: Iterable[list[str]], out_dir: str | Path, max_docs: int | None = None,
                    docs_per_file: int = DOCS_PER_FILE, progress: bool = False) -> list[dict]:
    """Stream document batches into out_dir/documents_NNNNNN.parquet (column 'text'); returns the file records."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    writer, tmp, in_file = None, Path(), 0

    def publish_file() -> None:
        nonlocal writer, in_file
        writer.close()
        dst = out_dir / f"documents_{len(records):06d}.parquet"
        publish(tmp, dst)
        records.append({"path": dst.name, "documents": in_file, "bytes": dst.stat().st_size,
                        "sha256": file_sha256(dst)})
        writer, in_file = None, 0

    bar = tqdm(total=max_docs, unit="doc", unit_scale=True, desc="fetch", disable=not progress, dynamic_ncols=True)
    try:
        for group in _row_groups(batches, max_docs, docs_per_file, bar):
            if writer is None:
                tmp = temp_beside(out_dir / f"documents_{len(records):06d}.parquet")
                # zstd, no dictionary: unique documents gain nothing from one; zstd decompresses faster than snappy
                writer = pq.ParquetWriter(tmp, pa.schema([("text", pa.large_string())]), compression="zstd",
                                          use_dictionary=False)
            writer.write_table(pa.table({"text": pa.array(group, pa.large_string())}), row_group_size=len(group))
            in_file += len(group)
            if in_file == docs_per_file:
                publish_file()
        if writer is not None:
            publish_file()
    finally:
        bar.close()
        if writer is not None:  # an error mid-stream: leave no partial file behind
            writer.close()
            tmp.unlink(missing_ok=True)
    return records


def publish_documents(batches: Iterable[list[str]], out_dir: Path, source: str, name: str, label: str,
                      max_docs: int | None, progress: bool, before_swap: Callable[[], None] | None = None,
                      also: dict[str, Any] | None = None, files_read: Sized | None = None) -> dict:
    """Write `batches` as out_dir/<label>/'s parquet files, built aside and swapped in whole, then fetch.json, whose
    record it returns (`source` and `name` are what it records the documents came from; `also`, more of the
    record). `before_swap` runs once every document is written, before anything is replaced: its error publishes
    nothing (a source whose input changed meanwhile). `files_read`: the source's files, each added as `batches`
    opens it; the record counts them (`files_read`), where `files` are those written."""
    final = out_dir / label
    tmp_dir = staged_dir(final)  # a link or a mount point there is refused now, before anything is read or goes
    shutil.rmtree(tmp_dir, ignore_errors=True)
    try:
        recs = write_documents(batches, tmp_dir, max_docs=max_docs, progress=progress)
        if before_swap is not None:
            before_swap()
        if not recs:
            raise UserError(f"fetch produced no documents ({source} {name}): the corpus is empty")
        # the old record goes before its files and the new one comes last: a kill in between leaves no record
        (out_dir / FETCH_RECORD).unlink(missing_ok=True)
        swap_dir(tmp_dir, final)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    for r in recs:
        r["path"] = f"{label}/{r['path']}"
    record = {"source": source, "name": name, "config": None, "text_column": "text",
              "documents": sum(r["documents"] for r in recs), "files": recs, **(also or {})}
    if files_read is not None:
        record["files_read"] = len(files_read)
    write_json(out_dir / FETCH_RECORD, record)
    return record
