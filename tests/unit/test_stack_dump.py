"""A processor or worker that went silent can be asked where it waits: SIGUSR1 writes
every thread's stack to its stderr (its log), and the process goes on; SIGTERM still
stops it cleanly afterwards."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

CHILD = """
import threading, time
from gnomon.cli.services import _stop_on_signals
stop = threading.Event()
_stop_on_signals(stop)
def waits_here():
    print("ready", flush=True)  # (from inside: the dump must find this frame)
    while not stop.is_set():
        time.sleep(0.05)
waits_here()
print("stopped cleanly", flush=True)
"""


def test_sigusr1_dumps_every_threads_stack_and_the_process_goes_on() -> None:
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        assert p.poll() is None, "SIGUSR1 killed the process"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    assert "stopped cleanly" in out
    assert "Current thread" in err or "Thread 0x" in err, err
    assert "waits_here" in err, err
