"""The RocksDB adapter writes without RocksDB's write-ahead log (a store is trusted only
after a clean close; a crash rebuilds it from the changelogs), so ``close`` must flush
what the memtables hold: a clean close and reopen keeps every write."""

from __future__ import annotations

from pathlib import Path

from gnomon.adapters.kv import RocksKV


def test_writes_skip_the_write_ahead_log_and_survive_a_clean_close(tmp_path: Path) -> None:
    kv = RocksKV(tmp_path / "db")
    for i in range(2_000):
        kv.put(b"k%05d" % i, b"v" * 100)
    kv.delete(b"k00007")
    wal = sum(f.stat().st_size for f in (tmp_path / "db").glob("*.log"))
    assert wal == 0, f"{wal} bytes of write-ahead log"
    kv.close()
    again = RocksKV(tmp_path / "db")
    assert again.get(b"k01999") == b"v" * 100 and again.get(b"k00007") is None
    assert sum(1 for _ in again.scan(b"k", b"l", 10_000)) == 1_999
    again.close()
