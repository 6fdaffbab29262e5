"""Issue 50, finding 10: after a grow, a processor forwards a command whose job moved to
its new partition with a ``gnomon-origin`` header naming where it was first written, and
the answer goes there. The header was not signed: only its plausibility was checked, so a
producer could name another command's position (one its own job's key was once placed
on) and its answer landed there, where the other command's producer reads its own (the
API's wait takes the first answer at its position). Now a processor signs the origin with
the operator's key, which no team holds, and an origin that does not verify is ignored:
the command is answered at its own position. In the simulation (real Processor loops,
the operator key in their keyring)."""

from __future__ import annotations

from gnomon import codec
from gnomon.adapters.kafka import partition_for
from gnomon.core import jobs as J
from gnomon.processor import growth
from gnomon.sim import TENANT, SimCluster


def _write_signed(c: SimCluster, cmd: J.JobCommand, partition: int, extra: tuple[tuple[str, bytes], ...] = ()) -> int:
    """``cmd`` as its tenant's producer writes it to ``partition`` (signed with its key)."""
    key, value = cmd.job_id.encode(), codec.encode(cmd)
    return c.log.append(c.topo.job_commands, key, value, partition,
                        headers=(*c.keys.sign(cmd.tenant, c.topo.job_commands, key, value), *extra))


def test_a_plausible_unsigned_origin_does_not_take_another_commands_answer() -> None:
    c = SimCluster(9, processors=2, workers=1, partitions=2, step_ms=100)
    c.register("v0", "*/2 * * * * *")
    c.run_for(2_000, faults=False)
    c.grow(4)
    c.run_for(3_000, faults=False)
    victim_p = partition_for("v0", 4)
    # the attacker's job: placed on the victim's partition under 2 partitions (so the origin
    # is plausible), on a later one under 4 (so its command may be a forward)
    x = next(f"x{i}" for i in range(10_000) if partition_for(f"x{i}", 2) == victim_p
             and partition_for(f"x{i}", 4) > victim_p)
    c.register(x, "0 0 1 1 *", tenant="evil")
    c.run_for(2_000, faults=False)
    victim_at = _write_signed(c, J.PauseJob("v0", TENANT, c.clock.now_ms()), victim_p)
    evil_at = _write_signed(c, J.PauseJob(x, "evil", c.clock.now_ms()), partition_for(x, 4),
                            (growth.origin_header(victim_p, victim_at),))
    c.run_for(3_000, faults=False)
    answers = [codec.decode(r.value) for r in c.log.records(c.topo.command_results) if r.value is not None]
    at_victims = [(a.tenant, a.command, a.job_id) for a in answers
                  if (a.source_partition, a.source_offset) == (victim_p, victim_at)]
    assert at_victims == [(TENANT, "PauseJob", "v0")], at_victims  # before: evil's answer there too
    evil = [(a.source_partition, a.source_offset) for a in answers if a.tenant == "evil" and a.command == "PauseJob"]
    assert evil == [(partition_for(x, 4), evil_at)], evil


def test_a_forward_of_a_moved_jobs_command_is_answered_where_it_was_written() -> None:
    """The signed origin a processor writes still routes a real forward's answer home."""
    c = SimCluster(9, processors=2, workers=1, partitions=2, step_ms=100)
    moved = next(f"m{i}" for i in range(1_000) if partition_for(f"m{i}", 4) != partition_for(f"m{i}", 2))
    c.register(moved, "*/2 * * * * *")
    c.run_for(2_000, faults=False)
    c.grow(4)
    c.run_for(3_000, faults=False)
    old_p = partition_for(moved, 2)
    at = _write_signed(c, J.PauseJob(moved, TENANT, c.clock.now_ms()), old_p)  # placed by the old count
    c.run_for(3_000, faults=False)
    answers = [codec.decode(r.value) for r in c.log.records(c.topo.command_results) if r.value is not None]
    mine = [a for a in answers if a.command == "PauseJob" and a.job_id == moved]
    assert [(a.source_partition, a.source_offset, a.accepted) for a in mine] == [(old_p, at, True)], mine
    assert c.jobs()[moved].status is J.JobStatus.PAUSED
