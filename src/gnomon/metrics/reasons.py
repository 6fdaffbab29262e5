"""Bounded label values from free-form texts (pure): a skip reason names runs and
policies in words ("overlap: job_1@... is still running"), a label must not."""

from __future__ import annotations

SKIP_REASONS = ("paused", "deleted", "schedule_changed", "overlap", "catch_up", "overload", "other")


def skip_reason(reason: str | None) -> str:
    """The label for a skipped run's ``reason`` (one of ``SKIP_REASONS``)."""
    text = (reason or "").lower()
    if text.startswith("overlap"):
        return "overlap"
    if text.startswith("catch-up"):
        return "catch_up"
    if text == "overload":
        return "overload"
    if "paused" in text:
        return "paused"
    if "deleted" in text:
        return "deleted"
    if "schedule changed" in text:
        return "schedule_changed"
    return "other"


def expiry_kind(reason: str | None) -> str | None:
    """"lease" or "deadline" when the processor ended an attempt itself (core.runs:
    "lease lost (no heartbeat)", "deadline passed (timeout + grace)"), else None."""
    text = reason or ""
    if text.startswith("lease lost"):
        return "lease"
    if text.startswith("deadline passed"):
        return "deadline"
    return None
