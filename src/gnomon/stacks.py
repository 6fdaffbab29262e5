"""Every gnomon process writes its threads' stacks to stderr (its log) on SIGUSR1 and goes
on: where a process that went silent, or a request that hangs, waits."""

from __future__ import annotations

import faulthandler
import io
import logging
import signal
import sys


def dump_on_sigusr1() -> None:
    """Register the dump; a stderr with no file descriptor (a test's) gets none."""
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, io.UnsupportedOperation):
        logging.getLogger("gnomon.stacks").debug("no stack dump on SIGUSR1: stderr has no file descriptor")
