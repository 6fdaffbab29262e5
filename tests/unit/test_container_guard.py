"""The container guard's watch loop (gnomon.worker.container_guard): what ends it, over a
real pipe; the guard's removal on real podman is in tests/security/test_containers.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from gnomon.worker import container_guard as guard


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    return r, w


def test_quit_ends_the_watch_without_acting() -> None:
    r, w = _pipe()
    os.write(w, b"hhq")
    assert guard.watch(r, 5.0) == "quit"
    os.close(r)
    os.close(w)


def test_a_closed_pipe_is_a_dead_worker() -> None:
    r, w = _pipe()
    os.write(w, b"h")
    os.close(w)
    assert guard.watch(r, 5.0) == "eof"
    os.close(r)


def test_renewals_keep_it_waiting_and_silence_ends_it() -> None:
    r, w = _pipe()
    stop = threading.Event()

    def renew() -> None:
        for _ in range(6):  # 0.6 s of renewals, each well inside the 0.3 s silence
            os.write(w, b"h")
            time.sleep(0.1)
        stop.set()

    t = threading.Thread(target=renew)
    started = time.monotonic()
    t.start()
    assert guard.watch(r, 0.3) == "silent"
    took = time.monotonic() - started
    t.join()
    assert stop.is_set() and took >= 0.6, took  # not before the renewals stopped
    os.close(r)
    os.close(w)


def test_the_script_refuses_bad_arguments_and_quits_on_q() -> None:
    bad = subprocess.run([sys.executable, "-I", str(guard.__file__), "podman"], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 2 and "usage" in bad.stderr
    ok = subprocess.run([sys.executable, "-I", str(guard.__file__), "/nonexistent/podman", "/x", "c", "5"],
                        input=b"hq", capture_output=True, timeout=30)
    assert ok.returncode == 0 and ok.stderr == b""  # quit: no removal tried
    gone = subprocess.run([sys.executable, "-I", str(guard.__file__), "/nonexistent/podman", "/x", "c", "5"],
                          input=b"h", capture_output=True, timeout=30)
    assert gone.returncode == 1 and b"cannot remove c (eof)" in gone.stderr  # tried, and said why it could not
