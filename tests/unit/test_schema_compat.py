"""The schema registry (schemas/avro/registry.json) stays append-only and backward compatible.

* a registered .avsc file is never edited in place (its sha256 is pinned);
* for every subject, every registered version can be read with the latest one, checked
  statically (gnomon.codec.compat, the Avro resolution rules) and with data (samples
  written with the old schema, read with the latest by fastavro, decoded by the codec);
* the check itself is proven on schemas built here: a new version that adds a field
  without a default (or drops an enum symbol) is rejected, one that adds an optional
  field is accepted and old records decode through it.

The procedure for changing a schema is in schemas/README.md.
"""

from __future__ import annotations

import copy
import io
import json
import shutil
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.read import SchemaResolutionError
from fastavro.utils import generate_many

from gnomon.codec import Codec, DecodeError, default_codec, encode
from gnomon.codec.__main__ import check, main, register
from gnomon.codec.compat import incompatibilities
from gnomon.codec.registry import (
    Reference,
    Registry,
    RegistryError,
    SchemaVersion,
    build_schema,
    file_sha256,
    load_registry,
)
from gnomon.core.errors import ValidationError
from gnomon.core.messages import LogLine, LogStream
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.runs import RunState, RunStatus

REGISTRY: Registry = default_codec.registry
SCHEMA_DIR: Path = REGISTRY.directory
SAMPLES = 40

OLD_VERSIONS = [
    pytest.param(v, id=f"{v.subject}-v{v.version}") for s in REGISTRY.subjects() for v in REGISTRY.versions(s)
]


def _write(schema: Any, record: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


def _read(data: bytes, writer: Any, reader: Any) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(data), writer, reader, return_record_name=True)


def _readable_with_data(writer: Any, reader: Any, n: int = SAMPLES) -> None:
    """Samples generated from ``writer`` must resolve against ``reader``. The reader is
    re-parsed so fastavro cannot skip resolution when the two are equal."""
    reader = fastavro.parse_schema(json.loads(json.dumps({k: v for k, v in reader.items() if k[:2] != "__"})))
    for record in generate_many(writer, n):
        _read(_write(writer, record), writer, reader)


# ---- the registry is append-only -------------------------------------------------------


@pytest.mark.parametrize("version", OLD_VERSIONS)
def test_registered_file_is_unchanged(version: SchemaVersion) -> None:
    actual = file_sha256(SCHEMA_DIR / version.file)
    assert actual == version.sha256, (
        f"{version.file} (schema id {version.id}, {version.subject} v{version.version}) was edited "
        "after it was registered. Registered files are immutable: restore it (git checkout) and "
        "put the change in a new versioned file, see schemas/README.md."
    )


def test_registry_is_well_formed() -> None:
    doc = json.loads((SCHEMA_DIR / "registry.json").read_text())
    ids = [int(k) for k in doc["schemas"]]
    assert ids == sorted(ids) and all(i > 0 for i in ids), "ids are positive and listed in order"
    for subject in REGISTRY.subjects():
        versions = [v.version for v in REGISTRY.versions(subject)]
        assert versions == list(range(1, len(versions) + 1)), f"{subject}: versions {versions}"
        ids_in_order = [v.id for v in REGISTRY.versions(subject)]
        assert ids_in_order == sorted(ids_in_order), f"{subject}: a later version has a smaller id"
    for v in REGISTRY:
        assert len(v.sha256) == 64, f"schema id {v.id} has no sha256"
        for ref in v.references:
            assert REGISTRY.lookup(ref.subject, ref.version).id < v.id
    registered = {v.file for v in REGISTRY}
    on_disk = {p.name for p in SCHEMA_DIR.glob("*.avsc")}
    assert on_disk == registered, f"unregistered: {on_disk - registered}; missing: {registered - on_disk}"


def test_cli_check_passes_on_the_checked_in_registry() -> None:
    assert check(REGISTRY) == []
    assert main(["check"]) == 0


# ---- every historical version is readable by the latest --------------------------------


