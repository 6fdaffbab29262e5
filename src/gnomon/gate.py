"""The region gate: a process of a region's namespace runs only while its region owns it.

A processor or worker started with ``GNOMON_REGION=a`` serves namespace ``a``; it runs in
``GNOMON_RUNS_IN`` (default ``a``). Before it joins any group it waits at the gate until
the regions topic says its region owns ``a`` (:mod:`gnomon.core.regions`), and while it
runs it checks every ``check_s`` and stops when that is no longer so. A process of the
home region is therefore *active* and one started in the other region a *standby*: it
reads the owner's heartbeats and, with ``takeover_s`` set, writes the takeover itself
once they have been silent that long.

Why a cut-off region cannot come back and run what it lost: its processes cannot write
while cut (Kafka's majority is on the other side), and the first thing they read after
the heal is the newer ownership, so they stop (exit: the supervisor starts them again,
and they wait at the gate). Kafka fences the rest: their open transactions were aborted
and their group generation is gone. Workers read the same gate (``GNOMON_REGION``).

Without ``GNOMON_REGION`` there is no gate: one region, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gnomon.core.clock import Clock
from gnomon.core.errors import EventLogError
from gnomon.core.regions import (
    Ownership,
    RegionsView,
    beat_key,
    beat_value,
    decide_move,
    decide_takeover,
    probe_key,
)
from gnomon.eventlog.port import EventLog, Producer, Reader

log = logging.getLogger("gnomon.gate")

READ_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 15.0
STALE_S = 12.0  # an active process stops after this long unable to read the topic or have a heartbeat taken
SOCKET_TIMEOUT_S = 3.0  # the gate's writes: a request unanswered this long is sent again (a new leader)
GATE_GROUP = "gnomon-regions"  # assigned, never joined or committed (ACL: gnomon.infra.acls)


class RegionGate:
    def __init__(self, log_: EventLog, topic: str, region: str, runs_in: str, clock: Clock, *, instance: str,
                 takeover_s: float | None = None, beats: bool = True, beat_s: float = 2.0, check_s: float = 1.0,
                 stale_s: float = STALE_S, monotonic: Callable[[], float] = time.monotonic) -> None:
        assert takeover_s is None or takeover_s > 3 * beat_s, (takeover_s, beat_s)
        assert takeover_s is None or stale_s < takeover_s, (stale_s, takeover_s)
        self.log, self.topic, self.region, self.runs_in = log_, topic, region, runs_in
        self.clock, self.instance = clock, instance
        self.takeover_s, self.beats, self.beat_s, self.check_s = takeover_s, beats, beat_s, check_s
        # an active process that has not read the regions topic for this long stops: it may be
        # cut off, and a standby takes over after takeover_s of silence (longer, by the
        # assertion above), so the old owner has stopped before the new one starts
        self.stale_s = stale_s
        self._read_ok_at = monotonic()
        self._beat_acked_at = monotonic()  # the last heartbeat the cluster acknowledged
        self._mono = monotonic
        self.view = RegionsView()
        self._next = 0  # the regions topic's next offset to read
        self._beats_seen = 0  # heartbeats of ``region`` read so far
        self._silent_since = monotonic()  # a standby counts a full takeover_s from its start
        self._last_check = -1e9
        self._last_beat = -1e9
        # a standby's probes (acks=all): the owner's silence counts only since they have been
        # acknowledged without a gap over stale_s, and only while the last is that recent
        self._probe_acked_at: float | None = None
        self._heard_since: float | None = None
        self._said = False  # (a standby said so once)
        self._producer: Producer | None = None
        self._reader: Reader | None = None
        self.readable = False  # the last read reached the topic's end
        self.stop_reason = ""  # why ``still_mine`` said no
        self._lock = threading.Lock()
        self._bg: threading.Thread | None = None
        self._bg_stop = threading.Event()
        self._bg_ok = True

    # ---- reading -------------------------------------------------------------------

    def refresh(self) -> Ownership:
        """Read what is new on the regions topic; the ownership in force."""
        with self._lock:  # (the background checks and a rebalance's confirmation share the reader)
            return self._refresh()

    def _refresh(self) -> Ownership:
        try:
            self._read_to_end()
            self.readable = True
            self._read_ok_at = self._mono()
        except EventLogError as exc:
            self.readable = False
            self._drop_reader()
            log.warning("region gate: cannot read %s (%s)", self.topic, exc)
        seen = self.view.beats.get(self.region, 0)
        if seen != self._beats_seen:
            self._beats_seen, self._silent_since = seen, self._mono()
        return self.view.owner(self.region)

    def _read_to_end(self) -> None:
        """One long-lived reader (a fresh client per read would pay a login each second)."""
        tp = (self.topic, 0)
        if self._reader is None:
            self._reader = self.log.reader(GATE_GROUP, client_id=f"gate-{self.instance}",
                                           config={"socket.timeout.ms": int(SOCKET_TIMEOUT_S * 1000)})
            self._reader.assign([(self.topic, 0, self._next)])
        _, high = self._reader.watermarks(tp, READ_TIMEOUT_S)
        deadline = self._mono() + READ_TIMEOUT_S
        while self._next < high:
            if self._mono() > deadline:
                raise EventLogError(f"{self.topic}: not read to its end ({high}) in {READ_TIMEOUT_S:.0f} s")
            for rec in self._reader.consume(500, 0.5):
                self.view.evolve(rec.key, rec.value)
                self._next = rec.offset + 1

    def _drop_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def confirmed_mine(self, within_s: float = 0.0, pause_s: float = 0.5) -> bool:
        """Read now: True only if a read succeeded and this region owns the namespace. A
        read that fails is tried again (``pause_s`` apart) while ``within_s`` has not passed
        since the first: just after a heal, the topic's leader may still be moving."""
        began = time.monotonic()
        while True:
            self.refresh()
            if self.readable:
                return self.mine()
            if time.monotonic() - began + pause_s > within_s:
                return False
            time.sleep(pause_s)

    def mine(self) -> bool:
        return self.view.owner(self.region).owner == self.runs_in

    def silent_s(self) -> float:
        """Seconds since a new heartbeat of the namespace was read (by this clock)."""
        return self._mono() - self._silent_since

    def heard_silent_s(self) -> float:
        """The owner's silence as a standby may count it: since the last new heartbeat read,
        but only over the time this standby's own probes were acknowledged (it is on the
        majority's side, where the owner's heartbeats would be); 0 when its last
        acknowledged probe is older than ``stale_s`` (it may be cut off itself)."""
        now = self._mono()
        if self._probe_acked_at is None or self._heard_since is None or now - self._probe_acked_at > self.stale_s:
            return 0.0
        return now - max(self._silent_since, self._heard_since)

    def _probe_acked(self) -> None:
        now = self._mono()
        if self._probe_acked_at is None or now - self._probe_acked_at > self.stale_s:
            self._heard_since = now  # heard again after a gap: silence counts from here
        self._probe_acked_at = now

    # ---- waiting and checking ------------------------------------------------------

    def wait_until_mine(self, stop: threading.Event, poll_s: float = 1.0, max_wait_s: float | None = None) -> bool:
        """Block until this region owns the namespace (True), or ``stop`` is set or
        ``max_wait_s`` passed (False). A standby with ``takeover_s`` takes the namespace
        over when its owner is silent."""
        until = None if max_wait_s is None else self._mono() + max_wait_s
        while not stop.is_set() and (until is None or self._mono() < until):
            if self.standby_step():
                return True
            stop.wait(poll_s)
        return False

    def standby_step(self) -> bool:
        """One look of a waiting process: True once its region runs the namespace (it is
        active from then). With ``takeover_s``, a standby probes (every ``beat_s``) and
        writes the takeover once the owner has been silent that long while it could hear."""
        current = self.refresh()
        if self.mine():
            self._said = False
            # its liveness counts from now, not from when it began to wait as a standby
            self._read_ok_at = self._beat_acked_at = self._mono()
            log.info("region gate: %s runs %s (epoch %d: %s)", self.runs_in, self.region, current.epoch,
                     current.reason)
            return True
        if not self._said:
            log.info("region gate: standby for %s in %s; region %s runs it (epoch %d)", self.region,
                     self.runs_in, current.owner, current.epoch)
            self._said = True
        if self.takeover_s is None:
            return False
        if self._mono() - self._last_beat >= self.beat_s:
            self._last_beat = self._mono()
            self._send(probe_key(self.region, self.instance), beat_value(current.epoch, self.clock.now_ms()),
                       wait_s=0.0, on_ack=self._probe_acked)
        if self.readable:
            decided = decide_takeover(self.view, self.region, self.runs_in, self.heard_silent_s(), self.takeover_s,
                                      self.clock.now_ms())
            if decided is not None and self.write(decided):
                return self.standby_step()
        return False

    def start_background(self) -> None:
        """Check every ``check_s`` on a thread of its own from now on, so that a read that
        waits for an unreachable leader (up to ``READ_TIMEOUT_S``) never holds up the
        process's loop; ``still_mine`` then answers from the thread's last check."""
        if self._bg is not None:
            return

        def loop() -> None:
            while not self._bg_stop.wait(self.check_s):
                try:
                    self._bg_ok = self._check()
                except Exception:  # never let the thread die quietly: say so, and count as a failed check
                    log.exception("region gate: a check failed")
            log.debug("region gate: checks stopped")

        self._bg = threading.Thread(target=loop, name="region-gate", daemon=True)
        self._bg.start()

    def still_mine(self) -> bool:
        """At most every ``check_s``: read the topic and say whether this region still owns
        the namespace; writes this process's heartbeat every ``beat_s`` while it does.
        With :meth:`start_background`: the background thread's last answer."""
        if self._bg is not None:
            return self._bg_ok
        now = self._mono()
        if now - self._last_check < self.check_s:
            return True
        self._last_check = now
        return self._check()

    def _check(self) -> bool:
        now = self._mono()
        current = self.refresh()
        unread_too_long = not self.readable and now - self._read_ok_at > self.stale_s
        if not self.mine() and not unread_too_long:
            # (first: the most telling reason) the view, read now or within stale_s, names another region
            self.stop_reason = f"region {current.owner} runs {self.region} now (epoch {current.epoch})"
            log.warning("region gate: region %s runs %s now (epoch %d: %s); stopping here in %s",
                        current.owner, self.region, current.epoch, current.reason, self.runs_in)
            return False
        if unread_too_long:
            self.stop_reason = (f"the regions topic was unread for {now - self._read_ok_at:.0f} s (cut off?): another "
                                f"region may take {self.region} over")
            log.warning("region gate: %s; stopping here in %s", self.stop_reason, self.runs_in)
            return False
        if self.beats and now - self._beat_acked_at > self.stale_s:
            # a read can still succeed in a site cut off (from its own broker, a leader that
            # does not know it was replaced); an acks=all write cannot: it needs the majority
            self.stop_reason = (f"no heartbeat acknowledged for {now - self._beat_acked_at:.0f} s (cut off from the "
                                f"cluster's majority?): another region may take {self.region} over")
            log.warning("region gate: %s; stopping here in %s", self.stop_reason, self.runs_in)
            return False
        if self.beats and now - self._last_beat >= self.beat_s:
            self._last_beat = now
            self._send(beat_key(self.region, self.instance), beat_value(current.epoch, self.clock.now_ms()),
                       wait_s=0.0, on_ack=self._beat_acked)
        return True

    # ---- writing -------------------------------------------------------------------

    def write(self, ownership: Ownership) -> bool:
        """Write an ownership record and wait for the cluster to take it (acks=all, the
        majority side only). True if it was taken."""
        ok = self._send(ownership.key(), ownership.encode(), wait_s=WRITE_TIMEOUT_S)
        if ok:
            log.warning("region gate: %s now runs %s (epoch %d: %s)", ownership.owner, ownership.region,
                        ownership.epoch, ownership.reason)
            self.refresh()
        else:
            log.warning("region gate: the ownership of %s was not written (no majority reachable?)", self.region)
        return ok

    def move(self, to: str, reason: str) -> Ownership | None:
        """An operator's takeover or failback (None: ``to`` already runs it)."""
        self.refresh()
        if not self.readable:
            raise EventLogError(f"cannot read {self.topic}: is this region cut off from the cluster's majority?")
        decided = decide_move(self.view, self.region, to, self.clock.now_ms(), reason)
        if decided is not None and not self.write(decided):
            raise EventLogError(f"the ownership of {self.region} was not written within {WRITE_TIMEOUT_S:.0f} s")
        return decided

    def _beat_acked(self) -> None:
        self._beat_acked_at = self._mono()

    def _send(self, key: bytes, value: bytes, *, wait_s: float, on_ack: Callable[[], None] | None = None) -> bool:
        if self._producer is None:
            # a request in flight to a broker cut off waits for the socket timeout before the
            # client retries on the new leader: at librdkafka's default (capped by the message
            # timeout: 15 s) an active process's heartbeats went unacknowledged past stale_s while
            # the other region was cut off, and it stopped itself; 3 s lets a retry land in time
            self._producer = self.log.producer(client_id=f"gate-{self.instance}",
                                               config={"acks": "all", "message.timeout.ms": int(WRITE_TIMEOUT_S * 1000),
                                                       "socket.timeout.ms": int(SOCKET_TIMEOUT_S * 1000)})
        done: list[bool] = []

        def delivered(err: str | None, _p: int, _o: int) -> None:
            done.append(err is None)
            if err is None and on_ack is not None:
                on_ack()

        self._producer.produce(self.topic, key, value, on_delivery=delivered)
        if wait_s <= 0:
            self._producer.poll(0)
            return True
        self._producer.flush(wait_s)
        return bool(done) and done[0]

    def close(self) -> None:
        self._bg_stop.set()
        if self._bg is not None:
            self._bg.join(READ_TIMEOUT_S + 5)
            self._bg = None
        with self._lock:
            self._drop_reader()
        if self._producer is not None:
            self._producer.flush(2.0)
