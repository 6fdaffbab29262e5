"""`make run`'s demo registers its dependency only once the upstream job is in history
(the API checks an upstream there: after a long restore or a projector backlog the
upstream, accepted, was not there yet and the dependency was refused with 422)."""

from __future__ import annotations

from typing import Any

import pytest

from gnomon.client import ApiError
from gnomon.demo import run


class _Client:
    def __init__(self, misses: int, status: int = 404) -> None:
        self.misses, self.status, self.asked = misses, status, 0

    def get_job(self, job_id: str) -> dict[str, Any]:
        self.asked += 1
        if self.asked <= self.misses:
            raise ApiError(self.status, {"detail": f"no job {job_id}"})
        return {"id": job_id}


def test_it_waits_until_history_shows_the_upstream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run.time, "sleep", lambda _s: None)
    client = _Client(misses=3)
    run._wait_visible(client, "job_a")  # type: ignore[arg-type]
    assert client.asked == 4


def test_it_gives_up_with_one_line_and_other_errors_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run.time, "sleep", lambda _s: None)
    with pytest.raises(SystemExit, match="job job_a was not in history after 0 s"):
        run._wait_visible(_Client(misses=10**9), "job_a", timeout_s=0)  # type: ignore[arg-type]
    with pytest.raises(ApiError):
        run._wait_visible(_Client(misses=1, status=503), "job_a")  # type: ignore[arg-type]