@pytest.mark.parametrize("version", OLD_VERSIONS)
def test_version_is_readable_by_latest(version: SchemaVersion) -> None:
    latest = REGISTRY.latest(version.subject)
    assert incompatibilities(version.schema, latest.schema) == []
    _readable_with_data(version.schema, latest.schema)
    # ... and the codec turns such a record into its dataclass.
    header = b"\x00" + version.id.to_bytes(4, "big")
    for record in generate_many(version.schema, 10):
        try:
            obj = default_codec.decode(header + _write(version.schema, record))
        except DecodeError as exc:
            # a dataclass that validates itself (TenantLimits' bounds) refuses random values,
            # naming the field: the schema was read, the value was not acceptable
            assert isinstance(exc.__cause__, ValidationError), exc
            continue
        assert type(obj).__module__.startswith("gnomon.core.")


# ---- the check works: schemas built here -----------------------------------------------


def _raw(file: str) -> Any:
    return json.loads((SCHEMA_DIR / file).read_text())


JOBSPEC_V1 = Reference("gnomon.JobSpec", "gnomon.JobSpec", REGISTRY.latest("gnomon.JobSpec").version)  # the latest JobSpec


def _parse(raw: Any, *refs: Reference) -> Any:
    """The self-contained parsed schema of ``raw``, as the registry would build it."""
    return build_schema(raw, refs, REGISTRY)


def _with_field(raw: Any, field: dict[str, Any]) -> Any:
    out = copy.deepcopy(raw)
    out["fields"].append(field)
    return out


RUN_V1 = REGISTRY.latest("gnomon.runs-value")  # the latest RunState version, the base of a "next" one


def test_new_required_field_is_incompatible() -> None:
    v2 = _parse(_with_field(_raw(RUN_V1.file), {"name": "shard", "type": "long"}), JOBSPEC_V1)
    problems = incompatibilities(RUN_V1.schema, v2)
    assert len(problems) == 1 and "shard" in problems[0] and "default" in problems[0]
    with pytest.raises(SchemaResolutionError):
        _readable_with_data(RUN_V1.schema, v2)


def test_new_optional_field_with_default_is_compatible() -> None:
    field = {"name": "note", "type": ["null", "string"], "default": None}
    v2 = _parse(_with_field(_raw(RUN_V1.file), field), JOBSPEC_V1)
    assert incompatibilities(RUN_V1.schema, v2) == []
    _readable_with_data(RUN_V1.schema, v2)


def test_removed_enum_symbol_and_changed_type_are_incompatible() -> None:
    raw = _raw(RUN_V1.file)
    status = next(f for f in raw["fields"] if f["name"] == "status")
    status["type"]["symbols"].remove("skipped")
    attempt = next(f for f in raw["fields"] if f["name"] == "attempt")
    attempt.update(type="string", default="0")
    problems = incompatibilities(RUN_V1.schema, _parse(raw, JOBSPEC_V1))
    assert any("skipped" in p for p in problems)
    assert any("attempt" in p for p in problems)


def test_removed_union_branch_is_incompatible() -> None:
    commands = REGISTRY.latest("gnomon.job-commands-value")
    raw = _raw(commands.file)
    raw["fields"][0]["type"] = [b for b in raw["fields"][0]["type"] if b["name"] != "TriggerJob"]
    problems = incompatibilities(commands.schema, _parse(raw, JOBSPEC_V1))
    assert any("TriggerJob" in p for p in problems)


def test_promotions_are_compatible() -> None:
    writer = fastavro.parse_schema({"type": "record", "name": "X", "fields": [{"name": "a", "type": "int"}]})
    reader = fastavro.parse_schema({"type": "record", "name": "X", "fields": [{"name": "a", "type": "double"}]})
    assert incompatibilities(writer, reader) == []
    assert incompatibilities(reader, writer) != []


# ---- the procedure end to end, on a copy of the registry -------------------------------


@pytest.fixture
def registry_copy(tmp_path: Path) -> Path:
    directory = tmp_path / "avro"
    shutil.copytree(SCHEMA_DIR, directory)
    return directory


def _add_field_file(directory: Path, source: str, target: str, field: dict[str, Any]) -> None:
    raw = json.loads((directory / source).read_text())
    (directory / target).write_text(json.dumps(_with_field(raw, field), indent=2) + "\n")


