"""Per-attempt host ids of a non-root worker (gnomon.worker.host_ids): the subordinate-id
files and the allocator. The namespaces themselves: tests/nonroot.sh runs the sandbox
suite as such a user."""

from __future__ import annotations

from pathlib import Path

from gnomon.worker.host_ids import AttemptIds, SubIdRange, read_range


def test_a_users_range_is_found_by_name_or_uid_and_bad_lines_are_skipped(tmp_path: Path) -> None:
    f = tmp_path / "subuid"
    f.write_text("alice:100000:65536\n# comment\nbob:x:5\nbob:200000:1\n1001:300000:1000\nbob:400000:70000\n")
    assert read_range(f, "alice", 1000) == SubIdRange(100000, 65536)
    assert read_range(f, "carol", 1001) == SubIdRange(300000, 1000)  # by uid
    assert read_range(f, "bob", 1002) == SubIdRange(400000, 70000)  # a range of one id leaves none for attempts
    assert read_range(f, "dave", 1003) is None
    assert read_range(tmp_path / "missing", "alice", 1000) is None


def test_attempts_in_flight_get_distinct_ids_round_robin_and_none_when_all_are_taken() -> None:
    ids = AttemptIds(SubIdRange(100000, 3), SubIdRange(200000, 4))
    assert ids.count == 3
    got = [ids.acquire() for _ in range(3)]
    assert got == [1, 2, 3] and ids.acquire() is None
    ids.release(2)
    assert ids.acquire() == 2
    ids.release(1)
    ids.release(3)
    assert ids.acquire() == 3  # round robin: the next after the last handed out, not the lowest
    assert [ids.host_uid(k) for k in (1, 3)] == [100000, 100002]


def test_the_prefix_maps_the_range_and_drops_to_the_attempts_id() -> None:
    ids = AttemptIds(SubIdRange(100000, 65536), SubIdRange(100000, 65536))
    argv = ids.prefix(7)
    assert argv[:5] == ["unshare", "--map-root-user", "--map-users=100000,1,65536", "--map-groups=100000,1,65536",
                        "--"]
    assert argv[5:] == ["setpriv", "--reuid=7", "--regid=7", "--clear-groups", "--inh-caps=-all",
                        "--bounding-set=-all", "--"]


def test_two_workers_of_one_user_never_hold_the_same_id_at_once(tmp_path: Path) -> None:
    a = AttemptIds(SubIdRange(100000, 4), SubIdRange(100000, 4), tmp_path)
    b = AttemptIds(SubIdRange(100000, 4), SubIdRange(100000, 4), tmp_path)
    held_a = [a.acquire(), a.acquire()]
    held_b = [b.acquire(), b.acquire()]
    assert held_a == [1, 2] and held_b == [3, 4]  # b skipped what a holds
    assert a.acquire() is None and b.acquire() is None
    a.release(1)
    assert b.acquire() == 1  # a lock released is free for the other
