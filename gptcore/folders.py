"""Where the pipeline may write a folder: never through a symbolic link (at the folder or above it inside the
project: what it points to may be shared, or outside the project), and never a folder a rename cannot replace (a
mount point). A multi-file output is built in a hidden folder beside its place (`staged_dir`) and swapped in whole by
gptcore/atomic.py."""
from __future__ import annotations

import os
import re
from pathlib import Path

from gptcore.errors import UserError


class LinkedFolder(UserError):
    """A folder gptcore would write that is, or lies under, a symbolic link: writing through it would change what it
    points to (often shared, or outside the project)."""


class NotRenamable(UserError):
    """A folder gptcore replaces or fills by rename that a rename cannot reach: a mount point, another file system."""


def first_link(path: str | Path) -> Path | None:
    """The first symbolic link among `path` and the folders above it, from the project (the working directory) down;
    None for a path outside the project, whose folders are not the pipeline's to judge."""
    path = Path(os.path.abspath(path))
    root = Path.cwd()
    if not path.is_relative_to(root):
        return None
    for depth in range(1, len(path.relative_to(root).parts) + 1):
        step = root.joinpath(*path.relative_to(root).parts[:depth])
        if step.is_symlink():
            return step
    return None


def check_writable(folder: str | Path, what: str = "gptcore") -> None:
    """The one rule for where the pipeline writes: never through a symbolic link, at `folder` or above it inside the
    project (what it points to may be shared, or outside the project). A LinkedFolder naming the link and what to do;
    a link at a file's own name is no concern (the rename that publishes the file replaces the link itself)."""
    link = first_link(folder)
    if link is not None:
        raise LinkedFolder(f"{link} is a symbolic link (to {os.readlink(link)}): {what} writes nothing through a "
                           f"link (what it points to may be shared, or outside the project); remove the link (rm "
                           f"{link}: what it points to stays) and run again")


def refuse_link(final: str | Path, what: str, why: str = "the folder it points to may be shared") -> None:
    """LinkedFolder naming `final` and what to do, if `final` is a symbolic link (a dangling one included) or lies
    under one inside the project."""
    final = Path(final)
    if final.is_symlink():
        raise LinkedFolder(f"{final} is a symbolic link (to {os.readlink(final)}): {what} writes no folder through a "
                           f"link or over one ({why}); remove the link (rm {final}: what it points to stays) to "
                           f"write a local {final}, or point it at a folder made with these params")
    check_writable(final.parent, what)


MOUNTINFO = Path("/proc/self/mountinfo")  # Linux: every mount this process sees, bind mounts included


def _unescape(field: bytes) -> str:
    """A mountinfo path: the kernel writes a space, tab, newline and backslash as octal escapes (\\040 ...)."""
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field))


def mount_points() -> set[str] | None:
    """The mount points of this process's mount table (/proc/self/mountinfo's fifth field), None where there is
    none to read (not Linux)."""
    try:
        table = MOUNTINFO.read_bytes()
    except OSError:
        return None
    return {_unescape(fields[4]) for fields in map(bytes.split, table.splitlines()) if len(fields) > 4}


def is_mount_point(path: str | Path) -> bool:
    """Whether something is mounted at `path`, as the mount table says: a bind mount from the same file system
    included, which os.path.ismount does not see (same device, parent and child on it); ismount where there is no
    table."""
    points = mount_points()
    if points is not None and os.path.realpath(path) in points:
        return True
    return os.path.ismount(path)


def next_path(final: str | Path) -> Path:
    """The hidden name beside `final` where its next version is built (`staged_dir` checks it first)."""
    final = Path(final)
    return final.parent / f".{final.name}.next"


def staged_dir(final: str | Path) -> Path:
    """The hidden folder beside `final` where swap_dir's next version is built, once `final` is known to be swappable:
    no symbolic link at it or above it, and not a mount point (a rename cannot replace one)."""
    final = Path(final)
    refuse_link(final, "gptcore")
    if is_mount_point(final):  # a bind mount too: the rename would end in EBUSY after all the work
        raise NotRenamable(f"{final} is a mount point: a run replaces {final}/ whole by a rename, which cannot move a "
                           f"mount point; mount the disk at a folder above it (e.g. the project's) or unmount it, "
                           f"then run again (nothing was written)")
    staged = next_path(final)
    if staged.is_symlink():
        raise LinkedFolder(f"{staged} is a symbolic link (to {os.readlink(staged)}) where {final}'s next version is "
                           f"built (an older gptcore moved a link that stood at {final} there): remove it "
                           f"(rm {staged}: what it points to stays) and rerun")
    return staged
