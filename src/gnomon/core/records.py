"""``replace`` for the decider's frozen states, without ``dataclasses.replace``'s cost.

``dataclasses.replace`` looks the fields up and calls the frozen ``__init__``, which sets
every field with ``object.__setattr__``: ~8 us for a ``RunState`` of 33 fields, and the
processor makes about ten per run (issue 22's profile: ``replace`` and ``__init__`` were
11 % of its CPU). For a dataclass whose ``__init__`` only stores its fields (no
``__post_init__``, no ``InitVar``, no ``init=False`` field, no ``__slots__``), copying
the instance's ``__dict__`` and overwriting the changed fields gives the same object,
in ~1.2 us. Any other class, or a name that is not a field, goes to
``dataclasses.replace`` (which checks and raises as usual).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

_PLAIN: dict[type, frozenset[str]] = {}  # class -> its field names if copying is exact, else empty


def _plain_fields(cls: type) -> frozenset[str]:
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__:
        return frozenset()
    fields = dataclasses.fields(cls)
    if any(not f.init for f in fields):
        return frozenset()
    if any(isinstance(v, dataclasses.InitVar) for v in getattr(cls, "__annotations__", {}).values()):
        return frozenset()
    return frozenset(f.name for f in fields)


def replace(obj: T, /, **changes: Any) -> T:
    """``dataclasses.replace(obj, **changes)``, by copy when that is exact."""
    cls = type(obj)
    names = _PLAIN.get(cls)
    if names is None:
        names = _PLAIN[cls] = _plain_fields(cls)
    if not names or not changes.keys() <= names:
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    new: T = object.__new__(cls)
    state = new.__dict__
    state.update(obj.__dict__)
    state.update(changes)
    return new
