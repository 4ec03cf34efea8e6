"""Shard files: .npy format, the writer's exact sizes and resume points, the reader's errors, list_shards, verify."""
from __future__ import annotations

import errno
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from gptcore.data import shard_writer, verify
from gptcore.data import shards as S
from gptcore.errors import UserError


def docs_stream(lengths: list[int], eot: int = 9, dtype=np.uint16):
    """Documents of the given token counts (eot + ids 0..n-1), as the tokenize workers return them."""
    parts, starts, pos = [], [], 0
    for n in lengths:
        starts.append(pos)
        parts.append(np.concatenate([[eot], np.arange(n) % 9]).astype(dtype))
        pos += n + 1
    return np.concatenate(parts), np.array(starts, dtype=np.int64)


def write(tmp_path, lengths, shard_tokens, val_tokens, batch=3, resume=None, header=None):
    header = header or {"tokenizer": {"name": "t"}, "vocab_size": 10, "eot": 9, "dtype": "uint16", "fingerprint": "f"}
    w = shard_writer.ShardWriter(tmp_path, header, shard_tokens, val_tokens, resume=resume)
    doc, _ = w.resume_point
    while doc < len(lengths):
        toks, starts = docs_stream(lengths[doc:doc + batch])
        w.add(doc, toks, starts)
        doc += len(starts)
    return w.finish(len(lengths))


def test_npy_header_matches_np_save_and_loads(tmp_path):
    for dtype in (np.uint16, np.uint32):
        a = np.arange(1000, dtype=dtype)
        buf = io.BytesIO()
        np.save(buf, a)
        assert S.npy_header(np.dtype(dtype), len(a)) + a.tobytes() == buf.getvalue()
    assert len(S.npy_header(np.dtype(np.uint16), 10**15)) == 128


def test_writer_cuts_exact_shards_val_first(tmp_path):
    lengths = [5, 12, 0, 7, 30, 3, 3, 3, 20, 1]  # 84 tokens + 10 eot = 94
    m = write(tmp_path, lengths, shard_tokens=20, val_tokens=25)
    names = [(s["name"], s["tokens"]) for s in m["shards"]]
    assert names == [("val_000000.npy", 20), ("val_000001.npy", 5), ("train_000000.npy", 20),
                     ("train_000001.npy", 20), ("train_000002.npy", 20), ("train_000003.npy", 9)]
    full, _ = docs_stream(lengths)
    got = np.concatenate([S.load_tokens(tmp_path / s["name"]) for s in m["shards"]])
    assert np.array_equal(got, full)
    for s in m["shards"]:
        arr = S.load_tokens(tmp_path / s["name"])
        assert s["documents"] == int(np.count_nonzero(arr == 9))
        assert s["sha256"] == S.file_sha256(tmp_path / s["name"])
    assert m["complete"] and m["tokens"] == {"val": 25, "train": 69} and m["documents"] == 10
    # each recorded resume point says where the next shard's first token is in the document stream
    starts = np.flatnonzero(full == 9)
    pos = 0
    for s in m["shards"]:
        pos += s["tokens"]
        nxt = s["next"]
        if pos < len(full):
            assert starts[nxt["doc"]] + nxt["offset"] == pos
        else:
            assert nxt == {"doc": len(lengths), "offset": 0}
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.parametrize("stop_after", [1, 2, 4])
def test_writer_resume_is_byte_identical(tmp_path, stop_after):
    lengths = [5, 12, 0, 7, 30, 3, 3, 3, 20, 1]
    ref = write(tmp_path / "ref", lengths, 20, 25)
    part = tmp_path / "part"
    # an interrupted run: keep the manifest as it was after `stop_after` shards
    m = write(part, lengths, 20, 25)
    m = dict(m, complete=False, shards=m["shards"][:stop_after])
    for s in ref["shards"][stop_after:]:
        (part / s["name"]).unlink()
    (part / ".train_000003.npy.123.tmp").write_bytes(b"partial")  # a killed run's temp file
    kept = {s["name"]: (part / s["name"]).stat().st_ino for s in m["shards"]}
    again = write(part, lengths, 20, 25, batch=4, resume=m)
    assert again["shards"] == ref["shards"]
    for s in ref["shards"]:
        assert (part / s["name"]).read_bytes() == (tmp_path / "ref" / s["name"]).read_bytes()
    assert {n: (part / n).stat().st_ino for n in kept} == kept  # finished shards were not rewritten
    assert not list(part.glob(".*tmp"))


