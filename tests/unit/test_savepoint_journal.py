"""JournalKV: a rollback puts the store back as it was at ``begin``, whatever was read and
written in between (reads keep the value the journal then needs)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.adapters.kv import MemoryKV
from gnomon.streams.savepoint import JournalKV

keys = st.sampled_from([b"a", b"b", b"c", b"d"])
ops = st.lists(st.one_of(
    st.tuples(st.just("get"), keys),
    st.tuples(st.just("put"), keys, st.binary(max_size=3)),
    st.tuples(st.just("delete"), keys),
), max_size=30)


def _contents(kv: MemoryKV) -> list[tuple[bytes, bytes]]:
    return list(kv.scan(b"", b"\xff", 100))


@given(st.lists(st.tuples(keys, st.binary(max_size=3)), max_size=4), ops, ops, st.booleans())
@settings(max_examples=300, deadline=None)
def test_rollback_restores_the_store_as_at_begin(initial: list[tuple[bytes, bytes]], kept: list[tuple],
                                                 undone: list[tuple], roll_back: bool) -> None:
    inner = MemoryKV()
    for k, v in initial:
        inner.put(k, v)
    journal = JournalKV(inner)
    for script in (kept, undone):  # one savepoint kept, then one taken back (or kept too)
        before = _contents(inner)
        journal.begin()
        for op in script:
            if op[0] == "get":
                assert journal.get(op[1]) == inner.get(op[1])
            elif op[0] == "put":
                journal.put(op[1], op[2])
            else:
                journal.delete(op[1])
        if script is undone and roll_back:
            journal.rollback()
            assert _contents(inner) == before
        else:
            journal.release()
