"""Topic names are written in one place, ``streams/topology.toml``: no string literal in
src/ or bench/ spells one (code takes names from ``gnomon.topology.Topology``).

The names are read from the TOML itself: every ``[topics."<name>"]``. A literal counts
when a name appears in it as a whole (``"gnomon.runs"``, ``"gnomon.runs-value"``), not
inside a longer word. (Retired topics, gone from the TOML, may be named: the codec keeps
their subjects.) Not counted: comments, docstrings, and the name given to
``logging.getLogger`` (a logger may be called like a topic: ``gnomon.tenants``).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from gnomon.config import REPO_ROOT

TOPOLOGY = REPO_ROOT / "streams" / "topology.toml"
SCANNED = ("src", "bench")

# Files allowed to keep topic literals for now, each for a reason outside this change.
# Remove an entry once its file takes names from the Topology.
PENDING: dict[str, str] = {}  # files not yet moved to the topology (none left)


def topic_names(path: Path = TOPOLOGY) -> set[str]:
    data = tomllib.loads(path.read_text())
    return {n for n in data["topics"] if n}


def _pattern(names: set[str]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?<![\w.-])(?:{alternatives})(?!\w)")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _logger_names(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name == "getLogger":
                out.add(id(node.args[0]))
    return out


def literals_with_topic_names(source: str, names: set[str], filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, literal) of every string literal of ``source`` that spells one of ``names``."""
    tree = ast.parse(source, filename)
    skip = _docstrings(tree) | _logger_names(tree)
    pattern = _pattern(names)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                and pattern.search(node.value)):
            found.append((node.lineno, node.value))
    return sorted(found)


def test_the_topology_declares_the_names_scanned_for() -> None:
    names = topic_names()
    assert {"gnomon.runs", "gnomon.job-commands", "gnomon.worker-inbox"} <= names
    assert not any(n.startswith("gnomon.dispatch") for n in names)


def test_the_scanner_finds_literals_and_skips_docs_and_logger_names() -> None:
    names = {"gnomon.runs", "gnomon.run-logs", "gnomon.dispatch.", "gnomon.dispatch"}
    source = '''
"""Module doc: reads gnomon.runs."""
import logging
log = logging.getLogger("gnomon.runs")  # a logger called like a topic
def f(codec, x):
    """Writes gnomon.run-logs."""
    codec.encode(x, "gnomon.runs")  # a topic name: found
    subject = "gnomon.run-logs-value"  # a subject spelled out: found
    fmt = f"gnomon.dispatch.{x}.low"  # found
    other = ("gnomon.runsx", "gnomon.core.runs", "xgnomon.runs", "gnomon.RunState")
    return "text about gnomon.runs"  # found: a literal, not a docstring
'''
    found = literals_with_topic_names(source, names)
    assert [line for line, _ in found] == [7, 8, 9, 11], found


def test_no_topic_name_outside_the_topology_file() -> None:
    names = topic_names()
    offenders = []
    for top in SCANNED:
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            rel = path.relative_to(REPO_ROOT).as_posix()
            if rel in PENDING or "/." in rel or ".egg-info" in rel:
                continue
            offenders += [f"{rel}:{line}: {text!r}" for line, text in
                          literals_with_topic_names(path.read_text(), names, rel)]
    assert not offenders, (
        "topic names belong in streams/topology.toml only; take them from gnomon.topology "
        "(load_topology().runs, ..., the codec subject as f'{topic}-value'):\n" + "\n".join(offenders)
    )


def test_pending_entries_are_real_files() -> None:
    for rel in PENDING:
        assert (REPO_ROOT / rel).is_file(), f"PENDING names {rel}, which does not exist: remove the entry"
