"""docs/job-events.md names the schema ids and versions that schemas/avro/registry.json
holds today (issue 21): a producer written from the page alone must not be sent to an
older version.

The page's table of ids sits between two marker comments and is generated from
registry.json (``python tests/unit/test_job_events_doc.py --write`` rewrites it). Every
other mention of a schema in the page is checked too, against the subject it is about
(the nearest subject, topic, record or schema file named before it in the same paragraph
or table row, else the nearest after it):

* ``X.vN.avsc``: the file of the latest version of a subject;
* ``id N`` / ``ids N, M``, ``version N``, ``vN``: that subject's latest id / version;
* ``older ... (ids A, B, C)``: exactly the subject's earlier ids, all of them.

A number that cannot be tied to a subject fails the check: reword the paragraph so it
names one.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "job-events.md"
REGISTRY = ROOT / "schemas" / "avro" / "registry.json"

BEGIN = ("<!-- schema-ids: generated from schemas/avro/registry.json by "
         "`python tests/unit/test_job_events_doc.py --write`; tests/unit/test_job_events_doc.py checks it -->")
END = "<!-- schema-ids: end -->"
# the subjects a producer of job commands meets, in the table's order
TABLE_SUBJECTS = ("gnomon.job-commands-value", "gnomon.JobSpec", "gnomon.command-results-value",
                  "gnomon.poison-value")


@dataclass(frozen=True)
class Version:
    id: int
    subject: str
    version: int
    file: str
    references: tuple[tuple[str, int], ...]


def load_versions(text: str) -> dict[str, list[Version]]:
    """registry.json's versions by subject, oldest first."""
    by_subject: dict[str, list[Version]] = {}
    for sid, v in json.loads(text)["schemas"].items():
        refs = tuple((r["subject"], int(r["version"])) for r in v.get("references", []))
        by_subject.setdefault(v["subject"], []).append(Version(int(sid), v["subject"], int(v["version"]), v["file"],
                                                               refs))
    return {s: sorted(vs, key=lambda v: v.version) for s, vs in by_subject.items()}


def render_table(versions: dict[str, list[Version]]) -> str:
    """The block between the markers (markers included)."""
    rows = [BEGIN,
            "| subject | latest version | its id | its file | references | older versions, still read (ids) |",
            "|---|---|---|---|---|---|"]
    for subject in TABLE_SUBJECTS:
        *older, latest = versions[subject]
        refs = ", ".join(f"`{s}` version {n}" for s, n in latest.references) or "none"
        olds = ", ".join(str(v.id) for v in older) or "none"
        rows.append(f"| `{subject}` | {latest.version} | {latest.id} | `schemas/avro/{latest.file}` | {refs} | "
                    f"{olds} |")
    rows.append(END)
    return "\n".join(rows)


