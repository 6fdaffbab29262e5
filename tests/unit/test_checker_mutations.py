"""A checker that can be weakened without a test failing cannot be trusted: each line of
``gnomon/checker.py`` marked ``# finds: <name>`` is turned into ``pass`` in a copy of the
module, and the checker's own tests (``test_checker.py``) run against that copy; at least
one of them must fail. The unmodified module must pass them all."""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

import gnomon.checker

SOURCE = Path(gnomon.checker.__file__)
MARK = re.compile(r"^(?P<indent>\s*)(?P<stmt>\S.*?)\s*# finds: (?P<name>[a-z-]+)\s*$")


def _marked() -> list[tuple[int, str]]:
    out = []
    for no, line in enumerate(SOURCE.read_text().splitlines()):
        m = MARK.match(line)
        if m:
            out.append((no, m["name"]))
    return out


def _tests() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("gnomon_checker_tests", Path(__file__).with_name("test_checker.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _mutant(line_no: int) -> types.ModuleType:
    lines = SOURCE.read_text().splitlines()
    m = MARK.match(lines[line_no])
    assert m is not None
    lines[line_no] = f"{m['indent']}pass  # disabled: {m['name']}"
    mod = types.ModuleType("gnomon.checker_mutant")
    mod.__file__ = str(SOURCE)
    sys.modules[mod.__name__] = mod  # (dataclasses look their module up while the class is made)
    try:
        exec(compile("\n".join(lines) + "\n", f"{SOURCE} (without {m['name']})", "exec"), mod.__dict__)
    finally:
        del sys.modules[mod.__name__]
    return mod


def _failures(tests: types.ModuleType, checker: types.ModuleType) -> list[str]:
    tests.C = checker
    failed = []
    for name in dir(tests):
        fn: Callable[[], None] = getattr(tests, name)
        if name.startswith("test_") and callable(fn):
            try:
                fn()
            except AssertionError:
                failed.append(name)
    return failed


MARKED = _marked()


def test_every_finding_branch_is_marked() -> None:
    """The branches the checker's docstring lists, each marked once."""
    names = [name for _, name in MARKED]
    assert len(names) == len(set(names)), names
    assert len(names) >= 18, names


def test_the_checker_passes_its_own_tests() -> None:
    assert _failures(_tests(), gnomon.checker) == []


@pytest.mark.parametrize(("line_no", "name"), MARKED, ids=[name for _, name in MARKED])
def test_disabling_a_branch_fails_a_checker_test(line_no: int, name: str) -> None:
    failed = _failures(_tests(), _mutant(line_no))
    assert failed, f"with '{name}' disabled (line {line_no + 1}) every checker test still passes"