def test_procedure_new_version_and_old_records(registry_copy: Path) -> None:
    line = LogLine("r", "j", "t", 1, 7, LogStream.SYSTEM, "started", 5)
    old_bytes = encode(line)  # written with LogLine v1 by today's codec
    _add_field_file(registry_copy, "LogLine.v1.avsc", "LogLine.v2.avsc",
                    {"name": "host", "type": ["null", "string"], "default": None})
    entry = register(registry_copy, "gnomon.run-logs-value", "LogLine.v2.avsc", None)
    assert entry["version"] == 2 and entry["id"] == max(REGISTRY.by_id) + 1

    codec = Codec(load_registry(registry_copy))
    assert codec.schema_id_for_topic("gnomon.run-logs") == entry["id"]
    assert codec.decode(old_bytes) == line  # v1 record, resolved to the v2 reader schema
    new_bytes = codec.encode(line)
    assert new_bytes[1:5] == entry["id"].to_bytes(4, "big")
    assert codec.decode(new_bytes) == line
    assert check(load_registry(registry_copy)) == []
    with pytest.raises(DecodeError, match="unknown schema id"):
        default_codec.decode(new_bytes)  # an old deployment does not know the new id


def test_procedure_shared_type_new_version(registry_copy: Path) -> None:
    """JobSpec changes: a new JobSpec version, then a new version of each subject that
    references it (here RunState), pointing at the new JobSpec."""
    spec = JobSpec("n", Schedule(cron="* * * * *"), Target(TargetType.HANDLER, handler="h"))
    run = RunState("r", "j", "t", spec, 1, 2, True, RunStatus.SCHEDULED, 3, 4)
    old_bytes = encode(run)
    spec_now = REGISTRY.latest("gnomon.JobSpec")
    spec_next = spec_now.version + 1
    _add_field_file(registry_copy, spec_now.file, f"JobSpec.v{spec_next}.avsc",
                    {"name": "labels", "type": {"type": "map", "values": "string"}, "default": {}})
    register(registry_copy, "gnomon.JobSpec", f"JobSpec.v{spec_next}.avsc", None)
    latest = REGISTRY.latest("gnomon.runs-value")
    target = f"RunState.v{latest.version + 1}.avsc"
    shutil.copy(registry_copy / latest.file, registry_copy / target)
    entry = register(registry_copy, "gnomon.runs-value", target, [f"gnomon.JobSpec:{spec_next}"])
    assert entry["references"] == [{"name": "gnomon.JobSpec", "subject": "gnomon.JobSpec", "version": spec_next}]

    registry = load_registry(registry_copy)
    labels = next(f for f in registry.latest("gnomon.runs-value").schema["fields"] if f["name"] == "spec")
    assert "labels" in [f["name"] for f in labels["type"]["fields"]]
    codec = Codec(registry)
    assert codec.decode(old_bytes) == run
    assert codec.decode(codec.encode(run)) == run


def test_procedure_refuses_an_incompatible_version(registry_copy: Path) -> None:
    _add_field_file(registry_copy, "LogLine.v1.avsc", "LogLine.v2.avsc", {"name": "host", "type": "string"})
    before = (registry_copy / "registry.json").read_text()
    with pytest.raises(RegistryError, match="host"):
        register(registry_copy, "gnomon.run-logs-value", "LogLine.v2.avsc", None)
    assert (registry_copy / "registry.json").read_text() == before


def test_editing_a_registered_file_is_detected(registry_copy: Path) -> None:
    raw = json.loads((registry_copy / "LogLine.v1.avsc").read_text())
    raw["fields"].append({"name": "host", "type": "string"})  # the mistake: edit in place
    (registry_copy / "LogLine.v1.avsc").write_text(json.dumps(raw))
    problems = check(load_registry(registry_copy))
    assert len(problems) == 1 and "LogLine.v1.avsc changed" in problems[0]
    assert main(["--dir", str(registry_copy), "check"]) == 1


# ---- RunState v2 / RunCommand v2 (replay of dead letters) -------------------------------


def _v1_bytes(subject: str, record: Any) -> bytes:
    v1 = REGISTRY.lookup(subject, 1)
    return b"\x00" + v1.id.to_bytes(4, "big") + _write(v1.schema, record)


