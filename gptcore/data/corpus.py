"""The fetched corpus read back (the tokenize stage's input): fetch.json and the parquet files it lists, in streaming
batches or as units of work for the tokenize workers, never the whole corpus in memory.

fetch (gptcore/data/sources.py) writes this format: a folder of parquet files with one string column plus
`fetch.json` (source, text column, total documents, and per file its path, documents, bytes and sha256).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from gptcore.errors import UserError

FETCH_RECORD = "fetch.json"
READ_BATCH_DOCS = 1024  # documents decoded at a time from a parquet row group (a hub file's groups can be large)


# ---------------------------------------------------------------------------------------------
# checks shared with fetch, which validates local parquet files the same way before copying them

def check_text_type(path: Path, schema: pa.Schema, column: str) -> None:
    """ValueError naming the file unless `schema` has a string column `column` (fetch.text_column says which)."""
    if column not in schema.names:
        raise UserError(f"{path}: no text column {column!r} (columns: {', '.join(schema.names)}); "
                         f"set fetch.text_column")
    t = schema.field(column).type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _: False)(t)):
        raise UserError(f"{path}: text column {column!r} holds {t}, not strings")


def check_docs(path: Path, docs: list, first_row: int) -> list[str]:
    """`docs` unchanged if every one is a string; else ValueError naming the file and row (a null, say)."""
    for i, d in enumerate(docs):
        if not isinstance(d, str):
            raise UserError(f"{path}: document at row {first_row + i} is {type(d).__name__}, not a string")
    return docs


def column_texts(column: pa.Array | pa.ChunkedArray, path: Path, first_row: int) -> list[str]:
    """A parquet text column's values as str, checked: ValueError naming the file and row for a value that is not a
    string (a null) or not valid UTF-8 (a lone surrogate written as bytes, say), not a UnicodeDecodeError traceback."""
    try:
        docs = column.to_pylist()
    except UnicodeDecodeError:
        for i in range(len(column)):  # the error path only: find the row
            try:
                column.slice(i, 1).to_pylist()
            except UnicodeDecodeError as e:
                raise UserError(f"{path}: row {first_row + i}: not valid UTF-8 text ({e.reason} at byte {e.start} of "
                                f"the document); fix or drop that row") from None
        raise
    return check_docs(path, docs, first_row)


def column_utf8(column: pa.Array | pa.ChunkedArray, path: Path, first_row: int) -> list[bytes]:
    """A parquet text column's values as their UTF-8 bytes (no str is built), checked as column_texts checks them:
    every value a string, valid UTF-8 (Arrow's full validation, in C++); the error names the file and row."""
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)) or column.null_count:
        column_texts(column, path, first_row)  # raises, naming the row
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        column_texts(column, path, first_row)  # raises, naming the row
        raise
    return column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()).to_pylist()


def lone_surrogate(text: str) -> int | None:
    """Index of the first lone surrogate in `text` (JSON can spell one, '\\ud800', UTF-8 cannot), else None."""
    m = _SURROGATE.search(text)
    return None if m is None else m.start()


_SURROGATE = re.compile("[\ud800-\udfff]")


def open_parquet(path: Path, text_column: str, fix: str = "") -> pq.ParquetFile:
    """A parquet file checked to parse and to hold a string `text_column`; `fix` ends the error (what to do)."""
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path}: not a readable parquet file ({e}){fix}") from None
    check_text_type(path, pf.schema_arrow, text_column)
    return pf


# ---------------------------------------------------------------------------------------------
# reading fetched documents back (the tokenize stage)

