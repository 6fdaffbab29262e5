"""The floor plan, checked: which of gnomon's packages may import which.

Built from the source by ``ast`` (every import: top level, inside functions, under
``TYPE_CHECKING``), so a lazy import does not hide a dependency. The rules:

- no cycle between top-level packages (or modules) of ``gnomon``;
- the core is pure: ``gnomon.core`` imports no other gnomon package;
- the API never imports the processor, the UI never imports the API (the API serves the
  UI; both stand on ``gnomon.web``), alerts and workers never import each other (both
  call out through ``gnomon.outbound``), metrics never import the processor;
- the Kafka seam (``adapters``, ``eventlog``) never imports the local-stack runner
  (``gnomon.infra``);
- only the composition roots (the CLI, the simulation, the test harness) import both the
  API and the processor.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "gnomon"

FORBIDDEN = {
    ("core", "*"): "the core is pure: time, I/O and adapters are passed in",
    ("api", "processor"): "the API waits for the processor's answer on command-results; it never imports it",
    ("ui", "api"): "the API serves the UI; both use gnomon.web",
    ("alerts", "worker"): "alerts and workers both call out through gnomon.outbound",
    ("worker", "alerts"): "alerts and workers both call out through gnomon.outbound",
    ("metrics", "processor"): "the processor registers its metrics; metrics read it through a protocol",
    ("history", "processor"): "history reads what the processor wrote, from Kafka",
    ("ui", "processor"): "the UI reads through the API",
    ("adapters", "infra"): "the Kafka seam never imports the local-stack runner",
    ("eventlog", "infra"): "the Kafka seam never imports the local-stack runner",
    ("processor", "api"): "one decider: the processor answers on a topic",
    ("processor", "worker"): "workers consume their grants from Kafka",
}
ROOTS = {"cli", "sim", "testing"}  # composition roots: they may wire anything


def _unit(module: str) -> str | None:
    """``gnomon.x.y`` -> ``x``; None for ``gnomon`` itself or another distribution."""
    parts = module.split(".")
    return parts[1] if parts[0] == "gnomon" and len(parts) > 1 else None


def _imports(path: Path) -> set[str]:
    """Every gnomon module ``path`` imports, as dotted names (``from gnomon import x``
    counts ``gnomon.x``)."""
    rel = path.relative_to(SRC.parent).with_suffix("")
    package = list(rel.parts[:-1])  # a module's package; an __init__'s own package
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            out |= {f"{module}.{a.name}" for a in node.names}  # a submodule, or a name in it
    return out


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in SRC.rglob("*.py"):
        src = _unit(".".join(path.relative_to(SRC.parent).with_suffix("").parts)) or "gnomon"
        graph[src]
        for name in _imports(path):
            dst = _unit(name)
            if dst is None or dst == src:
                continue
            if (SRC / dst).is_dir() or (SRC / f"{dst}.py").exists():
                graph[src].add(dst)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read_from_the_source() -> None:
    graph = package_graph()
    assert {"core", "api", "processor", "worker", "eventlog", "adapters", "web", "outbound", "feeds"} <= set(graph)
    assert "core" in graph["processor"] and "eventlog" in graph["processor"]
    assert "web" in graph["ui"] and "outbound" in graph["alerts"]


def test_no_cycle_between_packages() -> None:
    assert _cycles(package_graph()) == []


def test_the_cycle_finder_finds_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_forbidden_import() -> None:
    graph = package_graph()
    broken = []
    for (src, dst), why in FORBIDDEN.items():
        targets = graph.get(src, set()) if dst == "*" else graph.get(src, set()) & {dst}
        broken += [f"{src} imports {t}: {why}" for t in sorted(targets)]
    assert broken == []


def test_only_composition_roots_import_both_the_api_and_the_processor() -> None:
    both = {src for src, dsts in package_graph().items() if {"api", "processor"} <= dsts}
    assert both <= ROOTS, both - ROOTS


# Modules that build confluent-kafka clients themselves: the one Kafka seam
# (eventlog/kafka.py, every client of gnomon's processes and SDK) and infra's admin use
# (creating topics and ACLs, adding partitions, checking a broker in the local-stack
# runner, which the services never import). Everything else goes through the event-log port.
KAFKA_CLIENT_MODULES = {
    "eventlog/kafka.py",
    "infra/acls.py", "infra/grow.py", "infra/kafka.py", "infra/topics.py",
}


def test_confluent_kafka_is_imported_only_where_listed() -> None:
    users = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
             if any(n.split(".")[0] == "confluent_kafka" for n in _imports(p))}
    assert users <= KAFKA_CLIENT_MODULES, users - KAFKA_CLIENT_MODULES
    assert users == KAFKA_CLIENT_MODULES, f"moved onto the port: take {KAFKA_CLIENT_MODULES - users} off the list"
