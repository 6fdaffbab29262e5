"""JournalKV: a rollback puts the store back as it was at ``begin``, whatever was read and
written in between (reads keep the value the journal then needs)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.adapters.kv import MemoryKV
from gnomon.processor.savepoint import JournalKV

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


class _CountingKV(MemoryKV):
    def __init__(self) -> None:
        super().__init__()
        self.gets = 0

    def get(self, key: bytes) -> bytes | None:
        self.gets += 1
        return super().get(key)


def test_an_assumed_prior_value_is_journaled_without_a_read() -> None:
    inner = _CountingKV()
    inner.put(b"ix/old", b"")
    j = JournalKV(inner)
    j.begin()
    j.assume(b"ix/new", None)
    j.put(b"ix/new", b"")
    j.assume(b"ix/old", b"")
    j.delete(b"ix/old")
    j.put(b"r/1", b"state")  # not assumed: read once to journal it
    assert inner.gets == 1
    j.rollback()
    assert inner.get(b"ix/new") is None and inner.get(b"ix/old") == b"" and inner.get(b"r/1") is None
    j.begin()
    j.put(b"k", b"v1")
    j.assume(b"k", None)  # (after a write: the journal keeps what it saw first)
    j.rollback()
    assert inner.get(b"k") is None


def _transaction_on(initial: list[tuple[bytes, bytes]]) -> tuple[MemoryKV, list[tuple[bytes, bytes]], JournalKV]:
    """A store holding ``initial``, its contents, and a transaction's journal begun over it."""
    inner = MemoryKV()
    for k, v in initial:
        inner.put(k, v)
    txn = JournalKV(inner, keys_max=1_000, overflow_raises=False)
    txn.begin()
    return inner, _contents(inner), txn


def _run(kv: JournalKV, script: list[tuple]) -> None:
    for op in script:
        if op[0] == "get":
            kv.get(op[1])
        elif op[0] == "put":
            kv.put(op[1], op[2])
        else:
            kv.delete(op[1])


@given(st.lists(st.tuples(keys, st.binary(max_size=3)), max_size=4), st.lists(st.tuples(ops, st.booleans()), max_size=5))
@settings(max_examples=300, deadline=None)
def test_a_transactions_journal_under_record_savepoints_takes_the_whole_transaction_back(
        initial: list[tuple[bytes, bytes]], records: list[tuple[list[tuple], bool]]) -> None:
    """Issue 51: the transaction's journal (outer) under each record's savepoint (inner,
    kept or taken back): a rollback of the transaction restores the store as at its begin."""
    inner, at_begin, txn = _transaction_on(initial)
    for script, keep in records:
        record = JournalKV(txn)
        before = _contents(inner)
        record.begin()
        _run(record, script)
        if keep:
            record.release()
        else:
            record.rollback()
            assert _contents(inner) == before
    txn.rollback()
    assert _contents(inner) == at_begin


def test_a_transactions_journal_past_its_bound_stops_and_says_so() -> None:
    inner = MemoryKV()
    txn = JournalKV(inner, keys_max=3, overflow_raises=False)
    txn.begin()
    for k in (b"a", b"b", b"c", b"d"):
        txn.put(k, b"1")  # no RecordTooLarge: the fourth key overflows the journal
    assert txn.overflowed and not txn.open
    assert inner.get(b"d") == b"1"  # the write itself went through
    txn.begin()
    assert not txn.overflowed and txn.open  # the next transaction is journaled again


@given(st.lists(st.tuples(keys, st.binary(max_size=3)), max_size=4), ops,
       st.lists(st.tuples(ops, st.booleans()), max_size=5))
@settings(max_examples=300, deadline=None)
def test_a_transactions_journal_that_absorbs_kept_savepoints_takes_the_whole_transaction_back(
        initial: list[tuple[bytes, bytes]], direct: list[tuple], records: list[tuple[list[tuple], bool]]) -> None:
    """As ``PartitionTask.savepoint`` does it: a record's savepoint writes past the
    transaction's journal, which absorbs the priors of what was kept; writes outside any
    savepoint go through the transaction's journal itself."""
    inner, at_begin, txn = _transaction_on(initial)
    _run(txn, direct)
    for script, keep in records:
        record = JournalKV(inner)
        record.begin()
        _run(record, script)
        if not keep:
            record.rollback()
        kept = record.release()
        if kept:
            txn.absorb(kept)
    txn.rollback()
    assert _contents(inner) == at_begin
