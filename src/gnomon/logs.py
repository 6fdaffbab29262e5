"""How gnomon's processes write their logs: one record, one line.

Log messages carry text a tenant wrote (a cancel reason, a job name, a handler's error):
a line feed in it would start a forged line ("... CRITICAL gnomon.worker: ..."), and a
bidi or terminal control character would rewrite what an operator reads. The formatter
escapes every control and bidi character of the message (``\\n``, ``\\x1b``, ``\\u202e``);
a traceback, written by gnomon itself, keeps its lines."""

from __future__ import annotations

import logging
import re

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(text: str) -> str:
    """``text`` with every control and bidi character escaped, so it prints on one line as
    itself."""
    return _CONTROL_RE.sub(lambda m: _NAMED.get(m.group(), f"\\u{ord(m.group()):04x}"), text)


class OneLineFormatter(logging.Formatter):
    """A ``logging.Formatter`` whose message part is always one line (``one_line``)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message)
        return super().formatMessage(record)


def configure(level: int, fmt: str = FORMAT) -> None:
    """The root logger writes to standard error through ``OneLineFormatter``."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
