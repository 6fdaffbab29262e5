"""Job commands prove their tenant with a signature (core.command_auth, ADR 0006 (b)):
the pure check, the keys on disk, and the processor's refusals in the simulation."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gnomon import codec, command_keys
from gnomon.adapters.kafka import partition_for
from gnomon.core import jobs as J
from gnomon.core.command_auth import (
    HEADER,
    OPERATOR,
    CommandKey,
    MemoryKeyring,
    Unauthenticated,
    require,
    sign,
    verify,
)
from gnomon.core.replies import CommandResult, ResultCode
from gnomon.sim import SimCluster

ACME = CommandKey("acme.1", "acme", b"a" * 32)
GLOBEX = CommandKey("globex.1", "globex", b"g" * 32)
OPS = CommandKey("operator.1", OPERATOR, b"o" * 32)
RING = MemoryKeyring.of([ACME, GLOBEX, OPS])
TOPIC = "gnomon.job-commands"


def test_a_signed_record_verifies_and_proves_its_tenant_only() -> None:
    headers = sign(ACME, TOPIC, b"job-1", b"value")
    assert verify(RING, TOPIC, b"job-1", b"value", headers) == ACME
    assert require(ACME, "acme") == ACME
    with pytest.raises(Unauthenticated, match=r"tenant 'globex' but is signed with key 'acme\.1'"):
        require(ACME, "globex")
    assert require(OPS, "globex") == OPS  # the operator may act for any tenant


@pytest.mark.parametrize(("headers", "why"), [
    ((), "not signed"),
    (((HEADER, b"v1:acme.1:00"), (HEADER, b"v1:acme.1:00")), "2 gnomon-sig headers"),
    (((HEADER, b"garbage"),), "malformed"),
    (((HEADER, b"\xff\xfe"),), "malformed"),
    (((HEADER, b"v2:acme.1:" + b"00" * 32),), "version 'v2'"),
    (((HEADER, b"v1:acme.1:abcd"),), "2 bytes"),
    (((HEADER, b"v1:nobody.9:" + b"00" * 32),), "unknown command key 'nobody.9'"),
    (((HEADER, b"v1:acme.1:" + b"00" * 32),), "does not match"),
])
def test_a_record_without_a_good_signature_is_refused_saying_why(headers: tuple[tuple[str, bytes], ...],
                                                                  why: str) -> None:
    with pytest.raises(Unauthenticated, match=why) as exc:
        verify(RING, TOPIC, b"job-1", b"value", headers)
    assert exc.value.field == "signature"


@given(st.binary(max_size=40), st.binary(max_size=40), st.integers(0, 2), st.integers(0, 10_000))
def test_any_change_to_topic_key_or_value_breaks_the_signature(key: bytes, value: bytes, part: int,
                                                              where: int) -> None:
    headers = sign(ACME, TOPIC, key, value)
    fields = [TOPIC.encode(), key, value]
    target = fields[part]
    if target:  # flip one byte
        i = where % len(target)
        fields[part] = target[:i] + bytes([target[i] ^ 0x01]) + target[i + 1:]
    else:  # or add one to an empty field
        fields[part] = b"x"
    with pytest.raises(Unauthenticated):
        verify(RING, fields[0].decode(errors="replace") if part == 0 else TOPIC, fields[1], fields[2], headers)
    # and moving bytes between key and value (lengths are in the MAC) does too
    if key:
        with pytest.raises(Unauthenticated):
            verify(RING, TOPIC, key[:-1], key[-1:] + value, headers)


def test_keys_live_in_0600_files_and_the_processor_sees_a_new_tenant_without_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "command-keys"
    ring = command_keys.DirKeyring(d)
    assert ring.find("nothing") is None
    first = command_keys.ensure(d, "acme")
    assert command_keys.ensure(d, "acme") == first  # made once
    path = command_keys.tenant_file(d, "acme")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    monkeypatch.setattr(command_keys, "RELOAD_MIN_S", 0.0)
    assert ring.find(first.key_id) == first
    second = command_keys.rotate(d, "acme")
    assert ring.find(second.key_id) == second and ring.find(first.key_id) == first  # both verify in a rotation
    third = command_keys.rotate(d, "acme", revoke_old=True)
    assert ring.find(third.key_id) == third
    assert ring.find(first.key_id) is None and ring.find(second.key_id) is None  # revoked
    with pytest.raises(Exception, match="a tenant name"):
        command_keys.ensure(d, "../etc")
    # an operator key is honoured from operator.json only, never from a tenant's file
    forged = CommandKey("acme.op", OPERATOR, b"x" * 32)
    command_keys.credentials.write_secret(
        path, f'{{"tenant": "*", "keys": [{{"id": "{forged.key_id}", "secret": "{forged.secret.hex()}"}}]}}')
    assert ring.find(forged.key_id) is None
    ops = command_keys.ensure(d, OPERATOR)
    assert ring.find(ops.key_id) == ops and ops.tenant == OPERATOR
    # a malformed file loses its own keys only; the processor goes on verifying the others
    (d / "tenants" / "broken.json").write_text("{not json")
    other = command_keys.ensure(d, "globex")
    assert ring.find(other.key_id) == other and ring.find(ops.key_id) == ops


def test_a_key_issued_or_revoked_just_after_a_reread_counts_at_once(tmp_path: Path) -> None:
    """No one-second blind spot: a forged id looked up (a re-read), then a new tenant's
    first key: it verifies at once; a revoked key stops verifying at the next check."""
    ring = command_keys.DirKeyring(tmp_path)
    command_keys.ensure(tmp_path, "acme")
    assert ring.find("forged.1") is None
    first = command_keys.ensure(tmp_path, "globex")
    assert ring.find(first.key_id) == first
    command_keys.rotate(tmp_path, "globex", revoke_old=True)
    time.sleep(command_keys.RELOAD_MIN_S)
    assert ring.find(first.key_id) is None


def test_the_api_signer_issues_a_first_key_and_a_producer_signer_does_not(tmp_path: Path) -> None:
    with pytest.raises(command_keys.CredentialError, match="no command key for tenant 'acme'"):
        command_keys.Signer(tmp_path, issue=False).key("acme")
    headers = command_keys.Signer(tmp_path, issue=True).headers("acme", TOPIC, b"k", b"v")
    assert verify(command_keys.DirKeyring(tmp_path), TOPIC, b"k", b"v", headers).tenant == "acme"
    assert command_keys.Signer(tmp_path, issue=False).key("acme").tenant == "acme"


def _answers(c: SimCluster) -> dict[tuple[int, int], CommandResult]:
    out = {}
    for rec in c.log.records(c.topo.command_results):
        res = codec.decode(rec.value or b"", c.topo.command_results)
        assert isinstance(res, CommandResult)
        out[(res.source_partition, res.source_offset)] = res
    return out


def test_tenant_a_cannot_register_patch_or_delete_tenant_bs_job_through_kafka() -> None:
    """The finding: anyone with the api Kafka credential could act for any tenant. Now
    tenant A's producer, holding only A's key, is refused on the results topic for each
    command it forges for B (signed with A's key, or not at all); B's job is untouched."""
    c = SimCluster(24, processors=1, workers=1, worker_tenants=("globex",))
    c.register("b-job", "*/5 * * * *", tenant="globex")
    c.run_for(2_000, faults=False)
    b_job = c.jobs()["b-job"]
    assert b_job.tenant == "globex"
    topic, now = c.topo.job_commands, c.clock.now_ms()
    a_key = c.keys.key("acme")
    forged = [J.RegisterJob("b-job", "globex", b_job.spec, now),
              J.PatchJob("b-job", "globex", '{"priority":"high"}', None, now),
              J.DeleteJob("b-job", "globex", now)]
    part = partition_for("b-job", c.topo.partitions)
    sent = []
    for cmd in forged:
        value = codec.encode(cmd, topic)
        for headers in (sign(a_key, topic, b"b-job", value), ()):  # A's key, and unsigned
            sent.append((cmd, c.log.append(topic, b"b-job", value, part, headers=headers)))
    c.run_for(2_000, faults=False)
    answers = _answers(c)
    for cmd, offset in sent:
        res = answers[(part, offset)]
        assert res.code is ResultCode.REFUSED and res.field == "signature", (cmd, res)
    after = c.jobs()["b-job"]
    assert after.version == b_job.version and after.spec == b_job.spec
    assert c.processor("p0").tasks[part].stats.unsigned_refused == len(sent)
    assert c.processor("p0").metrics.registry.get_sample_value("gnomon_job_commands_unauthenticated_total") == len(sent)
    # B's own key still works
    value = codec.encode(J.PauseJob("b-job", "globex", now), topic)
    offset = c.log.append(topic, b"b-job", value, part, headers=c.keys.sign("globex", topic, b"b-job", value))
    c.run_for(1_000, faults=False)
    assert _answers(c)[(part, offset)].accepted
    assert c.jobs()["b-job"].status is J.JobStatus.PAUSED
