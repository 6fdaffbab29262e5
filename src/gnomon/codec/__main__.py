"""Maintain schemas/avro/registry.json (see schemas/README.md).

    python -m gnomon.codec check
    python -m gnomon.codec register SUBJECT FILE [--ref SUBJECT:VERSION ...] [--id N]

``register`` appends FILE (a new file in the schema directory) as the next version of
SUBJECT under the next free id, after checking that every earlier version of SUBJECT
can be read with it. Without ``--ref`` it keeps the references of the previous version.
``--id N`` takes that id instead (a free one, larger than every id this version refers
to): a block of ids reserved for one change, so parallel changes do not collide.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gnomon.codec.compat import incompatibilities
from gnomon.codec.registry import (
    Reference,
    Registry,
    RegistryError,
    build_schema,
    default_schema_dir,
    file_sha256,
    load_registry,
)


def check(registry: Registry) -> list[str]:
    """Every problem with the registry: edited files, incompatible versions."""
    problems: list[str] = []
    for v in registry:
        actual = file_sha256(registry.directory / v.file)
        if actual != v.sha256:
            problems.append(
                f"id {v.id} ({v.subject} v{v.version}): {v.file} changed since it was registered "
                f"(sha256 {actual[:12]}..., registered {v.sha256[:12]}...). Registered files are "
                "immutable: restore it and register a new versioned file instead."
            )
    for subject in registry.subjects():
        latest = registry.latest(subject)
        for old in registry.versions(subject)[:-1]:
            problems.extend(
                f"{subject}: v{old.version} (id {old.id}) not readable by v{latest.version}: {p}"
                for p in incompatibilities(old.schema, latest.schema)
            )
    return problems


def register(directory: Path, subject: str, file: str, refs: list[str] | None,
             schema_id: int | None = None) -> dict[str, Any]:
    path = directory / "registry.json"
    doc = json.loads(path.read_text())
    registry = load_registry(directory)
    if any(v.file == file and v.subject == subject for v in registry):
        raise RegistryError(f"{file} is already registered for {subject}")
    previous = registry.versions(subject)[-1] if subject in registry.subjects() else None
    if refs is None:
        references = previous.references if previous else ()
    else:
        references = tuple(
            Reference(s, s, int(ver)) for s, _, ver in (r.rpartition(":") for r in refs)
        )
    raw = json.loads((directory / file).read_text())
    schema = build_schema(raw, references, registry)
    for old in registry.versions(subject) if previous else []:
        problems = incompatibilities(old.schema, schema)
        if problems:
            raise RegistryError(f"{file} cannot read {subject} v{old.version}: " + "; ".join(problems))
    new_id = max((v.id for v in registry), default=0) + 1 if schema_id is None else schema_id
    if new_id < 1 or str(new_id) in doc["schemas"]:
        raise RegistryError(f"schema id {new_id} is taken or not positive")
    entry = {
        "subject": subject,
        "version": previous.version + 1 if previous else 1,
        "file": file,
        "sha256": file_sha256(directory / file),
        "references": [{"name": r.name, "subject": r.subject, "version": r.version} for r in references],
    }
    doc["schemas"][str(new_id)] = entry
    path.write_text(json.dumps(doc, indent=2) + "\n")
    load_registry(directory)  # the result must load
    return {"id": new_id, **entry}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gnomon.codec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None, help="schema directory (default: schemas/avro)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="verify sha256 pins and backward compatibility")
    reg = sub.add_parser("register", help="register FILE as the next version of SUBJECT")
    reg.add_argument("subject")
    reg.add_argument("file", help="file name inside the schema directory")
    reg.add_argument("--ref", action="append", metavar="SUBJECT:VERSION",
                     help="a referenced subject version (repeatable); default: the previous version's")
    reg.add_argument("--id", type=int, default=None, dest="schema_id",
                     help="register under this free id (default: the next after the largest)")
    args = parser.parse_args(argv)
    directory = args.dir or default_schema_dir()
    try:
        if args.cmd == "check":
            problems = check(load_registry(directory))
            for p in problems:
                print(p, file=sys.stderr)
            return 1 if problems else 0
        print(json.dumps(register(directory, args.subject, args.file, args.ref, args.schema_id), indent=2))
        return 0
    except (RegistryError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
