"""The one atomic writer: permissions as open() gives them without touching the umask, nothing left on an error, and a
folder swapped in whole."""
from __future__ import annotations

import os
import stat

import pytest

from gptcore import atomic


def test_atomic_write_gives_open_s_permissions_and_never_touches_the_umask(tmp_path, monkeypatch):
    (tmp_path / "plain").write_text("x")  # what open() makes under this process's umask
    want = stat.S_IMODE((tmp_path / "plain").stat().st_mode)

    def no_umask(*a):  # toggling the umask races with any thread creating files (the shard closer did)
        raise AssertionError("os.umask called")

    monkeypatch.setattr(os, "umask", no_umask)
    atomic.write_text(tmp_path / "a.txt", "hello")
    with atomic.atomic_write(tmp_path / "b.bin", "wb") as f:
        f.write(b"\x00\x01")
    with atomic.atomic_path(tmp_path / "c.json") as tmp:
        tmp.write_text("{}")
    assert (tmp_path / "a.txt").read_text() == "hello" and (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    for name in ("a.txt", "b.bin", "c.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == want
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin", "c.json", "plain"]


def test_an_error_inside_leaves_the_old_file_and_no_temp(tmp_path):
    atomic.write_json(tmp_path / "m.json", {"a": 1})
    with pytest.raises(RuntimeError), atomic.atomic_write(tmp_path / "m.json") as f:
        f.write("half")
        raise RuntimeError("checksum failed")
    with pytest.raises(RuntimeError), atomic.atomic_path(tmp_path / "m.json") as tmp:
        tmp.write_text("half")
        raise RuntimeError
    assert (tmp_path / "m.json").read_text() == '{\n  "a": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_write_json_writes_strict_json_only(tmp_path, value):
    """JSON has no NaN or infinity (json.loads of other languages refuses Python's bare NaN): such a value is a bug of
    the caller, which gives a finite number or None; the file stays as it was."""
    atomic.write_json(tmp_path / "m.json", {"a": 1.5, "b": None})
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        atomic.write_json(tmp_path / "m.json", {"a": {"b": [value]}})
    assert (tmp_path / "m.json").read_text() == '{\n  "a": 1.5,\n  "b": null\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_temp_names_are_hidden_distinct_and_end_in_tmp(tmp_path):
    names = {atomic.temp_beside(tmp_path / "shard.npy").name for _ in range(50)}
    assert len(names) == 50 and all(n.startswith(".shard.npy.") and n.endswith(atomic.TMP_SUFFIX) for n in names)


@pytest.mark.parametrize("exchange", [True, False])
def test_swap_dir_replaces_a_folder_whole(tmp_path, monkeypatch, exchange):
    if not exchange:  # the fallback for systems without renameat2
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    final, staged = tmp_path / "shards", tmp_path / ".shards.next"
    final.mkdir()
    (final / "old.npy").write_bytes(b"old")
    (final / "manifest.json").write_text("old")
    staged.mkdir()
    (staged / "manifest.json").write_text("new")
    (staged / "sub").mkdir()
    (staged / "sub" / "x").write_text("x")
    inode = staged.stat().st_ino
    atomic.swap_dir(staged, final)
    assert final.stat().st_ino == inode  # the very folder that was built aside, not a copy
    assert sorted(str(p.relative_to(final)) for p in final.rglob("*")) == ["manifest.json", "sub", "sub/x"]
    assert (final / "manifest.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]
    # into a place where nothing was
    staged.mkdir()
    (staged / "a").write_text("a")
    atomic.swap_dir(staged, tmp_path / "fresh")
    assert [p.name for p in (tmp_path / "fresh").iterdir()] == ["a"] and not staged.exists()
