"""Registries: the named implementations of one extension point (optimizers, eval tasks). Each implementation is a
module of the registry's package that registers itself; the registry imports every module of its package the first
time it is read, so adding one touches its own module and its config, nothing else. (stages/deps.py reads a package
that makes a Registry as importing all its modules: each is a code dep of the stages that use the registry.)"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> implementations, filled by the modules of `package` (a dotted name)."""

    def __init__(self, package: str, what: str) -> None:
        self.package, self.what = package, what
        self._items: dict[str, T] = {}
        self._loaded = False

    def register(self, name: str, item: T) -> T:
        """Add `item` under `name` (a name is taken once); returns the item."""
        if self._items.get(name, item) is not item:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._items[name] = item
        return item

    def _load(self) -> dict[str, T]:
        if not self._loaded:
            self._loaded = True
            for info in pkgutil.iter_modules(importlib.import_module(self.package).__path__):
                importlib.import_module(f"{self.package}.{info.name}")
        return self._items

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted."""
        return tuple(sorted(self._load()))

    def __getitem__(self, name: str) -> T:
        items = self._load()
        if name not in items:
            raise KeyError(f"no {self.what} {name!r} (registered: {', '.join(sorted(items))})")
        return items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._load()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
