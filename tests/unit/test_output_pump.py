"""The output pump of command and container targets: past the output cap it stops
logging but keeps reading, so a child writing into the pipe is never left blocked on it
(`podman run` blocked so kept a capped container attempt alive until the 30 s kill
timeout)."""

from __future__ import annotations

import subprocess
import sys
import threading

from gnomon.worker.command import OutputMeter, pump_lines

MIB = 1024 * 1024


def _flood(n_bytes: int, newlines: bool) -> subprocess.Popen[bytes]:
    chunk = "('x' * 1023 + '\\n')" if newlines else "('x' * 1024)"
    code = f"import sys\nfor _ in range({n_bytes // 1024}): sys.stdout.write({chunk})\n"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


def _pump(proc: subprocess.Popen[bytes], meter: OutputMeter) -> tuple[list[str], threading.Thread]:
    lines: list[str] = []
    assert proc.stdout is not None
    t = threading.Thread(target=pump_lines, args=(proc.stdout, lines.append, meter), daemon=True)
    t.start()
    return lines, t


def test_past_the_cap_the_writer_is_drained_to_its_end_not_left_blocked() -> None:
    proc = _flood(8 * MIB, newlines=True)  # far more than a pipe holds
    meter = OutputMeter(1 * MIB)
    lines, t = _pump(proc, meter)
    assert proc.wait(timeout=30) == 0, "the writer finished: nothing stopped reading its pipe"
    t.join(10)
    assert not t.is_alive()
    assert meter.exceeded.is_set()
    assert sum(len(line) + 1 for line in lines) <= 1 * MIB, "nothing past the cap is logged"


def test_under_the_cap_every_line_is_emitted() -> None:
    proc = _flood(64 * 1024, newlines=True)
    meter = OutputMeter(1 * MIB)
    lines, t = _pump(proc, meter)
    assert proc.wait(timeout=30) == 0
    t.join(10)
    assert len(lines) == 64 and not meter.exceeded.is_set()


def test_a_newline_less_flood_is_cut_and_drained() -> None:
    proc = _flood(4 * MIB, newlines=False)
    meter = OutputMeter(256 * 1024)
    lines, t = _pump(proc, meter)
    assert proc.wait(timeout=30) == 0
    t.join(10)
    assert meter.exceeded.is_set() and len(lines) <= 1