@dataclass
class Corpus:
    """The documents fetch wrote, as listed by raw_dir/fetch.json."""

    root: Path
    record: dict

    @property
    def documents(self) -> int:
        """Number of documents fetch wrote."""
        return int(self.record["documents"])

    @property
    def text_column(self) -> str:
        """The parquet column holding each document's text."""
        return self.record.get("text_column") or "text"

    def files(self) -> list[tuple[Path, int]]:
        """(parquet path, documents in it) for every file, in order."""
        return [(self.root / f["path"], int(f["documents"])) for f in self.record["files"]]

    def batches(self, start_doc: int = 0, target_bytes: int = 1 << 20, max_docs: int = 8192) -> Iterator[tuple[int, list[str]]]:
        """Yield (index of the batch's first document, documents) from document `start_doc` on.

        A batch closes once it holds about target_bytes of text (or max_docs documents), so work
        units stay similar in cost whatever the document sizes. Whole row groups before start_doc
        are skipped without being read."""
        col = self.text_column
        doc = 0
        buf: list[str] = []
        size = 0
        buf_start = start_doc
        for path, n_docs in self.files():
            if doc + n_docs <= start_doc:
                doc += n_docs
                continue
            pf = self._open(path)
            left = n_docs
            for rg in range(pf.num_row_groups):
                if left <= 0:
                    break
                rg_rows = pf.metadata.row_group(rg).num_rows
                if doc + rg_rows <= start_doc:
                    doc += rg_rows
                    left -= rg_rows
                    continue
                # record batches, not the whole row group: a hub file's row groups can be large
                for rb in pf.iter_batches(batch_size=READ_BATCH_DOCS, row_groups=[rg], columns=[col]):
                    if left <= 0:
                        break
                    docs = column_texts(rb.column(0).slice(0, left), path, n_docs - left)
                    skip = max(0, start_doc - doc)
                    left -= len(docs)
                    doc += len(docs)
                    for d in docs[skip:]:
                        buf.append(d)
                        size += len(d)
                        if size >= target_bytes or len(buf) >= max_docs:
                            yield buf_start, buf
                            buf_start += len(buf)
                            buf, size = [], 0
            if left > 0:
                raise UserError(f"{path}: has {n_docs - left} documents, {FETCH_RECORD} lists {n_docs}; run fetch again")
        if buf:
            yield buf_start, buf

    def _open(self, path: Path) -> pq.ParquetFile:
        """A listed parquet file, checked to exist, to parse and to hold a string text column."""
        if not path.is_file():
            raise UserError(f"{path}: listed in {self.root / FETCH_RECORD} but missing; run fetch again")
        return open_parquet(path, self.text_column)

    def text_bytes(self) -> int:
        """The text column's size over all files, uncompressed, from parquet metadata alone (an estimate of the text)."""
        total = 0
        for path, _ in self.files():
            md = self._open(path).metadata
            col = next(j for j in range(md.num_columns) if md.schema.column(j).path == self.text_column)
            total += sum(md.row_group(rg).column(col).total_uncompressed_size for rg in range(md.num_row_groups))
        return total

    def tasks(self, start_doc: int = 0, task_bytes: int = 4 << 20) -> Iterator[ReadTask]:
        """Units of work for the tokenize workers, from document `start_doc` on, planned from parquet metadata alone,
        each about task_bytes of text: consecutive row groups of a file together, and a row group holding more than
        task_bytes cut into slices of about that size (each worker then decodes it once)."""
        doc = 0
        for path, n_docs in self.files():
            if doc + n_docs <= start_doc:
                doc += n_docs
                continue
            pf = self._open(path)
            md = pf.metadata
            col = next(j for j in range(md.num_columns) if md.schema.column(j).path == self.text_column)
            file_row, left = 0, n_docs
            group: list = []  # row groups gathered into one task: [first_doc, [row groups], offset, rows, file_row, bytes]
            for rg in range(md.num_row_groups):
                if left <= 0:
                    break
                rg_rows = md.row_group(rg).num_rows
                rows = min(rg_rows, left)
                if doc + rows > start_doc and rows > 0:
                    skip = max(0, start_doc - doc)
                    text_bytes = md.row_group(rg).column(col).total_uncompressed_size * (rows - skip) / rg_rows
                    if group and group[5] + text_bytes > task_bytes:
                        yield ReadTask(group[0], str(path), self.text_column, tuple(group[1]), *group[2:5])
                        group = []
                    if text_bytes > task_bytes:
                        per = math.ceil((rows - skip) / math.ceil(text_bytes / task_bytes))
                        for off in range(skip, rows, per):
                            yield ReadTask(doc + off, str(path), self.text_column, (rg,), off, min(per, rows - off),
                                           file_row + off)
                    elif group:
                        group[1].append(rg)
                        group[3] += rows
                        group[5] += text_bytes
                    else:
                        group = [doc + skip, [rg], skip, rows - skip, file_row + skip, text_bytes]
                doc += rows
                file_row += rg_rows
                left -= rows
            if group:
                yield ReadTask(group[0], str(path), self.text_column, tuple(group[1]), *group[2:5])
            if left > 0:
                raise UserError(f"{path}: has {n_docs - left} documents, {FETCH_RECORD} lists {n_docs}; run fetch again")

    def texts(self) -> Iterator[str]:
        """Every document, one at a time (for building a char vocabulary or training BPE)."""
        for _, docs in self.batches():
            yield from docs


