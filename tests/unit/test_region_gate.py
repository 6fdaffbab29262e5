"""Region ownership (gnomon.core.regions) and the gate over it (gnomon.gate), on the
in-memory event log: who runs a namespace, heartbeats, takeover by silence, failback."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gnomon.core.clock import FakeClock
from gnomon.core.regions import (
    Ownership,
    RegionsView,
    beat_key,
    beat_value,
    decide_move,
    decide_takeover,
    home,
)
from gnomon.eventlog.memory import MemoryEventLog
from gnomon.gate import RegionGate

TOPIC = "gnomon.regions"


class Mono:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _log() -> MemoryEventLog:
    return MemoryEventLog(FakeClock(1_700_000_000_000), partitions=1)


def _gate(log: MemoryEventLog, runs_in: str, mono: Mono, **kw: object) -> RegionGate:
    return RegionGate(log, TOPIC, "a", runs_in, log.clock, instance=f"p-{runs_in}", monotonic=mono,
                      check_s=0, **kw)  # type: ignore[arg-type]


def test_an_ownership_record_round_trips_and_bad_ones_are_counted() -> None:
    o = Ownership("a", "b", 3, 123, "takeover: silence")
    assert Ownership.decode("a", o.encode()) == o
    view = RegionsView()
    view.evolve(o.key(), o.encode())
    view.evolve(b"owner/a", b"{not json")
    view.evolve(b"other", b"x")
    assert view.owner("a") == o and view.bad == 2
    assert view.owner("b") == home("b")


@given(st.lists(st.sampled_from(["a", "b"]), max_size=20))
def test_every_change_of_owner_raises_the_epoch_by_one(moves: list[str]) -> None:
    view = RegionsView()
    epoch = 0
    for to in moves:
        decided = decide_move(view, "a", to, 0, "operator")
        if to == view.owner("a").owner:
            assert decided is None
            continue
        assert decided is not None and decided.epoch == epoch + 1 and decided.owner == to
        epoch = decided.epoch
        view.evolve(decided.key(), decided.encode())
    assert view.owner("a").epoch == epoch


def test_a_takeover_needs_the_whole_silence() -> None:
    view = RegionsView()
    assert decide_takeover(view, "a", "b", 19.9, 20, 5) is None
    taken = decide_takeover(view, "a", "b", 20.0, 20, 5)
    assert taken is not None and (taken.owner, taken.epoch) == ("b", 1)
    view.evolve(taken.key(), taken.encode())
    assert decide_takeover(view, "a", "b", 99, 20, 5) is None  # it runs it already


def test_home_runs_standby_waits_then_takes_over_on_silence_and_the_old_owner_stops() -> None:
    log, mono = _log(), Mono()
    active = _gate(log, "a", mono)
    standby = _gate(log, "b", mono, takeover_s=20.0)
    stop = threading.Event()
    assert active.wait_until_mine(stop)
    assert active.still_mine()  # writes a heartbeat
    assert standby.refresh().owner != "b" and not standby.mine()
    for _ in range(12):  # 24 s of heartbeats every 2 s: the standby never takes over
        mono.t += 2
        assert active.still_mine()
        assert not standby.standby_step()
    steps = 0  # region a goes silent (cut off: it writes nothing); b's probes are taken
    while not standby.standby_step():
        mono.t += 2
        steps += 1
        assert steps <= 10
    assert steps == 10  # after 20 s of silence heard (10 steps of 2 s), not before
    assert standby.view.owner("a").epoch == 1 and "no heartbeat from region a" in standby.view.owner("a").reason
    assert standby.still_mine()  # active now: its liveness counts from the takeover, not from its long wait
    mono.t += 2
    assert not active.still_mine()  # a's process reads the takeover first thing and stops


def test_a_standby_cut_off_with_the_owner_out_of_sight_does_not_take_over_after_the_heal() -> None:
    """Region a's standby for namespace b, in a cut-off region a: it may still read (a stale
    leader on its side) but sees none of b's heartbeats and cannot write. Its silence must
    not count: a takeover decided in the cut and retried would land after the heal, on a
    namespace whose owner never stopped (a region cut-off run did exactly that)."""
    log, mono = _log(), Mono()
    owner = _gate(log, "a", mono)  # (namespace "a" here stands for b's: its owner is alive throughout)
    cut_off = _gate(log, "b", mono, takeover_s=20.0)
    assert owner.wait_until_mine(threading.Event()) and owner.still_mine()
    for _ in range(5):
        mono.t += 2
        assert owner.still_mine() and not cut_off.standby_step()
    # the cut: the standby's probes are not taken, and it reads a stale leader on its side,
    # with none of the heartbeats the owner goes on writing on the majority's. An ownership
    # record it would write goes through (as one retried in the cut is delivered at the heal)
    send, read = cut_off._send, cut_off._read_to_end

    def cut_send(key: bytes, value: bytes, **kw: object) -> bool:
        return False if key.startswith(b"probe/") else send(key, value, **kw)  # type: ignore[arg-type]

    cut_off._send = cut_send  # type: ignore[method-assign]
    cut_off._read_to_end = lambda: None  # type: ignore[method-assign]
    for _ in range(30):  # 60 s
        mono.t += 2
        assert owner.still_mine()
        assert not cut_off.standby_step()
        # (its last probe taken counts for stale_s, 12 s, then nothing: never the 20 s)
        assert cut_off.heard_silent_s() <= 12.0 < cut_off.silent_s() or cut_off.silent_s() <= 12.0
    assert cut_off.heard_silent_s() == 0.0 and cut_off.silent_s() >= 60
    cut_off._send, cut_off._read_to_end = send, read  # type: ignore[method-assign]  # healed
    for _ in range(20):  # it hears again, and reads the owner's heartbeats: no takeover
        mono.t += 2
        assert owner.still_mine()
        assert not cut_off.standby_step()
    assert cut_off.view.owner("a").epoch == 0 and cut_off.view.owner("a").owner == "a"


def test_failback_is_an_operator_move_and_the_standby_stops() -> None:
    log, mono = _log(), Mono()
    b = _gate(log, "b", mono)
    moved = b.move("b", "operator takeover")
    assert moved is not None and moved.epoch == 1 and b.mine()
    assert b.move("b", "again") is None  # already
    a = _gate(log, "a", mono)
    back = a.move("a", "failback")
    assert back is not None and back.epoch == 2
    assert a.mine() and not b.still_mine()


def test_a_write_the_cluster_refuses_changes_nothing() -> None:
    log, mono = _log(), Mono()
    log.refuse_writes[TOPIC] = "NOT_ENOUGH_REPLICAS"
    b = _gate(log, "b", mono)
    with pytest.raises(Exception, match="not written"):
        b.move("b", "operator takeover")
    assert not b.mine() and b.view.owner("a") == home("a")


def test_heartbeats_of_another_namespace_do_not_count() -> None:
    log, mono = _log(), Mono()
    prod = log.producer(client_id="t")
    standby = _gate(log, "b", mono, takeover_s=20.0)
    standby.refresh()
    mono.t += 30
    prod.produce(TOPIC, beat_key("c", "x"), beat_value(0, 0))
    prod.flush(1)
    standby.refresh()
    assert standby.silent_s() >= 30


def test_an_active_process_that_cannot_read_the_topic_stops_before_a_standby_would_take_over() -> None:
    from gnomon.core.errors import EventLogError

    log, mono = _log(), Mono()
    active = _gate(log, "a", mono, stale_s=12.0)
    assert active.wait_until_mine(threading.Event())

    def cut() -> None:
        raise EventLogError("timed out")

    active._read_to_end = cut  # type: ignore[method-assign]
    mono.t += 11
    assert active.still_mine()  # unread 11 s: not yet
    mono.t += 2
    assert not active.still_mine()  # 13 s > 12: it may be cut off, and a standby takes over after 20
    assert not active.confirmed_mine()  # (a rebalance's check: unread is not confirmed)


def test_an_active_process_whose_heartbeats_are_not_acknowledged_stops() -> None:
    """A site cut off can still read (its own broker, a stale leader); it cannot write."""
    log, mono = _log(), Mono()
    active = _gate(log, "a", mono, stale_s=12.0)
    assert active.wait_until_mine(threading.Event())
    assert active.still_mine()  # a heartbeat, acknowledged
    log.refuse_writes[TOPIC] = "REQUEST_TIMED_OUT"
    for _ in range(5):  # reads still succeed every 2 s; the beats are refused
        mono.t += 2
        assert active.still_mine()
    mono.t += 3
    assert not active.still_mine() and "no heartbeat acknowledged" in active.stop_reason


def test_background_checks_answer_without_blocking_and_stop_on_a_takeover() -> None:
    import time

    log, mono = _log(), Mono()
    active = RegionGate(log, TOPIC, "a", "a", log.clock, instance="p-a", monotonic=mono, check_s=0.01)
    assert active.wait_until_mine(threading.Event())
    active.start_background()
    try:
        assert active.still_mine()
        other = _gate(log, "b", mono)
        assert other.move("b", "operator takeover") is not None
        deadline = time.monotonic() + 5
        while active.still_mine():
            assert time.monotonic() < deadline, "the background check never saw the takeover"
            time.sleep(0.01)
        assert "region b runs a" in active.stop_reason
    finally:
        active.close()


def test_an_assignment_is_confirmed_by_a_read_that_fails_at_first() -> None:
    """Just after a heal the regions topic's leader may still move: a failed read is tried
    again for a while before an assignment is refused (it used to stop the process at once)."""
    from gnomon.core.errors import EventLogError

    log, mono = _log(), Mono()
    gate = _gate(log, "a", mono)
    assert gate.wait_until_mine(threading.Event())
    read, fails = gate._read_to_end, [2]

    def flaky() -> None:
        if fails[0]:
            fails[0] -= 1
            raise EventLogError("NOT_LEADER_FOR_PARTITION")
        read()

    gate._read_to_end = flaky  # type: ignore[method-assign]
    assert not gate.confirmed_mine()  # one read only: refused
    fails[0] = 2
    assert gate.confirmed_mine(within_s=2.0, pause_s=0.01)  # the third read succeeds
    fails[0] = 1000
    assert not gate.confirmed_mine(within_s=0.05, pause_s=0.01)  # never readable: refused in the end
