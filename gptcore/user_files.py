"""The user's own files read as they are: text as UTF-8 (a byte-order mark dropped), with a one-line error naming the
file, offset and line; YAML (params.yaml, conf/*.yaml, conf/baselines.yaml) by one reader, as YAML defines it."""
from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import yaml

from gptcore.errors import UserError

BOM = "\ufeff"  # a UTF-8 byte-order mark: an editor's note on the encoding, not text


def read_utf8(path: Path) -> str:
    """A text file's content without a leading byte-order mark; bytes that are not UTF-8 are one line naming the
    file, offset and line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}: not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}, line {line})") from None


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader (anchors, aliases and merge keys as YAML defines them) refusing what PyYAML lets through
    in silence: a key given twice in one mapping (PyYAML keeps the last; DVC refuses the file) and a non-finite
    number (.nan, .inf: no value of the project's files takes one, and JSON has none)."""


def _where(node: yaml.Node) -> str:
    return f"{node.start_mark.name}:{node.start_mark.line + 1}"


def _unique_mapping(loader: _Loader, node: yaml.MappingNode) -> dict:
    """A mapping whose own keys are distinct; keys a merge (`<<: *anchor`) brings in give way to them, as YAML's merge
    key defines."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key (a list): construct_mapping names it
            continue
        if first is not None:
            raise UserError(f"{_where(key_node)}: key {key!r} is given twice (also on line {first}): keep one")
        seen[key] = line
    return loader.construct_mapping(node)


def _finite_float(loader: _Loader, node: yaml.ScalarNode) -> float:
    value = loader.construct_yaml_float(node)
    if not math.isfinite(value):
        raise UserError(f"{_where(node)}: {node.value} is not a finite number: give a number (or null where the "
                        f"key allows none)")
    return value


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)
_Loader.add_constructor("tag:yaml.org,2002:float", _finite_float)


def read_yaml(path: str | Path, missing: str = "not found") -> Any:
    """The one YAML reader of the project's files: `path`'s document (None for an empty file). A missing file (said
    with `missing`), bytes that are not UTF-8, invalid YAML, a key given twice in a mapping or a non-finite number is
    one line naming the file and, where it has one, the line."""
    path = Path(path)
    try:
        text = read_utf8(path)
    except FileNotFoundError:
        raise UserError(f"{path}: {missing}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror or e})") from None
    try:
        stream = io.StringIO(text)
        stream.name = str(path)  # PyYAML's marks, and so every error, name the file
        return yaml.load(stream, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        what = getattr(e, "problem", None) or str(e)
        context = getattr(e, "context", None)
        what = f"{context}, {what}" if context else what
        raise UserError(f"{where}: not valid YAML ({what}): fix the file (e.g. the indentation or a quote)") from None