def split_doc(doc: str) -> tuple[str | None, str]:
    """(the generated block or None, the rest of the page with the block taken out)."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        return None, doc
    return doc[start:end + len(END)], doc[:start] + doc[end + len(END):]


# ---- mentions outside the table -------------------------------------------------------

# a schema file, also without its extension ("JobCommand.v7")
_FILE = re.compile(r"\b([A-Z][A-Za-z]*)\.v(\d+)(?:\.avsc)?\b")
_OLDER = re.compile(r"\bolder\b(?:[^.()]|\.(?=\S))*\(\s*ids?\s+(\d+(?:\s*(?:,|and|or)\s*\d+)*)\s*\)", re.I)
# "id 71", "ids 2, 23 and 26", "version 7", "v7" (not a URL's "/v1/")
_NUMBER = re.compile(r"(?<![\w/.-])(ids?[\s:=]+|versions?[\s:=]+|v)(\d+(?:\s*(?:,|and|or)\s*\d+)*)\b", re.I)
_NUMBERS = re.compile(r"\d+")
_SIGNATURE = re.compile(r"`v1:<key id>:<[a-z ]+>`")  # the gnomon-sig header's format (core.command_auth)


def _subject_names(versions: dict[str, list[Version]]) -> dict[str, set[str]]:
    """Words that name a subject: the subject itself, its topic (without ``-value``) and
    the record name of its files (``gnomon.JobCommand``)."""
    names: dict[str, set[str]] = {}
    for subject, vs in versions.items():
        names.setdefault(subject, set()).add(subject)
        if subject.endswith("-value"):
            names.setdefault(subject.removesuffix("-value"), set()).add(subject)
        for v in vs:
            names.setdefault("gnomon." + v.file.split(".")[0], set()).add(subject)
    return names


def units(text: str) -> list[str]:
    """Paragraphs, list items and table rows: the scope in which a number is tied to a subject."""
    out: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.splitlines()
        if any(line.lstrip().startswith("|") for line in lines):
            out.extend(lines)
            continue
        item: list[str] = []
        for line in lines:
            if re.match(r"\s*(?:[-*]|\d+\.)\s", line) and item:
                out.append(" ".join(item))
                item = []
            item.append(line)
        if item:
            out.append(" ".join(item))
    return out


def problems(doc: str, registry_text: str) -> list[str]:
    """Every way ``doc`` disagrees with ``registry_text`` (registry.json); [] if none."""
    versions = load_versions(registry_text)
    found: list[str] = []
    block, rest = split_doc(doc)
    want = render_table(versions)
    if block is None:
        found.append(f"no table of schema ids between the markers; it should read:\n{want}")
    elif block != want:
        found.append(f"the table of schema ids is not registry.json's; it should read:\n{want}")
    latest_file = {vs[-1].file: s for s, vs in versions.items()}
    names = _subject_names(versions)
    name_re = re.compile(r"(?<![\w.-])(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
                         + r")(?![\w-])")
    by_stem: dict[str, set[str]] = {}
    for s, vs in versions.items():
        for v in vs:
            by_stem.setdefault(v.file.split(".")[0], set()).add(s)

    for unit in units(rest):
        # where each subject is named in this unit: (position, subjects)
        marks: list[tuple[int, set[str]]] = [(m.start(), names[m.group(1)]) for m in name_re.finditer(unit)]
        for m in _FILE.finditer(unit):
            f = f"{m.group(1)}.v{m.group(2)}.avsc"
            marks.append((m.start(), by_stem.get(m.group(1), set())))
            if f not in latest_file:
                known = sorted(vs[-1].file for s, vs in versions.items() if m.group(1) in vs[-1].file)
                found.append(f"{f} is not the latest version of any subject (latest: {', '.join(known) or '-'}): "
                             f"{unit.strip()[:160]!r}")
        marks.sort(key=lambda x: x[0])
        scrubbed = _FILE.sub(lambda m: " " * len(m.group(0)), unit)  # vN inside a file name is checked above
        scrubbed = _SIGNATURE.sub(lambda m: " " * len(m.group(0)), scrubbed)  # the signature's format, not a schema

        def subjects_at(pos: int, unit: str = unit, marks: list[tuple[int, set[str]]] = marks) -> set[str]:
            before = [s for p, s in marks if p < pos and s]
            after = [s for p, s in marks if p > pos and s]
            return before[-1] if before else (after[0] if after else set())

        spans: list[tuple[int, int]] = []
        for m in _OLDER.finditer(scrubbed):
            spans.append(m.span())
            ids = [int(n) for n in _NUMBERS.findall(m.group(1))]
            subjects = subjects_at(m.start())
            if not subjects:
                found.append(f"older ids {ids} name no subject: {unit.strip()[:160]!r}")
                continue
            if not any(ids == [v.id for v in versions[s][:-1]] for s in subjects):
                want_ids = {s: [v.id for v in versions[s][:-1]] for s in sorted(subjects)}
                found.append(f"older ids {ids}, registry.json: {want_ids}: {unit.strip()[:160]!r}")
        for m in _NUMBER.finditer(scrubbed):
            if any(a <= m.start() < b for a, b in spans):
                continue
            kind = re.sub(r"[\s:=]", "", m.group(1)).lower()
            nums = [int(n) for n in _NUMBERS.findall(m.group(2))]
            subjects = subjects_at(m.start())
            if not subjects:
                found.append(f"{m.group(0)!r} names no subject (name one in the same paragraph or row): "
                             f"{unit.strip()[:160]!r}")
                continue
            if kind.startswith("id"):
                ok = all(any(n == versions[s][-1].id for s in subjects) for n in nums)
                want_s = {s: versions[s][-1].id for s in sorted(subjects)}
            else:
                ok = all(any(n == versions[s][-1].version for s in subjects) for n in nums)
                want_s = {s: versions[s][-1].version for s in sorted(subjects)}
            if not ok:
                found.append(f"{m.group(0)!r}, registry.json's latest: {want_s}: {unit.strip()[:160]!r}")
    return found


# ---- the tests --------------------------------------------------------------------------


def test_the_page_names_only_the_latest_ids_and_versions_of_registry_json() -> None:
    found = problems(DOC.read_text(), REGISTRY.read_text())
    assert not found, "docs/job-events.md disagrees with schemas/avro/registry.json:\n" + "\n".join(found)


def test_the_table_names_the_commands_subject_latest() -> None:
    versions = load_versions(REGISTRY.read_text())
    block, _ = split_doc(DOC.read_text())
    assert block is not None
    latest = versions["gnomon.job-commands-value"][-1]
    assert f"| `gnomon.job-commands-value` | {latest.version} | {latest.id} | `schemas/avro/{latest.file}` |" in block


# The check itself, on small pages: it must catch what issue 21 found (JobCommand v6, id 47,
# while the registry serves v7, id 71) and not flag what is right.
_MINI = {"schemas": {
    "1": {"subject": "gnomon.JobSpec", "version": 1, "file": "JobSpec.v1.avsc", "references": []},
    "2": {"subject": "gnomon.job-commands-value", "version": 1, "file": "JobCommand.v1.avsc",
          "references": [{"name": "gnomon.JobSpec", "subject": "gnomon.JobSpec", "version": 1}]},
    "3": {"subject": "gnomon.JobSpec", "version": 2, "file": "JobSpec.v2.avsc", "references": []},
    "4": {"subject": "gnomon.job-commands-value", "version": 2, "file": "JobCommand.v2.avsc",
          "references": [{"name": "gnomon.JobSpec", "subject": "gnomon.JobSpec", "version": 2}]},
    "5": {"subject": "gnomon.command-results-value", "version": 1, "file": "CommandResult.v1.avsc",
          "references": []},
    "6": {"subject": "gnomon.poison-value", "version": 1, "file": "PoisonRecord.v1.avsc", "references": []},
}}
_MINI_TEXT = json.dumps(_MINI)


def _page(body: str) -> str:
    return "# t\n\n" + render_table(load_versions(_MINI_TEXT)) + "\n\n" + body + "\n"


def test_the_check_accepts_the_latest_everywhere() -> None:
    body = ("The value is a `gnomon.JobCommand` record (`schemas/avro/JobCommand.v2.avsc`, id 4, subject "
            "`gnomon.job-commands-value` version 2). Older schema versions of `gnomon.job-commands-value` "
            "(ids 2) are still read.\n\n| topic | `gnomon.command-results`, id 5 |\n\n"
            '```json\n{"job_version": 1, "expected_version": 3}\n```')
    assert problems(_page(body), _MINI_TEXT) == []


def test_the_check_finds_an_older_id_version_or_file() -> None:
    stale = {
        "`schemas/avro/JobCommand.v1.avsc`": "JobCommand.v1.avsc is not the latest",
        "`gnomon.job-commands-value`, id 2": "'id 2'",
        "`gnomon.job-commands-value` version 1": "'version 1'",
        "the `gnomon.JobCommand` v1 schema": "'v1'",
        "`gnomon.command-results` (id 4)": "'id 4'",
        "Older versions of `gnomon.job-commands-value` (ids 1, 2) are read": "older ids [1, 2]",
        "Older versions (ids 2) are read": "older ids [2] name no subject",
        "The schema has id 4.": "'id 4' names no subject",
        "`gnomon.JobCommand.v1` is the one": "JobCommand.v1.avsc is not the latest",
        "`gnomon.job-commands-value` (id=2)": "'id=2'",
        "`gnomon.job-commands-value`, version: 1": "'version: 1'",
    }
    for body, expect in stale.items():
        found = problems(_page(body), _MINI_TEXT)
        assert any(expect in p for p in found), (body, found)


def test_the_check_finds_a_missing_or_edited_table() -> None:
    assert any("no table" in p for p in problems("# t\n\nnothing\n", _MINI_TEXT))
    edited = _page("").replace("| 2 | 4 |", "| 1 | 2 |")
    assert any("not registry.json's" in p for p in problems(edited, _MINI_TEXT))


def test_a_new_version_in_registry_json_makes_the_page_stale() -> None:
    registry = json.loads(REGISTRY.read_text())
    latest = load_versions(REGISTRY.read_text())["gnomon.job-commands-value"][-1]
    new_id = max(int(i) for i in registry["schemas"]) + 1
    registry["schemas"][str(new_id)] = {"subject": "gnomon.job-commands-value", "version": latest.version + 1,
                                        "file": f"JobCommand.v{latest.version + 1}.avsc", "references": []}
    found = problems(DOC.read_text(), json.dumps(registry))
    assert any("not registry.json's" in p and f"| {new_id} |" in p for p in found), found


def write() -> None:
    """Rewrite the page's table from registry.json (between the markers, or appended)."""
    doc = DOC.read_text()
    table = render_table(load_versions(REGISTRY.read_text()))
    block, _ = split_doc(doc)
    DOC.write_text(doc.replace(block, table) if block is not None else doc.rstrip("\n") + "\n\n" + table + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/unit/test_job_events_doc.py --write")
    write()
