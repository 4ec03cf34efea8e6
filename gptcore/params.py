"""The schema mechanics of params.yaml: one `Section` per top-level section, one `Param` per key.

Each section's schema lives beside the code that reads it and is the one statement of its keys: conf/config.yaml
is written from it, and the typed configs the library takes (GPTConfig, TrainConfig) are made from it (`config`).
A bad value is a `ParamError`: one line naming `section.key`, the value and what is allowed.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from gptcore.errors import UserError

REQUIRED: Any = "???"  # no default: conf/config.yaml shows `???` and every preset sets the key
INT_LIMIT = 2**63 - 1  # the largest integer torch and numpy take as an int64 (a seed, a count)


class ParamError(UserError):
    """A params.yaml value that is not allowed; str() is one line: `section.key=value: what is allowed`."""

    file = "params.yaml"

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!r}: {allowed}")


@dataclass(frozen=True)
class Param:
    """One key: its type, default, allowed values and a one-line description."""

    kind: type  # int, float, bool, str or list (of strings); bool is never accepted as an int or a float
    default: Any = REQUIRED
    doc: str = ""
    min: float | None = None  # inclusive bounds for numbers
    max: float | None = None
    above: float | None = None  # exclusive lower bound for numbers
    below: float | None = None  # exclusive upper bound for numbers
    choices: tuple = ()  # for str: the only values allowed (empty: any string)
    pattern: str = ""  # for str: a regular expression the whole value must match
    what: str = ""  # what is allowed, in words, where the kind and bounds would not say it well
    also: tuple = ()  # literal values accepted besides the kind, e.g. (None,) or ("auto",)
    resume_ok: bool = False  # train only: may differ from the checkpoint's run on resume (not in the fingerprint)

    def allowed(self) -> str:
        """What this key accepts, in words (the tail of a ParamError)."""
        if self.what:
            what = self.what
        elif self.choices:
            what = "one of " + ", ".join(map(str, self.choices))
        elif self.pattern:
            what = f"a string matching {self.pattern}"
        else:
            what = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
                    list: "a list of distinct strings"}[self.kind]
            limits = ((">=", self.min), (">", self.above), ("<=", self.max), ("<", self.below))
            bounds = [f"{op} {int(b) if float(b).is_integer() else repr(b)}" for op, b in limits if b is not None]
            if bounds:
                what += " " + " and ".join(bounds)
        extra = ["null" if a is None else str(a) for a in self.also]
        return "must be " + " or ".join([what, *extra])

    def check(self, key: str, value: Any) -> Any:
        """The value as the code reads it (a float for float keys), or a ParamError."""
        if any(value is a or (a is not None and value == a and type(value) is type(a)) for a in self.also):
            return value
        bad = ParamError(key, value, self.allowed())
        if self.kind is list:  # of strings, e.g. eval.lm_eval_tasks: [hellaswag, lambada_openai]
            if (not isinstance(value, list) or not all(isinstance(v, str) and v for v in value)
                    or len(set(value)) != len(value)):
                raise bad
            return list(value)
        if self.kind is str:
            if (not isinstance(value, str) or (self.choices and value not in self.choices)
                    or (self.pattern and not re.fullmatch(self.pattern, value))):
                raise bad
            return value
        if isinstance(value, bool) != (self.kind is bool):  # a bool is never an int or a float here
            raise bad
        if self.kind is int:
            if not isinstance(value, int):
                raise bad
            if abs(value) > INT_LIMIT and self.max is None:
                raise ParamError(key, value, f"{self.allowed()} and fit in 64 bits (at most {INT_LIMIT:,})")
        elif self.kind is float:
            # PyYAML reads `6e-4` (no dot) as a string; accept a numeric string, never a word like `fast`.
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    raise bad from None
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad
            value = float(value)
        if ((self.min is not None and value < self.min) or (self.max is not None and value > self.max)
                or (self.above is not None and value <= self.above) or (self.below is not None and value >= self.below)):
            raise bad
        return value


class Section:
    """The schema of one params.yaml section: its keys in order, and checks that relate several keys."""

    def __init__(self, name: str, params: dict[str, Param],
                 relations: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.name, self.params, self.relations = name, params, relations

    def defaults(self) -> dict[str, Any]:
        """Every key with its default (REQUIRED where a preset must set it), in schema order."""
        return {k: p.default for k, p in self.params.items()}

    def validate(self, values: Any) -> dict[str, Any]:
        """The section with defaults filled in, in schema order; ParamError for unknown, missing or bad keys."""
        if not isinstance(values, dict):
            raise ParamError(self.name, values, f"must be a mapping of {', '.join(self.params)}")
        for key in values:
            if key not in self.params:
                raise ParamError(f"{self.name}.{key}", values[key], f"unknown param (known: {', '.join(self.params)})")
        out: dict[str, Any] = {}
        for key, param in self.params.items():
            name, value = f"{self.name}.{key}", values.get(key, param.default)
            if isinstance(value, str) and value == REQUIRED:  # `???` given, or no default
                raise ParamError(name, values.get(key), "required (no default): set it in the preset or params.yaml")
            out[key] = param.check(name, value) if key in values else value
        if self.relations is not None:
            self.relations(out)
        return out

    def config(self, omit: tuple[str, ...] = (), defaults: dict[str, Any] | None = None,
               frozen: bool = False) -> Callable[[type], type]:
        """A class decorator making the typed config of this section: a keyword-only dataclass with one field per key
        (less `omit`), typed by its Param (None where null is allowed), defaulting to the schema's default or to
        `defaults`' (a REQUIRED key has none). It checks nothing: `validate` did, once."""
        def make(cls: type) -> type:
            own = cls.__dict__.get("__annotations__", {})
            annotations: dict[str, Any] = {}
            for key, param in self.params.items():
                if key in omit:
                    continue
                annotations[key] = param.kind | None if None in param.also else param.kind
                default = (defaults or {}).get(key, param.default)
                if default is not REQUIRED:
                    setattr(cls, key, field(default_factory=lambda d=default: list(d)) if isinstance(default, list)
                            else default)
            cls.__annotations__ = {**annotations, **own}
            return dataclass(frozen=frozen, kw_only=True)(cls)
        return make


