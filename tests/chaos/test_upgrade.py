"""A rolling upgrade on three hosts, from a wheel of an earlier commit to this tree and
back (issue 26), outside CI: ``make test-long`` runs it (about 6 minutes on 2 cores),
``GNOMON_UPGRADE_FROM=<commit>`` picks the earlier version (default: 44c9bbf, the last
commit that passed CI before the host-fault fixes; it writes the same schema versions).

Across a schema change it fails, and says so: from 56c5e18 (before the job state's v11)
the earlier processors' standbys and the earlier projector cannot decode the v11 records
the upgraded processors write ("unknown schema id 120": a reader knows only the schema
ids packaged with it), skip them, and a partition an earlier processor takes over
stops ticking. docs/operations.md, "Upgrades", says how to roll such a release.

On ``gnomon infra up --hosts 3 --tls`` (this tree's infra), every gnomon process starts
on the earlier version: a wheel built from ``git archive <commit>``, installed into a
directory of its own and put first on ``PYTHONPATH``. Under 12 per-second jobs, each
host's processes are stopped as a service manager would (SIGTERM) and started on this
tree's code, one host at a time, with a pause between hosts while both versions run
together; then back to the earlier version the same way. The history checker accounts
for every slot once, every finished run is in history, the API (host 1, restarted with
it, so refused for a few seconds twice) answers at least 80 % of the once-a-second reads
made through it all, and the start lag is reported per step."""

from __future__ import annotations

import io
import os
import secrets
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from chaoslib import LONG, Scenario, log
from test_hosts import (  # noqa: F401 - `cluster` is the module fixture the test uses
    ApiPoller,
    Cluster,
    _assert_whole,
    _group,
    _load,
    _pause_and_check,
    _report,
    _start_api,
    cluster,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.own_brokers]

REPO = Path(__file__).resolve().parents[2]
UPGRADE_FROM = os.environ.get("GNOMON_UPGRADE_FROM", "44c9bbf")
SOURCES = ("pyproject.toml", "README.md", "src", "schemas", "streams")  # what the wheel is built from
BOTH_S = 20 if LONG else 12  # both versions running together, after each host's restart
PIP_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def earlier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The earlier commit's gnomon, installed into a directory for ``PYTHONPATH``."""
    root = tmp_path_factory.mktemp("earlier")
    tree = root / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", UPGRADE_FROM, *SOURCES],
                             capture_output=True, check=True, timeout=60).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="tar")
    dist, site = root / "dist", root / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(tree)],
                          capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = dist.glob("gnomon-*.whl")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                           str(wheel)], capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    where = subprocess.run([sys.executable, "-c", "import gnomon.processor.runtime as r; print(r.__file__)"],
                           env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                           check=True, timeout=60).stdout.strip()
    assert where.startswith(str(site)), f"the earlier version is not what Python imports: {where}"
    log(f"the earlier version: {UPGRADE_FROM} ({wheel.name}) in {site}")
    return site


def _host(sc: Scenario, cl: Cluster, h: int, env: Mapping[str, str] | None) -> list[str]:
    """Stop host ``h``'s gnomon processes and start them on the code ``env`` says."""
    names = [f"p{h}", f"w{h}", *(["projector", "api"] if h == 1 else [])]
    for name in names:
        sc.stop(name)
    sc.processor(f"p{h}", group=_group(cl, h), env=env)
    sc.worker(f"w{h}", group=_group(cl, h), env=env)
    if h == 1:
        sc.start("projector", "projector", group=_group(cl, 1), env=env)
        _start_api(sc, cl, group=_group(cl, 1), env=env)
    sc.wait_ready(*names, timeout_s=120)
    return names


def test_a_rolling_upgrade_from_an_earlier_wheel_and_back(tmp_path: Path, cluster: Cluster,  # noqa: F811
                                                           earlier: Path) -> None:
    old = {"PYTHONPATH": str(earlier)}
    tag = "upg" + secrets.token_hex(3)
    sc = Scenario(tag, tmp_path)
    poller: ApiPoller | None = None
    steps: list[tuple[str, int]] = []
    try:
        url, ids = _load(sc, cluster, tag, env=old)
        poller = ApiPoller(url, cluster.token, ids[0])
        began = int(time.time() * 1000)
        for phase, env in (("upgraded", None), ("downgraded", old)):
            for h in (1, 2, 3):
                at = int(time.time() * 1000)
                _host(sc, cluster, h, env)
                steps.append((f"host {h} {phase}", at))
                log(f"host {h} {phase} ({'earlier' if env else 'this'} version) in {time.time() - at / 1000:.0f} s; "
                    "both versions run")
                time.sleep(BOTH_S)
        out = _pause_and_check(sc, ids, poller)
    finally:
        if poller is not None:
            poller.stop()
        sc.stop_all()
    for what, at in steps:
        log(f"  {what} at +{(at - began) / 1000:.0f} s")
    lags = _report(cluster.settings, 0, set(), ids, began, out, poller.statuses)
    # (no faulty host: every job is "elsewhere"; host 1's API is restarted twice, ~10 s each)
    _assert_whole(out, lags, poller.statuses, 12 * 6 * BOTH_S, kinds=(False,), answers_min=100, answered=0.8)
