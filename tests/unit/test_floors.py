"""FloorKV: scans that skip an index's deleted head return what a plain store returns."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.adapters.floors import FloorKV
from gnomon.adapters.kv import MemoryKV, RocksKV

# ours (the time indexes twice as likely; waiting runs of two pools' lanes), and neighbours
PREFIXES = [b"jd/", b"rt/", b"jd/", b"rt/", b"rw/a\x0001/", b"rw/a\x0002/", b"rw/b\x0001/", b"j/", b"rq/"]
keys = st.builds(lambda p, n: p + b"%02d" % n, st.sampled_from(PREFIXES), st.integers(0, 12))
# scans from an index's start (as a tick does: they raise its floor), from inside one, from elsewhere
starts = st.one_of(st.sampled_from([b"jd/", b"rt/", b"rw/a\x0001", b"rw/a\x0002", b"rw/b\x0001"]), keys,
                   st.sampled_from([b"", b"jd0", b"zz", b"jd", b"rw/a\x00"]))
bounds = st.one_of(keys, st.sampled_from([b"", b"jd0", b"rt0", b"zz", b"jd", b"rw/a\x0002", b"rw/a\x0003", b"rw/b\x0002"]))
ops = st.lists(st.one_of(
    st.tuples(st.just("put"), keys),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("scan"), starts, bounds, st.integers(0, 50), st.integers(0, 60)),
), max_size=60)


@given(ops)
@settings(max_examples=600, deadline=None)
def test_scans_match_a_plain_store(script: list[tuple]) -> None:
    plain, floored = MemoryKV(), FloorKV(MemoryKV())
    for op in script:
        if op[0] == "put":
            plain.put(op[1], b"v" + op[1])
            floored.put(op[1], b"v" + op[1])
        elif op[0] == "delete":
            plain.delete(op[1])
            floored.delete(op[1])
        else:
            _, start, stop, limit, take = op
            want = list(plain.scan(start, stop, limit))[:take]
            got = []
            it = floored.scan(start, stop, limit)
            for item in it:  # a scan read only partly, as a cursor would
                if len(got) >= take:
                    break
                got.append(item)
            assert got == want, (start, stop, limit, take)


def test_a_floor_rises_past_deleted_entries_and_falls_for_an_older_put(tmp_path: Path) -> None:
    kv = FloorKV(RocksKV(tmp_path / "db"))
    for ms in range(100):
        kv.put(b"jd/%013d/job" % ms, b"")
    for ms in range(90):
        kv.delete(b"jd/%013d/job" % ms)
    assert [k for k, _ in kv.scan(b"jd/", b"jd/%013d/" % 200, 10)][:1] == [b"jd/%013d/job" % 90]
    assert kv.floor(b"jd/") == b"jd/%013d/job" % 90  # the next scan seeks past the 90 tombstones
    kv.put(b"jd/%013d/late" % 5, b"")  # a job due long ago (a resumed job): below the floor
    assert kv.floor(b"jd/") == b"jd/%013d/late" % 5
    assert [k for k, _ in kv.scan(b"jd/", b"jd/%013d/" % 200, 2)] == [b"jd/%013d/late" % 5, b"jd/%013d/job" % 90]
    kv.close()


def test_an_empty_index_floor_stops_at_its_end() -> None:
    kv = FloorKV(MemoryKV())
    kv.put(b"rtz", b"")  # another family, sorting after rt/
    assert list(kv.scan(b"rt/", b"zz", 10)) == [(b"rtz", b"")]
    assert kv.floor(b"rt/") == b"rt0"  # never past the index's own end
    kv.put(b"rt/5", b"")
    assert list(kv.scan(b"rt/", b"zz", 10)) == [(b"rt/5", b""), (b"rtz", b"")]


class CountingKV(MemoryKV):
    def __init__(self) -> None:
        super().__init__()
        self.scans = 0

    def scan(self, start: bytes, stop: bytes, limit: int):  # type: ignore[no-untyped-def]
        self.scans += 1
        return super().scan(start, stop, limit)


def test_a_tick_with_nothing_due_does_not_touch_the_store() -> None:
    inner = CountingKV()
    kv = FloorKV(inner)
    kv.put(b"rt/%013d/run" % 5_000, b"")  # the next timer, 5 s away
    assert list(kv.scan(b"rt/", b"rt/%013d/" % 1_000, 100)) == []  # nothing due: the floor goes to that timer
    assert kv.floor(b"rt/") == b"rt/%013d/run" % 5_000
    before = inner.scans
    for now in range(1_200, 5_000, 200):  # the ticks until it is due
        assert list(kv.scan(b"rt/", b"rt/%013d/" % now, 100)) == []
    assert inner.scans == before
    assert [k for k, _ in kv.scan(b"rt/", b"rt/%013d/" % 5_001, 100)] == [b"rt/%013d/run" % 5_000]


def test_a_put_between_making_a_scan_and_reading_it_is_seen() -> None:
    kv = FloorKV(MemoryKV())
    kv.put(b"rt/7/a", b"")
    assert [k for k, _ in kv.scan(b"rt/", b"rt/9", 10)] == [b"rt/7/a"]  # the floor: rt/7/a
    scan = kv.scan(b"rt/", b"rt/9", 10)  # made, not read yet
    kv.put(b"rt/3/b", b"")  # lowers the floor
    assert [k for k, _ in scan] == [b"rt/3/b", b"rt/7/a"]
    assert [k for k, _ in kv.scan(b"rt/", b"rt/9", 10)] == [b"rt/3/b", b"rt/7/a"]
