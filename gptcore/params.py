"""The mechanics of params.yaml's sections. Each section is a dataclass written out field by field beside the code
that reads it (`GPTConfig` in model/gpt.py, `TrainConfig` in train/config.py, ...), as nanoGPT's GPTConfig is: a
field's annotation is its type, and `param()` gives its default, its one-line description and the values it allows.

`Section.read` checks a section of params.yaml once, naming `section.key`, the value and what is allowed in one line
(`ParamError`), and returns the typed object the library takes. conf/config.yaml is written from these classes
(gptcore/conf.py).
"""
from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, Mapping, TypeVar, Union

from gptcore.errors import UserError
from gptcore.user_files import read_yaml

T = TypeVar("T")
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
    """The rules of one key: its type (from the field's annotation), default, description and allowed values."""

    kind: type  # int, float, bool, str or list (of strings); bool is never accepted as an int or a float
    default: Any = REQUIRED
    doc: str = ""
    min: float | None = None  # inclusive bounds for numbers
    max: float | None = None
    above: float | None = None  # exclusive lower bound for numbers
    below: float | None = None  # exclusive upper bound for numbers
    choices: tuple = ()  # str: the only values allowed (an extension point's names are checked by `choose` instead)
    pattern: str = ""  # for str: a regular expression the whole value must match
    what: str = ""  # what is allowed, in words, where the kind and bounds would not say it well
    also: tuple = ()  # literal values accepted besides the kind: None from `| None`, "auto" from `| Literal["auto"]`
    # may differ from the checkpoint's run on resume: changes how a run executes, not its weights
    resume_ok: bool = False
    # whether the key shapes the run's weights for this config (the run's fingerprint); False for resume_ok keys
    applies: Callable[[Any], bool] | None = None

    def allowed(self) -> str:
        """What this key accepts, in words (the tail of a ParamError)."""
        if self.what:
            what = self.what
        elif choices := self.choices:
            what = "one of " + ", ".join(map(str, choices))
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
            choices = self.choices
            if (not isinstance(value, str) or (choices and value not in choices)
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
                or (self.above is not None and value <= self.above)
                or (self.below is not None and value >= self.below)):
            raise bad
        return value


def choose(table: Mapping[str, T], key: str, name: Any) -> T:
    """What `name` names in an extension point's table (optimizers, tasks, sources, ...), or a ParamError naming the
    param `key` and the names there are. Config classes import no table (an implementation imports the config it
    reads), so a name is checked here, where a stage picks its parts, before any long pass."""
    if not isinstance(name, str) or name not in table:
        raise ParamError(key, name, f"must be one of {', '.join(table)}")
    return table[name]


def param(default: Any = REQUIRED, doc: str = "", **rules: Any) -> Any:
    """A field of a params section: its default (REQUIRED: none, each preset sets it), a one-line description, and
    the rules of `Param` (min, max, above, below, choices, pattern, what, resume_ok, applies)."""
    meta = {"param": dict(default=default, doc=doc, **rules)}
    if default is REQUIRED:
        return field(metadata=meta)
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def _kind(hint: Any) -> tuple[type, tuple]:
    """(the base type, the literal values besides it) of an annotation: `float | None` -> (float, (None,)),
    `int | Literal["auto"]` -> (int, ("auto",)), `list[str]` -> (list, ())."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        base, also = [], []
        for arg in typing.get_args(hint):
            if arg is type(None):
                also.append(None)
            elif typing.get_origin(arg) is Literal:
                also.extend(typing.get_args(arg))
            else:
                base.append(arg)
        (kind,), also = base, tuple(also)  # one base type a key
        return _kind(kind)[0], also
    return (list if typing.get_origin(hint) is list else hint), ()


class Section:
    """What every params section's dataclass shares: `read` (check a section of params.yaml, once), `params` (each
    key's rules, from the fields), `check` (rules between several keys). Subclasses set `section`, the name."""

    section: ClassVar[str]

    def check(self) -> None:
        """Rules between several keys of the section: a ParamError naming one (none here)."""

    @classmethod
    def params(cls) -> dict[str, Param]:
        """Each key's rules in field order, typed by the field's annotation."""
        cached = cls.__dict__.get("_params")
        if cached is None:
            hints = typing.get_type_hints(cls)
            cached = {}
            for f in dataclasses.fields(cls):
                rules = dict(f.metadata.get("param", {}))
                kind, also = _kind(hints[f.name])
                cached[f.name] = Param(kind=kind, also=also, **rules)
            setattr(cls, "_params", cached)
        return cached

    @classmethod
    def read(cls, values: Any) -> Any:
        """The section as this class, defaults filled in; a ParamError for an unknown, missing or bad key."""
        params = cls.params()
        if not isinstance(values, dict):
            raise ParamError(cls.section, values, f"must be a mapping of {', '.join(params)}")
        for key in values:
            if key not in params:
                raise ParamError(f"{cls.section}.{key}", values[key], f"unknown param (known: {', '.join(params)})")
        out: dict[str, Any] = {}  # the keys given; the class fills in the others' defaults
        for key, p in params.items():
            name, value = f"{cls.section}.{key}", values.get(key, p.default)
            if isinstance(value, str) and value == REQUIRED:  # `???` given, or no default
                raise ParamError(name, values.get(key), "required (no default): set it in the preset or params.yaml")
            if key in values:
                out[key] = p.check(name, value)
        obj = cls(**out)
        obj.check()
        return obj

    def fingerprint(self) -> dict[str, Any]:
        """The keys that shape a run's weights, with their values: not `resume_ok`, and applying to this config."""
        return {k: getattr(self, k) for k, p in self.params().items()
                if not p.resume_ok and (p.applies is None or p.applies(self))}


def read_params_file(path: str | Path) -> dict[str, Any]:
    """The sections of a params file (read by gptcore.user_files.read_yaml); a UserError naming the file (and line)
    when it is missing, is not valid YAML, gives a key twice, holds a non-finite number or is not a mapping of
    sections."""
    path = Path(path)
    params = read_yaml(path, missing=f"params file not found in {Path.cwd()} (run stages from the project root)")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise UserError(f"{path}: expected a mapping of sections (fetch:, tokenize:, model:, ...), got a "
                        f"{type(params).__name__}")
    return params