class ReadTask(NamedTuple):
    """Rows [offset, offset + rows) of consecutive parquet row groups read as one: documents first_doc, first_doc + 1,
    ..."""

    first_doc: int
    path: str
    text_column: str
    row_groups: tuple[int, ...]
    offset: int
    rows: int
    file_row: int  # the first row's index in the file, for error messages


# per process (each tokenize worker): the last file opened and the last row group decoded, so the
# slices of a large row group that land on the same worker decode it once
_open_file: tuple[str, pq.ParquetFile] | None = None
_decoded: tuple[tuple[str, tuple[int, ...]], pa.ChunkedArray] | None = None


def _task_column(task: ReadTask) -> pa.ChunkedArray:
    """The task's rows of its text column, decoded (a large row group split over tasks is decoded once per worker)."""
    global _open_file, _decoded
    key = (task.path, task.row_groups)
    if _decoded is not None and _decoded[0] == key:
        column = _decoded[1]
    else:
        if _open_file is None or _open_file[0] != task.path:
            _open_file = (task.path, pq.ParquetFile(task.path))
        pf = _open_file[1]
        column = pf.read_row_groups(list(task.row_groups), columns=[task.text_column], use_threads=False).column(0)
        whole = task.offset == 0 and task.rows == len(column)
        _decoded = None if whole else (key, column)
    column = column.slice(task.offset, task.rows)
    if len(column) != task.rows:
        raise UserError(f"{task.path}: row groups {task.row_groups} have fewer rows than planned; run fetch again")
    return column


def read_task(task: ReadTask, utf8: bool = False) -> list[str] | list[bytes]:
    """The documents of one task, as str or, with `utf8`, as UTF-8 bytes (for an encoder that takes them);
    ValueError naming the file and row if one is not a string."""
    return (column_utf8 if utf8 else column_texts)(_task_column(task), Path(task.path), task.file_row)


def read_task_chunks(task: ReadTask, chunk_bytes: int,
                     utf8: bool = False) -> Iterator[tuple[int, list[str] | list[bytes]]]:
    """read_task in runs of consecutive documents of about `chunk_bytes` of text each, as (first document, documents):
    a tokenize worker holds one run's Python strings and tokens at a time, however large its task."""
    column = _task_column(task)
    step = max(1, math.ceil(len(column) * chunk_bytes / max(column.nbytes, 1)))
    for i in range(0, len(column), step):
        part = column.slice(i, step)
        yield task.first_doc + i, (column_utf8 if utf8 else column_texts)(part, Path(task.path), task.file_row + i)


def open_corpus(raw_dir: str | Path) -> Corpus:
    """Read raw_dir/fetch.json (written by fetch) and check the files it lists exist."""
    raw_dir = Path(raw_dir)
    path = raw_dir / FETCH_RECORD
    if not path.is_file():
        raise UserError(f"{path}: not found; run the fetch stage first")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        files = record["files"]
        int(record["documents"])
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path}: not a fetch record ({e})") from None
    if record["documents"] == 0 or not files:
        raise UserError(f"{path}: the corpus is empty (0 documents)")
    for f in files:
        if not (raw_dir / f["path"]).is_file():
            raise UserError(f"{raw_dir / f['path']}: listed in {path} but missing; run fetch again")
    return Corpus(raw_dir, record)