def test_run_state_v1_records_decode_with_the_new_defaults() -> None:
    spec = JobSpec("n", Schedule(run_at_ms=5), Target(TargetType.COMMAND, argv=("false",)))
    run = RunState("j@x", "j", "t", spec, 1, 2, False, RunStatus.FAILED, 3, 4, attempt=3, token=3,
                   finished_at_ms=9, error="exit 1", reason="failed")
    v1 = REGISTRY.lookup("gnomon.runs-value", 1)
    record = {f["name"]: getattr(run, f["name"]) for f in v1.schema["fields"]}
    record["spec"] = fastavro.schemaless_reader(  # the spec as the v1 writer sees it
        io.BytesIO(encode(run)[5:]), REGISTRY.latest("gnomon.runs-value").schema)["spec"]
    for subject in ("gnomon.runs-value", "gnomon.dead-letters-value"):
        decoded = default_codec.decode(_v1_bytes(subject, record))
        assert decoded == run
        assert (decoded.replays, decoded.attempts_before_replay) == (0, 0)
    assert REGISTRY.latest("gnomon.runs-value").file == REGISTRY.latest("gnomon.dead-letters-value").file


def test_run_command_v1_records_decode_and_new_branches_are_appended() -> None:
    from gnomon.core.runs import CancelRun, ReplayRun

    cancel = CancelRun("j@x", "", 7, "because")  # before v5: no tenant (refused by the processor)
    data = _v1_bytes("gnomon.run-events-value",
                     {"body": ("gnomon.CancelRun", {"run_id": "j@x", "at_ms": 7, "reason": "because"})})
    assert default_codec.decode(data) == cancel
    branches = REGISTRY.latest("gnomon.run-events-value").schema["fields"][0]["type"]
    v1_branches = REGISTRY.lookup("gnomon.run-events-value", 1).schema["fields"][0]["type"]
    names = [b["name"] if isinstance(b, dict) else b for b in branches]
    assert names[-3:] == ["gnomon.ReplayRun", "gnomon.AttemptStarted", "gnomon.ReturnGrant"]  # v2, v3 appended
    assert names[: len(v1_branches)] == [b["name"] if isinstance(b, dict) else b for b in v1_branches]
    replay = ReplayRun("j@x", "t", 8)
    out = encode(replay, "gnomon.run-events")
    assert int.from_bytes(out[1:5], "big") == REGISTRY.latest("gnomon.run-events-value").id
    assert default_codec.decode(out, topic="gnomon.run-events") == replay


# ---- RunCommand v5 (tenant on cancel / replay), JobCommand v2 (PatchJob) -----------------


def _bytes_of(subject: str, version: int, record: Any) -> bytes:
    v = REGISTRY.lookup(subject, version)
    return b"\x00" + v.id.to_bytes(4, "big") + _write(v.schema, record)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_cancel_and_replay_written_before_v5_decode_with_an_empty_tenant(version: int) -> None:
    from gnomon.core.runs import CancelRun, ReplayRun

    subject = "gnomon.run-events-value"
    assert REGISTRY.latest(subject).version >= 5
    cancel = _bytes_of(subject, version, {"body": ("gnomon.CancelRun", {"run_id": "j@x", "at_ms": 7, "reason": "r"})})
    assert default_codec.decode(cancel) == CancelRun("j@x", "", 7, "r")
    if version >= 2:  # ReplayRun came with v2
        replay = _bytes_of(subject, version, {"body": ("gnomon.ReplayRun", {"run_id": "j@x", "at_ms": 8,
                                                                           "requested_by": "ops"})})
        assert default_codec.decode(replay) == ReplayRun("j@x", "", 8, "ops")


def test_cancel_and_replay_carry_their_tenant_from_v5() -> None:
    from gnomon.core.runs import CancelRun, ReplayRun

    for cmd in (CancelRun("j@x", "acme", 7), ReplayRun("j@x", "acme", 8, "ops")):
        data = encode(cmd, "gnomon.run-events")
        assert int.from_bytes(data[1:5], "big") == REGISTRY.latest("gnomon.run-events-value").id
        assert default_codec.decode(data, topic="gnomon.run-events") == cmd
    fields = {b["name"]: [f["name"] for f in b["fields"]]
              for b in REGISTRY.latest("gnomon.run-events-value").schema["fields"][0]["type"] if isinstance(b, dict)}
    assert fields["gnomon.CancelRun"] == ["run_id", "tenant", "at_ms", "reason"]
    assert fields["gnomon.ReplayRun"] == ["run_id", "tenant", "at_ms", "requested_by"]