def test_writer_keeps_a_finished_shard_the_manifest_missed(tmp_path):
    lengths = [5, 12, 0, 7, 30]
    m = write(tmp_path, lengths, 20, 0)
    # killed after renaming train_000001 but before the manifest listed it
    partial = dict(m, complete=False, shards=m["shards"][:1])
    ino = (tmp_path / "train_000001.npy").stat().st_ino
    again = write(tmp_path, lengths, 20, 0, resume=partial)
    assert again["shards"] == m["shards"] and (tmp_path / "train_000001.npy").stat().st_ino == ino
    # ... but refuses to overwrite a finished shard with different content
    (tmp_path / "train_000001.npy").write_bytes(S.npy_header(np.dtype(np.uint16), 20) + bytes(40))
    with pytest.raises(UserError, match=r"train_000001\.npy: a finished shard with different content"):
        write(tmp_path, lengths, 20, 0, resume=partial)
    assert (tmp_path / "train_000001.npy").read_bytes()[128:] == bytes(40)


def test_writer_errors_on_bad_sizes(tmp_path):
    with pytest.raises(shard_writer.CannotFinish, match="fewer than tokenize.val_tokens=1,000"):
        write(tmp_path, [5, 5], 20, 1000)
    assert not list(tmp_path.glob("*.npy")) and not list(tmp_path.glob(".*tmp"))
    with pytest.raises(shard_writer.CannotFinish, match="nothing is left for train"):
        write(tmp_path, [4, 4], 20, 10)
    # sizes are the tokenize schema's to refuse (tests/test_params.py); the writer only asserts them
    with pytest.raises(AssertionError):
        write(tmp_path, [4], 0, 0)
    with pytest.raises(AssertionError):
        write(tmp_path, [4], 10, -1)


def test_load_tokens_reports_bad_files(tmp_path):
    good = tmp_path / "train_000000.npy"
    np.save(good, np.arange(100, dtype=np.uint16))
    arr = S.load_tokens(good)
    assert isinstance(arr, np.memmap) and arr.dtype == np.uint16 and arr[-1] == 99
    trunc = tmp_path / "trunc.npy"
    trunc.write_bytes(good.read_bytes()[:-10])
    with pytest.raises(S.CorruptShard, match=r"trunc\.npy: corrupt or truncated"):
        S.load_tokens(trunc)
    longer = tmp_path / "longer.npy"
    longer.write_bytes(good.read_bytes() + b"xx")
    with pytest.raises(S.CorruptShard, match=r"longer\.npy: 330 bytes on disk, the header promises 328"):
        S.load_tokens(longer)
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"hello world" * 20)
    with pytest.raises(S.CorruptShard, match=r"junk\.npy: not a \.npy file"):
        S.load_tokens(junk)
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    with pytest.raises(S.CorruptShard, match=r"empty\.npy: not a \.npy file"):
        S.load_tokens(empty)
    np.save(tmp_path / "f.npy", np.zeros(4, np.float32))
    with pytest.raises(S.CorruptShard, match=r"f\.npy: holds a 1-D float32 array"):
        S.load_tokens(tmp_path / "f.npy")
    np.save(tmp_path / "m.npy", np.zeros((2, 2), np.uint16))
    with pytest.raises(S.CorruptShard, match=r"m\.npy: holds a 2-D uint16 array"):
        S.load_tokens(tmp_path / "m.npy")
    with pytest.raises(UserError, match=r"missing\.npy: cannot read shard"):
        S.load_tokens(tmp_path / "missing.npy")


