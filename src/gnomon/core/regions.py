"""Which region runs a region's jobs: ownership records and the decisions over them (pure).

Every region is a namespace of its own (``gnomon.region``): its topics, its groups, its
jobs. The region that *runs* a namespace is its *owner*: the namespace's home region
until a takeover, another region after one, back home after a failback. The regions
topic (one partition, compacted, on the stretched Kafka cluster: ADR 0013) holds:

* ``owner/<region>``: an :class:`Ownership`, the last one in the log is in force. Its
  ``epoch`` grows by one with every change; log order, not the epoch, decides between
  two writers that raced (both wrote ``epoch + 1``), and Kafka's majority decides which
  writes exist at all: a cut-off region cannot write one;
* ``beat/<region>/<instance>``: a heartbeat of a process that runs ``region`` now, with
  the epoch it runs under. A standby counts silence by its *own* clock from the moment it
  read the last new heartbeat, never by the writer's timestamp, so clock skew between
  regions cannot start a takeover;
* ``probe/<region>/<instance>``: a standby's own write (acks=all), every 2 s: silence
  counts only while the cluster takes them. A standby cut off with the owner's heartbeats
  out of its sight (it may still read a stale leader on its side) hears nothing and cannot
  write: its silence must not count, or its takeover, retried through the cut, lands
  after the heal on a namespace whose owner never stopped.

:func:`decide_takeover` is the automatic takeover: a standby region takes a namespace
over once its owner has been silent for ``takeover_s`` (the processes of a region that
is cut off cannot write heartbeats, and cannot write anything else either).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

OWNER = "owner/"
BEAT = "beat/"
PROBE = "probe/"  # a standby's acks=all write: is it on the majority side? (gnomon.gate; read by nobody)
_NAME = re.compile(r"[a-z][a-z0-9]{0,15}")


def validate_name(name: str, variable: str = "region") -> str:
    """``name`` if it is a region name (a lowercase letter, then at most 15 lowercase
    letters or digits); else ValueError naming ``variable`` (where the name came from).
    The one rule for region names (``gnomon.region.validate`` is this)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{variable}: {name!r} is not a region name (a lowercase letter, then at most 15 "
                         "lowercase letters or digits, e.g. eu1)")
    return name


@dataclass(frozen=True)
class Ownership:
    region: str  # the namespace
    owner: str  # the region whose processes run it
    epoch: int  # 0: the home region, never changed
    at_ms: int  # when it was decided (the writer's clock: for people, never compared)
    reason: str

    def key(self) -> bytes:
        return f"{OWNER}{self.region}".encode()

    def encode(self) -> bytes:
        return json.dumps({"owner": self.owner, "epoch": self.epoch, "at_ms": self.at_ms,
                           "reason": self.reason}, sort_keys=True).encode()

    @classmethod
    def decode(cls, region: str, value: bytes) -> Ownership:
        """Raises ``ValueError`` for a value that is not an ownership record."""
        try:
            data = json.loads(value)
            out = cls(region, str(data["owner"]), int(data["epoch"]), int(data["at_ms"]), str(data["reason"]))
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not an ownership record: {exc}") from exc
        if out.epoch < 0 or not out.owner:
            raise ValueError("not an ownership record: a negative epoch or no owner")
        return out


def home(region: str) -> Ownership:
    """The ownership of a namespace nothing was ever written for: its home region runs it."""
    return Ownership(region, region, 0, 0, "home")


def beat_key(region: str, instance: str) -> bytes:
    return f"{BEAT}{region}/{instance}".encode()


def probe_key(region: str, instance: str) -> bytes:
    return f"{PROBE}{region}/{instance}".encode()


def beat_value(epoch: int, at_ms: int) -> bytes:
    return json.dumps({"epoch": epoch, "at_ms": at_ms}).encode()


@dataclass
class RegionsView:
    """What a reader of the regions topic knows (:meth:`evolve` one record at a time)."""

    owners: dict[str, Ownership] = field(default_factory=dict)
    beats: dict[str, int] = field(default_factory=dict)  # region -> heartbeats read for it
    bad: int = 0  # records that were neither (left alone, counted)

    def owner(self, region: str) -> Ownership:
        return self.owners.get(region) or home(region)

    def evolve(self, key: bytes | None, value: bytes | None) -> None:
        text = (key or b"").decode("utf-8", "replace")
        if text.startswith(OWNER) and value is not None:
            region = text[len(OWNER):]
            try:
                self.owners[region] = Ownership.decode(region, value)
            except ValueError:
                self.bad += 1
        elif text.startswith(BEAT) and value is not None:
            region = text[len(BEAT):].partition("/")[0]
            self.beats[region] = self.beats.get(region, 0) + 1
        elif text.startswith(PROBE):
            pass  # a standby's probe: what matters is that the cluster took it, not what it says
        else:
            self.bad += 1


def decide_takeover(view: RegionsView, region: str, by: str, silent_s: float, takeover_s: float,
                    now_ms: int) -> Ownership | None:
    """The ownership ``by`` writes to take ``region`` over, or None: it already runs it, or
    the owner has not been silent for ``takeover_s`` (``silent_s``: since this reader last
    read a new heartbeat of ``region``, by its own clock)."""
    assert takeover_s > 0, takeover_s
    current = view.owner(region)
    if current.owner == by or silent_s < takeover_s:
        return None
    return Ownership(region, by, current.epoch + 1, now_ms,
                     f"takeover: no heartbeat from region {current.owner} for {silent_s:.0f} s")


def decide_move(view: RegionsView, region: str, to: str, now_ms: int, reason: str) -> Ownership | None:
    """An operator's takeover or failback: ``to`` runs ``region`` from now (None: it does)."""
    current = view.owner(region)
    if current.owner == to:
        return None
    return Ownership(region, to, current.epoch + 1, now_ms, reason)
