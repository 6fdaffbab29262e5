"""The jobs page's filters, applied to a page of job views (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

STATUSES = ("active", "paused")
TARGETS = ("command", "http", "handler", "container")
QUERY_MAX_CHARS = 200


@dataclass(frozen=True)
class JobFilter:
    text: str = ""  # a substring of the name or the id, any case
    status: str = ""  # "" or one of STATUSES
    target: str = ""  # "" or one of TARGETS
    pool: str = ""

    @staticmethod
    def of(params: Mapping[str, str]) -> JobFilter:
        """From query parameters; unknown values are dropped rather than refused."""
        status = params.get("status", "")
        target = params.get("target", "")
        return JobFilter(text=params.get("q", "").strip()[:QUERY_MAX_CHARS],
                         status=status if status in STATUSES else "",
                         target=target if target in TARGETS else "",
                         pool=params.get("pool", "").strip()[:64])

    @property
    def active(self) -> bool:
        return bool(self.text or self.status or self.target or self.pool)

    def keeps(self, job: Mapping[str, Any]) -> bool:
        if self.text:
            needle = self.text.lower()
            if needle not in str(job.get("name", "")).lower() and needle not in str(job.get("id", "")).lower():
                return False
        if self.status and job.get("status") != self.status:
            return False
        target = job.get("target") or {}
        if self.target and target.get("type") != self.target:
            return False
        return not (self.pool and job.get("pool", "default") != self.pool)

    def apply(self, jobs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return [j for j in jobs if self.keeps(j)]