def test_list_shards_with_and_without_manifest(tmp_path):
    write(tmp_path, [5, 12, 0, 7, 30, 3, 3, 3, 20, 1] * 2, 20, 25)
    (tmp_path / ".train_000009.npy.1.tmp").write_bytes(b"x")
    (tmp_path / "edufineweb_train_000000.npy").write_bytes(b"x")
    train = S.list_shards(tmp_path, "train")
    assert [p.name for p in train] == [f"train_{i:06d}.npy" for i in range(9)]  # 188 - 25 tokens
    assert [p.name for p in S.list_shards(tmp_path, "val")] == ["val_000000.npy", "val_000001.npy"]
    nano = tmp_path / "nano"
    nano.mkdir()
    for name in ["edufineweb_train_000010.npy", "edufineweb_train_000002.npy", "edufineweb_val_000000.npy"]:
        np.save(nano / name, np.zeros(3, np.uint16))
    assert [p.name for p in S.list_shards(nano, "train")] == ["edufineweb_train_000002.npy",
                                                              "edufineweb_train_000010.npy"]
    assert [p.name for p in S.list_shards(nano, "val")] == ["edufineweb_val_000000.npy"]
    with pytest.raises(ValueError, match="split 'test'"):
        S.list_shards(tmp_path, "test")
    with pytest.raises(UserError, match="shard folder not found"):
        S.list_shards(tmp_path / "nowhere", "train")


def test_read_manifest_errors(tmp_path):
    with pytest.raises(UserError, match="no manifest"):
        S.read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{oops", encoding="utf-8")
    with pytest.raises(S.CorruptManifest, match="not valid JSON"):
        S.read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"tokenizer": {}}), encoding="utf-8")
    with pytest.raises(S.CorruptManifest, match="missing key 'vocab_size'"):
        S.read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_bytes(b'{"tokenizer": "\xff\xfe"}')  # not UTF-8: a foreign file
    with pytest.raises(S.CorruptManifest, match="not valid JSON"):
        S.read_manifest(tmp_path)


def test_a_manifest_of_another_format_is_refused_not_guessed_at(tmp_path):
    m = write(tmp_path, [5, 12, 0, 7, 30], 20, 0)
    for other in (2, None):
        (tmp_path / "manifest.json").write_text(json.dumps({k: v for k, v in dict(m, format=other).items()
                                                            if v is not None}), encoding="utf-8")
        with pytest.raises(S.CorruptManifest, match=f"format {other!r}: this gptcore reads shard format 1"):
            S.read_manifest(tmp_path)
    # a model folder's manifest (a tokenizer, no shards) has no shard format to check
    (tmp_path / "manifest.json").write_text(json.dumps({"tokenizer": {"name": "t"}, "format": 7}))
    assert S.read_manifest(tmp_path, require=("tokenizer",))["format"] == 7


def test_an_io_error_is_no_corruption(tmp_path, monkeypatch):
    """EIO reading a shard or the manifest keeps its OSError: only what is recognised as damage is a CorruptShard
    (which check_shard reports as a problem, and tokenize's check turns into "delete the damaged file")."""
    m = write(tmp_path, [5, 12, 0, 7, 30], 20, 0)
    real_open, real_read_text = open, Path.read_text

    def eio_open(path, *a, **k):
        if Path(path).name == "train_000001.npy":
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real_open(path, *a, **k)

    def eio_read_text(self, *a, **k):
        if self.name == "manifest.json":
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real_read_text(self, *a, **k)

    monkeypatch.setattr(S, "open", eio_open, raising=False)
    monkeypatch.setattr(Path, "read_text", eio_read_text)
    for call in (lambda: S.load_tokens(tmp_path / "train_000001.npy"),
                 lambda: S.check_shard(tmp_path, "uint16", 9, m["shards"][1]),
                 lambda: S.read_manifest(tmp_path), lambda: verify.verify(tmp_path)):
        with pytest.raises(OSError) as e:
            call()
        assert e.value.errno == errno.EIO and not isinstance(e.value, UserError)