def check_val_tokens(key: str, val_tokens: int, block_size: int, val_split_tokens: int | None = None) -> None:
    """A val loss over `val_tokens` (train.val_tokens, eval.val_tokens) needs one full window of the model's context
    and no more tokens than the val split holds."""
    if val_tokens < block_size:
        raise ParamError(key, val_tokens, f"must be >= the model's block_size = {block_size} (at least one full "
                                          f"window of targets)")
    if val_split_tokens is not None and val_tokens > val_split_tokens:
        raise ParamError(key, val_tokens, f"must be <= the {val_split_tokens:,} tokens of the val split "
                                          f"(tokenize.val_tokens)")


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing a key given twice in one mapping (PyYAML keeps the last one silently; DVC
    refuses the file, so the stages do too)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise UserError(f"{key_node.start_mark.name}:{line}: key {key!r} is given twice (also on line "
                            f"{seen[key]}): keep one")
        seen[key] = line
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_params_file(path: str | Path) -> dict[str, Any]:
    """The sections of a params file; a UserError naming the file (and line) when it is missing, is not valid YAML,
    gives a key twice or is not a mapping of sections."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            params = yaml.load(f, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except FileNotFoundError:
        raise UserError(f"{path.resolve()}: params file not found (run stages from the project root)") from None
    except (OSError, UnicodeDecodeError, yaml.reader.ReaderError) as e:
        raise UserError(f"{path}: cannot read the params file ({e})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        what = getattr(e, "problem", None) or str(e)
        raise UserError(f"{where}: not valid YAML ({what}): fix the file (e.g. the indentation or a quote)") from None
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise UserError(f"{path}: expected a mapping of sections (fetch:, tokenize:, model:, ...), got a "
                        f"{type(params).__name__}")
    return params
