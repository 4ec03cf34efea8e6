"""The fetched corpus read back for tokenize: fetch.json and the parquet files it lists, streamed in batches or
planned as tasks for the tokenize workers (the format gptcore/data/sources.py writes)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from gptcore.errors import UserError

FETCH_RECORD = "fetch.json"
# text per tokenize task (tokenize.task_size cuts it for a small corpus); why this size: docs/benchmarks.md
TASK_BYTES = 64 << 20


# -- checks shared with fetch, which reads local parquet files the same way -------------------

def column_texts(column: pa.Array | pa.ChunkedArray, path: Path, first_row: int) -> list[str]:
    """A parquet text column's values as str; UserError naming the file and row for a null or invalid UTF-8."""
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
    for i, d in enumerate(docs):
        if not isinstance(d, str):
            raise UserError(f"{path}: document at row {first_row + i} is {type(d).__name__}, not a string")
    return docs


def column_utf8(column: pa.Array | pa.ChunkedArray, path: Path, first_row: int) -> list[bytes]:
    """A parquet text column's values as UTF-8 bytes (no str built), checked as column_texts checks them (in C++)."""
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)) or column.null_count:
        column_texts(column, path, first_row)  # raises, naming the row
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        column_texts(column, path, first_row)  # raises, naming the row
        raise
    return column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()).to_pylist()


def open_parquet(path: Path, text_column: str, fix: str = "") -> pq.ParquetFile:
    """A parquet file checked to parse and to hold a string `text_column` (fetch.text_column); `fix` ends the error."""
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path}: not a readable parquet file ({e}){fix}") from None
    schema = pf.schema_arrow
    if text_column not in schema.names:
        raise UserError(f"{path}: no text column {text_column!r} (columns: {', '.join(schema.names)}); "
                        f"set fetch.text_column")
    t = schema.field(text_column).type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)
            or getattr(pa.types, "is_string_view", lambda _: False)(t)):
        raise UserError(f"{path}: text column {text_column!r} holds {t}, not strings")
    return pf


# -- reading fetched documents back (the tokenize stage) --------------------------------------

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

    def batches(self, start_doc: int = 0, target_bytes: int = 1 << 20,
                max_docs: int = 8192) -> Iterator[tuple[int, list[str]]]:
        """(index of the first document, documents) from document `start_doc` on, each batch closed at about
        target_bytes of text or max_docs documents."""
        global _decoded
        buf: list[str] = []
        first, size = start_doc, 0
        try:
            for task in self.tasks(start_doc, target_bytes):
                for d in read_task(task):
                    buf.append(d)
                    size += len(d)
                    if size >= target_bytes or len(buf) >= max_docs:
                        yield first, buf
                        first, buf, size = first + len(buf), [], 0
            if buf:
                yield first, buf
        finally:
            _decoded = None  # a large row group decoded here is not kept for the rest of the run

    def _text_sizes(self, md: pq.FileMetaData) -> list[int]:
        """The text column's uncompressed bytes in each row group, from the metadata alone."""
        col = next(j for j in range(md.num_columns) if md.schema.column(j).path == self.text_column)
        return [md.row_group(rg).column(col).total_uncompressed_size for rg in range(md.num_row_groups)]

    def text_bytes(self) -> int:
        """The text column's size over all files, uncompressed, from parquet metadata alone (an estimate of \
the text)."""
        return sum(sum(self._text_sizes(open_parquet(path, self.text_column).metadata)) for path, _ in self.files())

    def tasks(self, start_doc: int = 0, task_bytes: int = TASK_BYTES) -> Iterator[ReadTask]:
        """Units of work for the tokenize workers from document `start_doc` on, planned from parquet metadata alone,
        each about task_bytes of text: consecutive row groups of a file together, a larger row group cut in slices."""
        doc = 0
        for path, n_docs in self.files():
            if doc + n_docs <= start_doc:
                doc += n_docs
                continue
            md = open_parquet(path, self.text_column).metadata
            sizes = self._text_sizes(md)
            file_row, left = 0, n_docs
            group, group_bytes = None, 0.0  # consecutive row groups gathered into one task
            for rg in range(md.num_row_groups):
                if left <= 0:
                    break
                rg_rows = md.row_group(rg).num_rows
                rows, skip = min(rg_rows, left), max(0, start_doc - doc)
                if rows > skip:
                    text = sizes[rg] * (rows - skip) / rg_rows
                    if group is not None and group_bytes + text > task_bytes:
                        yield group
                        group, group_bytes = None, 0.0
                    if text > task_bytes:
                        per = math.ceil((rows - skip) / math.ceil(text / task_bytes))
                        for off in range(skip, rows, per):
                            yield ReadTask(doc + off, str(path), self.text_column, (rg,), off, min(per, rows - off),
                                           file_row + off)
                    else:  # joins the group (skip is 0 but in its first row group)
                        group = group or ReadTask(doc + skip, str(path), self.text_column, (), skip, 0, file_row + skip)
                        group = group._replace(row_groups=group.row_groups + (rg,), rows=group.rows + rows - skip)
                        group_bytes += text
                doc += rows
                file_row += rg_rows
                left -= rows
            if group is not None:
                yield group
            if left > 0:
                raise UserError(f"{path}: has {n_docs - left} documents, {FETCH_RECORD} lists {n_docs}; "
                                "run fetch again")

    def texts(self) -> Iterator[str]:
        """Every document, one at a time (for building a char vocabulary or training BPE)."""
        for _, docs in self.batches():
            yield from docs


class ReadTask(NamedTuple):
    """Rows [offset, offset + rows) of consecutive parquet row groups read as one: documents first_doc, ..."""

    first_doc: int
    path: str
    text_column: str
    row_groups: tuple[int, ...]
    offset: int
    rows: int
    file_row: int  # the first row's index in the file, for error messages


# per process: the last file opened and the last row group decoded, so the slices of a large row group that land on
# the same worker decode it once; a file is known by its inode and mtime too, since a new fetch rewrites the same path
_open_file: tuple[tuple, pq.ParquetFile] | None = None
_decoded: tuple[tuple, pa.ChunkedArray] | None = None


def _task_column(task: ReadTask) -> pa.ChunkedArray:
    """The task's rows of its text column, decoded."""
    global _open_file, _decoded
    st = os.stat(task.path)
    file = (task.path, st.st_ino, st.st_mtime_ns, st.st_size)
    key = (file, task.row_groups)
    if _decoded is not None and _decoded[0] == key:
        column = _decoded[1]
    else:
        if _open_file is None or _open_file[0] != file:
            _open_file = (file, pq.ParquetFile(task.path))
        pf = _open_file[1]
        column = pf.read_row_groups(list(task.row_groups), columns=[task.text_column], use_threads=False).column(0)
        whole = task.offset == 0 and task.rows == len(column)
        _decoded = None if whole else (key, column)
    column = column.slice(task.offset, task.rows)
    if len(column) != task.rows:
        raise UserError(f"{task.path}: row groups {task.row_groups} have fewer rows than planned; run fetch again")
    return column


def read_task(task: ReadTask, utf8: bool = False) -> list[str] | list[bytes]:
    """The documents of one task, as str or, with `utf8`, as UTF-8 bytes (for an encoder that takes them)."""
    return (column_utf8 if utf8 else column_texts)(_task_column(task), Path(task.path), task.file_row)


def read_task_chunks(task: ReadTask, chunk_bytes: int,
                     utf8: bool = False) -> Iterator[tuple[int, list[str] | list[bytes]]]:
    """read_task in runs of about `chunk_bytes` of text, as (first document, documents): a worker holds one run's
    strings and tokens at a time, however large its task."""
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