def test_writer_resumes_a_manifest_with_a_gap_from_the_gap(tmp_path):
    """An older gptcore's abort could list shards after one it never recorded: the writer keeps the listed prefix
    in sequence, rewrites from the gap on, and keeps each later shard whose bytes are already there."""
    lengths = [5, 12, 0, 7, 30, 3, 3, 3, 20, 1]
    (tmp_path / "ref").mkdir()
    ref = write(tmp_path / "ref", lengths, 20, 25)
    part = tmp_path / "part"
    part.mkdir()
    for s in ref["shards"]:
        (part / s["name"]).write_bytes((tmp_path / "ref" / s["name"]).read_bytes())
    (part / "train_000000.npy").unlink()
    gap = dict(ref, complete=False, shards=[s for s in ref["shards"] if s["name"] != "train_000000.npy"])
    later = {n: (part / n).stat().st_ino for n in ("train_000001.npy", "train_000002.npy")}
    again = write(part, lengths, 20, 25, resume=gap)
    assert again["shards"] == ref["shards"] and {n: (part / n).stat().st_ino for n in later} == later
    # a listed shard shorter than the layout's is out of sequence too, unless it is the last one
    short = dict(ref, complete=False, shards=[dict(ref["shards"][0], tokens=19)] + ref["shards"][1:])
    assert shard_writer.ShardWriter(part, ref, 20, 25, resume=short).resume_point == (0, 0)


def test_verify_and_cli(tmp_path, capsys):
    write(tmp_path, [5, 12, 0, 7, 30, 3, 3, 3, 20, 1], 20, 25)
    assert verify.verify(tmp_path) == []
    assert verify.main([str(tmp_path)]) == 0
    assert "ok: 6 shards, 94 tokens, uint16" in capsys.readouterr().out
    # flip one token: same size, different content
    p = tmp_path / "train_000001.npy"
    data = bytearray(p.read_bytes())
    data[-1] ^= 1
    p.write_bytes(bytes(data))
    (tmp_path / "val_000000.npy").unlink()
    np.save(tmp_path / "train_000099.npy", np.zeros(3, np.uint16))
    (tmp_path / "train_000002.npy").write_bytes((tmp_path / "train_000002.npy").read_bytes()[:-4])
    problems = verify.verify(tmp_path)
    text = "\n".join(problems)
    assert "val_000000.npy: missing" in text
    assert "train_000001.npy: sha256 does not match" in text
    assert re.search(r"train_000002.npy: .* bytes, .* truncated", text)
    assert "train_000099.npy: shard file not listed" in text
    assert len(problems) == 4
    assert verify.main([str(tmp_path)]) == 1
    assert verify.verify(tmp_path / "nothing")[0].endswith("no manifest; run the tokenize stage")


@pytest.mark.parametrize("change, says", [
    ({"tokenizer": "gpt2"}, "tokenizer 'gpt2': must be an object with the tokenizer's name"),
    ({"complete": "yes"}, "complete 'yes': must be true or false"),
])
def test_gptcore_verify_shards_names_a_manifest_field_of_another_shape(tmp_path, change, says):
    """A tokenizer given as a string was a TypeError traceback after every shard had been hashed; "complete": "yes"
    passed for a finished tokenize run. Run as the console script runs (python -m)."""
    import subprocess
    import sys

    m = write(tmp_path, [5, 12, 0, 7], 20, 5)
    (tmp_path / "manifest.json").write_text(json.dumps({**m, **change}))
    proc = subprocess.run([sys.executable, "-m", "gptcore.data.verify", str(tmp_path)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert proc.returncode == 1 and proc.stdout == (f"{tmp_path / 'manifest.json'}: {says}; rerun the tokenize "
                                                    f"stage (or restore the file)\n"), proc.stdout + proc.stderr