def test_job_command_v1_update_still_decodes_and_patch_job_is_appended() -> None:
    from gnomon.core.jobs import PatchJob, UpdateJob

    spec = JobSpec("n", Schedule(cron="* * * * *"), Target(TargetType.HANDLER, handler="h"))
    update = UpdateJob("j", "t", spec, 5)
    latest = REGISTRY.latest("gnomon.job-commands-value")
    body = fastavro.schemaless_reader(io.BytesIO(encode(update)[5:]), latest.schema, return_record_name=True)
    assert body["body"][0] == "gnomon.UpdateJob"
    assert default_codec.decode(_bytes_of("gnomon.job-commands-value", 1, body)) == update
    names = [b["name"] if isinstance(b, dict) else b for b in latest.schema["fields"][0]["type"]]
    v1 = REGISTRY.lookup("gnomon.job-commands-value", 1).schema["fields"][0]["type"]
    assert names[: len(v1)] == [b["name"] if isinstance(b, dict) else b for b in v1]
    # v2 PatchJob, v4 cancel/replay, v6 BackfillJob, v12 MoveJob and AdoptJob (regions)
    assert names[-6:] == ["gnomon.PatchJob", "gnomon.CancelRun", "gnomon.ReplayRun", "gnomon.BackfillJob",
                          "gnomon.MoveJob", "gnomon.AdoptJob"]
    patch = PatchJob("j", "t", '{"name":"x"}', None, 6)
    data = encode(patch)
    assert int.from_bytes(data[1:5], "big") == latest.id
    assert default_codec.decode(data, topic="gnomon.job-commands") == patch


# ---- JobSpec v4 (overlap bufferOne), JobCommand v6 (BackfillJob), RunState v7 ------------


def test_overlap_buffer_one_round_trips_and_an_old_reader_falls_back_to_allow() -> None:
    """JobSpec v4 adds the OverlapPolicy symbol ``bufferOne``; v3's enum has the default
    ``allow``, so a reader still on v3 reads a bufferOne job as allow (not poison)."""
    from gnomon.core.model import OverlapPolicy

    spec = JobSpec("n", Schedule(cron="* * * * *"), Target(TargetType.HANDLER, handler="h"),
                   overlap=OverlapPolicy.BUFFER_ONE)
    run = RunState("j@x", "j", "t", spec, 1, 2, False, RunStatus.SCHEDULED, 3, 4)
    assert default_codec.decode(encode(run)) == run
    latest = REGISTRY.latest("gnomon.runs-value")
    v6 = REGISTRY.lookup("gnomon.runs-value", 6)  # embeds JobSpec v3
    record = fastavro.schemaless_reader(io.BytesIO(encode(run)[5:]), latest.schema)
    assert record["spec"]["overlap"] == "bufferOne"
    old = fastavro.schemaless_reader(io.BytesIO(_write(latest.schema, record)), latest.schema, v6.schema)
    assert old["spec"]["overlap"] == "allow"


def test_backfill_job_and_backfill_trigger_round_trip() -> None:
    from gnomon.core.jobs import BackfillJob, RunTriggered

    cmd = BackfillJob("j", "t", (60_000, 120_000), 5)
    data = encode(cmd, "gnomon.job-commands")
    assert int.from_bytes(data[1:5], "big") == REGISTRY.latest("gnomon.job-commands-value").id
    assert default_codec.decode(data, topic="gnomon.job-commands") == cmd
    spec = JobSpec("n", Schedule(cron="* * * * *"), Target(TargetType.HANDLER, handler="h"))
    trig = RunTriggered("j@x", "j", "t", spec, 60_000, 60_000, False, 5, backfill=True)
    assert default_codec.decode(encode(trig, "gnomon.run-events"), topic="gnomon.run-events") == trig


def test_run_state_v6_records_decode_unbuffered_and_not_backfilled() -> None:
    spec = JobSpec("n", Schedule(cron="* * * * *"), Target(TargetType.HANDLER, handler="h"))
    run = RunState("j@x", "j", "t", spec, 1, 2, False, RunStatus.SKIPPED, 3, 4, reason="paused")
    v6 = REGISTRY.lookup("gnomon.runs-value", 6)
    record = fastavro.schemaless_reader(io.BytesIO(encode(run)[5:]), REGISTRY.latest("gnomon.runs-value").schema)
    old = {f["name"]: record[f["name"]] for f in v6.schema["fields"]}
    decoded = default_codec.decode(b"\x00" + v6.id.to_bytes(4, "big") + _write(v6.schema, old))
    assert decoded == run
    assert (decoded.recheck_at_ms, decoded.backfill, decoded.reopens, decoded.note) == (None, False, 0, None)
