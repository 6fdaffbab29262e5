"""How much of an attempt's output becomes log records.

Each line an attempt prints is one record on ``gnomon.run-logs`` and one history row
kept for days, so the output cap in bytes (``SandboxLimits.output_max_bytes``) is not
enough: 8 MiB of newlines made 8.4 million records from one attempt. A ``LogBudget``
lets the first ``lines_max`` lines and ``bytes_max`` bytes through and counts the rest,
which are dropped; the worker then writes one marker line saying how much was cut.
The worker's own lines (``LogStream.SYSTEM``: started, refused, exit code...) are few
and always pass.
"""

from __future__ import annotations

from dataclasses import dataclass

LOG_LINES_MAX = 10_000
"""Per attempt, by default: a report's worth of lines; more belongs in a file or a store."""
LOG_BYTES_MAX = 4 * 1024 * 1024


@dataclass
class LogBudget:
    """One attempt's allowance (not thread-safe: the worker takes it under the attempt's lock)."""

    lines_max: int = LOG_LINES_MAX
    bytes_max: int = LOG_BYTES_MAX
    lines: int = 0
    bytes: int = 0
    cut_lines: int = 0
    cut_bytes: int = 0

    def __post_init__(self) -> None:
        if self.lines_max < 1 or self.bytes_max < 1:
            raise ValueError("lines_max and bytes_max must be >= 1")

    def take(self, line: str) -> bool:
        """Account one line; False: it is past the budget and must not be logged."""
        size = len(line.encode("utf-8", "replace"))
        if self.cut_lines or self.lines >= self.lines_max or self.bytes + size > self.bytes_max:
            self.cut_lines += 1
            self.cut_bytes += size
            return False
        self.lines += 1
        self.bytes += size
        return True

    def marker(self) -> str | None:
        """The line that says what was cut, or None if nothing was."""
        if not self.cut_lines:
            return None
        return (f"output cut: {self.cut_lines} more line(s), {self.cut_bytes} byte(s), not logged "
                f"(this worker logs at most {self.lines_max} lines or {self.bytes_max} bytes per attempt)")
