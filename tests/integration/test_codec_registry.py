"""An older release's codec reads a newer schema id through the schema registry that
`gnomon infra up` starts, as the long-running processes install it
(``gnomon.codec.remote.install_registry_source``: ``Settings.registry_url`` and the
registry's read-only user from the credentials directory). The same against the
registry's app in-process: tests/unit/test_codec_remote.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gnomon.codec import Codec, DecodeError, default_codec
from gnomon.codec.registry import load_registry
from gnomon.codec.remote import FETCH_UNKNOWN_ENV, install_registry_source
from gnomon.config import Settings
from gnomon.core.jobs import JobState, JobStatus
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.infra import registry

pytestmark = pytest.mark.integration

SUBJECT = "gnomon.jobs-value"
TOPIC = "gnomon.jobs"
NEWEST = default_codec.registry.latest(SUBJECT)
STATE = JobState("j1", "t1", JobSpec("j1", Schedule(cron="* * * * *"), Target(TargetType.HTTP, url="http://x")),
                 JobStatus.ACTIVE, 60_000, 3, 1_000, 2_000)


def _older_codec(tmp_path: Path) -> Codec:
    """A codec without the newest version of SUBJECT (an older release's)."""
    directory = tmp_path / "avro"
    shutil.copytree(default_codec.registry.directory, directory)
    doc = json.loads((directory / "registry.json").read_text())
    del doc["schemas"][str(NEWEST.id)]
    (directory / "registry.json").write_text(json.dumps(doc))
    return Codec(load_registry(directory))


def test_an_older_codec_reads_a_newer_id_through_the_stacks_registry(
        infra: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert registry.status(infra)["state"] == "up"
    monkeypatch.delenv(FETCH_UNKNOWN_ENV, raising=False)
    monkeypatch.setenv("GNOMON_REGISTRY_URL", registry.url(infra))  # the port it runs on
    older = _older_codec(tmp_path)
    newer_bytes = default_codec.encode(STATE, TOPIC)
    with pytest.raises(DecodeError, match=rf"unknown schema id {NEWEST.id}$"):
        older.decode(newer_bytes)
    source = install_registry_source(infra, older)
    assert source is not None and source.auth is not None  # the reader user `infra up` wrote
    assert older.decode(newer_bytes, TOPIC) == STATE
    with pytest.raises(DecodeError, match="unknown schema id 999999: not in the schema registry either"):
        older.decode(b"\x00" + (999_999).to_bytes(4, "big") + b"\x00")
