"""Per-dataclass converters between frozen dataclasses and fastavro's dicts.

Generated once at import (``exec`` of straight-line code, one function per dataclass),
because the generic alternatives (``dataclasses.asdict``, a loop over ``fields()``) cost
several times more on the hot path. The mapping is driven by the dataclass type hints:

============================  ==========================  =============================
dataclass field               to Avro (write)             from Avro (read)
============================  ==========================  =============================
str/int/float/bool/bytes      as is                       as is
StrEnum                       as is (a str; fastavro      ``members[value]``
                              matches the enum symbol)
tuple[T, ...]                 as is (fastavro writes any  ``tuple(value)``
                              sequence as an array)
nested dataclass              its converter               its converter
``T | None``                  None or T's conversion      None or T's conversion
============================  ==========================  =============================

A dataclass field that the current schema lacks is skipped if it has a default (the
dataclass default applies on read); ``tests/unit/test_codec.py`` fails on such drift.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

_PRIMITIVES = (str, int, float, bool, bytes)


class Converters:
    """``to_avro[cls](obj) -> dict`` and ``from_avro[cls](dict) -> obj`` for dataclasses."""

    def __init__(self, schema_fields: Mapping[str, frozenset[str]]) -> None:
        # Avro record fullname ("gnomon.RunState") -> the field names its schema has.
        self._schema_fields = schema_fields
        self._ns: dict[str, Any] = {"_new": object.__new__}
        self._names: dict[type, str] = {}
        self._counter = itertools.count()
        self.to_avro: dict[type, Callable[[Any], dict[str, Any]]] = {}
        self.from_avro: dict[type, Callable[[dict[str, Any]], Any]] = {}

    def add(self, cls: type) -> None:
        if cls in self._names:
            return
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls!r} is not a dataclass")
        ident = f"{cls.__name__}_{next(self._counter)}"
        self._names[cls] = ident
        self._ns[f"_cls_{ident}"] = cls
        hints = typing.get_type_hints(cls)
        present = self._schema_fields.get(f"gnomon.{cls.__name__}")
        enc_items: list[str] = []
        dec_items: list[tuple[str, str]] = []
        # Fast construction (skip the frozen __init__, which costs one object.__setattr__
        # per field, ~5x the rest) when __init__ would only assign every field as given.
        fast = not hasattr(cls, "__post_init__") and "__slots__" not in cls.__dict__
        for f in dataclasses.fields(cls):
            if not f.init:
                fast = False
                continue
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if present is not None and f.name not in present and has_default:
                fast = False  # the dataclass default must apply
                continue
            hint = hints[f.name]
            enc_items.append(f"{f.name!r}: {self._enc(hint, f'o.{f.name}')}")
            dec_items.append((f.name, self._dec(hint, f"d[{f.name!r}]")))
        if fast:
            values = ", ".join(f"{name!r}: {expr}" for name, expr in dec_items)
            dec_body = f"o = _new(_cls_{ident})\n    o.__dict__.update({{{values}}})\n    return o"
        else:
            dec_body = f"return _cls_{ident}({', '.join(f'{name}={expr}' for name, expr in dec_items)})"
        src = (
            f"def _enc_{ident}(o):\n    return {{{', '.join(enc_items)}}}\n"
            f"def _dec_{ident}(d):\n    {dec_body}\n"
        )
        exec(compile(src, f"<gnomon.codec converter {cls.__qualname__}>", "exec"), self._ns)
        self.to_avro[cls] = self._ns[f"_enc_{ident}"]
        self.from_avro[cls] = self._ns[f"_dec_{ident}"]

    # ---- expression builders -----------------------------------------------------------

    def _var(self) -> str:
        return f"_v{next(self._counter)}"

    @staticmethod
    def _optional_inner(hint: Any) -> Any | None:
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(args) == 1 and len(typing.get_args(hint)) == 2:
                return args[0]
            raise TypeError(f"unsupported union {hint!r}: only `T | None`")
        return None

    def _enc(self, hint: Any, expr: str) -> str:
        inner = self._optional_inner(hint)
        if inner is not None:
            v = self._var()
            conv = self._enc(inner, v)
            return expr if conv == v else f"(None if ({v} := {expr}) is None else {conv})"
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            self.add(hint)
            return f"_enc_{self._names[hint]}({expr})"
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            if not issubclass(hint, str):
                raise TypeError(f"{hint!r}: only str enums are supported")
            return expr
        if typing.get_origin(hint) is tuple:
            item = self._tuple_item(hint)
            v = self._var()
            conv = self._enc(item, v)
            return expr if conv == v else f"[{conv} for {v} in {expr}]"
        if hint in _PRIMITIVES:
            return expr
        raise TypeError(f"unsupported field type {hint!r}")

    def _dec(self, hint: Any, expr: str) -> str:
        inner = self._optional_inner(hint)
        if inner is not None:
            v = self._var()
            conv = self._dec(inner, v)
            return expr if conv == v else f"(None if ({v} := {expr}) is None else {conv})"
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            self.add(hint)
            return f"_dec_{self._names[hint]}({expr})"
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            table = f"_members_{hint.__name__}_{next(self._counter)}"
            self._ns[table] = {m.value: m for m in hint}
            return f"{table}[{expr}]"
        if typing.get_origin(hint) is tuple:
            item = self._tuple_item(hint)
            v = self._var()
            conv = self._dec(item, v)
            return f"tuple({expr})" if conv == v else f"tuple({conv} for {v} in {expr})"
        if hint in _PRIMITIVES:
            return expr
        raise TypeError(f"unsupported field type {hint!r}")

    @staticmethod
    def _tuple_item(hint: Any) -> Any:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        raise TypeError(f"unsupported tuple {hint!r}: only tuple[T, ...]")
