"""The user-error class and the disk errors the atomic writer turns into one line (the stage-level cases are in
tests/test_bad_params.py)."""
from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest
import torch

from gptcore.atomic import write_text
from gptcore.errors import UserError, disk_error, one_line, user_error
from gptcore.model.checkpoint_file import atomic_torch_save
from gptcore.params import ParamError


def test_bugs_and_faults_the_user_cannot_fix_are_not_user_errors():
    assert user_error(KeyError("x")) is None and user_error(ValueError("a bug")) is None
    assert user_error(OSError(errno.EIO, "I/O error")) is None  # not one the user can fix from here


def test_one_line_whatever_the_message_holds():
    e = UserError("cannot reach the hub:\n  ConnectionError\n\nset fetch.source: local")
    assert one_line("fetch", e) == "[fetch] cannot reach the hub: ConnectionError set fetch.source: local"
    assert one_line("train", ParamError("train.seed", -1, "must be >= 0")) == (
        "[train] params.yaml train.seed=-1: must be >= 0")


def test_errno_full_and_read_only_name_the_file():
    full = disk_error(OSError(errno.ENOSPC, "No space left on device"), "/x/y.pt", needed=2048, written=1024)
    assert isinstance(full, UserError)
    assert str(full) == ("/x/y.pt: no space left on / (2,048 bytes needed, 1,024 written): free some space there "
                         "(or point the folder at a larger disk) and run again")
    ro = disk_error(OSError(errno.EROFS, "Read-only file system"), "/x/y.pt")
    assert str(ro).startswith("/x/y.pt: cannot write (read-only file system): make / writable")
    bug = RuntimeError("shape mismatch")
    assert disk_error(bug, "/x/y.pt", free=10 << 30) is bug  # a full disk only when the file system is full


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 1 MiB tmpfs (needs root and mount: skipped elsewhere)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_torch_save_on_a_full_disk_is_one_line_and_leaves_nothing(tiny_tmpfs):
    """torch.save reports a full disk as `inline_container.cc:... unexpected pos`: the writer names the disk and
    what the write needed, and the old file and the folder stay as they were."""
    old = tiny_tmpfs / "ckpt.pt"
    atomic_torch_save({"w": torch.zeros(16)}, old)
    before = old.read_bytes()
    with pytest.raises(UserError) as err:
        atomic_torch_save({"w": torch.zeros(1 << 20)}, old)  # 4 MiB of tensor on a 1 MiB file system
    msg = str(err.value)
    assert msg.startswith(f"{old}: no space left on {tiny_tmpfs} (4,194,304 bytes needed,") and "\n" not in msg
    assert "inline_container" in repr(err.value.__cause__)  # what torch said, kept as the cause
    assert old.read_bytes() == before and [p.name for p in tiny_tmpfs.iterdir()] == ["ckpt.pt"]


def test_a_plain_write_on_a_full_disk_names_what_was_written(tiny_tmpfs):
    with pytest.raises(UserError, match=r"big.txt: no space left on .* written\)"):
        write_text(tiny_tmpfs / "big.txt", "x" * (2 << 20))
    assert list(Path(tiny_tmpfs).iterdir()) == []
