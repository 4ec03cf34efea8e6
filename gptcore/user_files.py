"""The user's own files read as they are: text as UTF-8, with a one-line error naming the file, offset and line."""
from __future__ import annotations

from pathlib import Path

from gptcore.errors import UserError


def read_utf8(path: Path) -> str:
    """A text file's content; bytes that are not UTF-8 are one line naming the file, offset and line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}: not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}, line {line})") from None
