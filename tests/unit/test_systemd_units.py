"""The systemd units of infra/systemd (docs/deploy.md; issue 26): each passes
``systemd-analyze verify`` (with ExecStart pointing at this checkout's gnomon instead of
/opt/gnomon), runs a gnomon command that exists with options it accepts, restarts
always, has resource limits, and the example environment file names only variables
gnomon (or the units' own command lines) read."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "infra" / "systemd"
GNOMON = Path(sys.executable).parent / "gnomon"
SERVICES = sorted(UNITS.glob("*.service"))


def _verify(tmp_path: Path, unit: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail("systemd-analyze is missing: `make testdeps` (as root) installs Debian's systemd")
    text = unit.read_text().replace("/opt/gnomon/bin/gnomon", str(GNOMON))
    name = unit.name.replace("@.", "@test.")  # an instance of a template (verify needs one)
    (tmp_path / name).write_text(text)
    (tmp_path / "gnomon.target").write_text((UNITS / "gnomon.target").read_text())
    return subprocess.run([exe, "verify", "--man=no", str(tmp_path / name)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)


def test_there_is_a_unit_for_every_long_running_process() -> None:
    kinds = {re.sub(r"@?\.service$", "", u.name).removeprefix("gnomon-") for u in SERVICES}
    assert kinds == {"processor", "worker", "projector", "alerter", "api"}, kinds
    assert (UNITS / "gnomon.target").exists()


@pytest.mark.parametrize("unit", [*SERVICES, UNITS / "gnomon.target"], ids=lambda p: p.name)
def test_systemd_analyze_verify_passes(tmp_path: Path, unit: Path) -> None:
    res = _verify(tmp_path, unit)
    assert res.returncode == 0 and unit.name.split("@")[0] not in res.stderr, res.stderr


@pytest.mark.parametrize("unit", SERVICES, ids=lambda p: p.name)
def test_each_unit_restarts_has_limits_and_runs_a_real_command(unit: Path) -> None:
    text = unit.read_text()
    keys = dict(re.findall(r"^(\w+)=(.*)$", text, re.M))
    assert keys["Restart"] == "always" and keys["StartLimitIntervalSec"] == "0", unit.name
    for limit in ("LimitNOFILE", "MemoryMax", "TasksMax"):
        assert limit in keys, f"{unit.name} has no {limit}"
    assert keys["User"] == "gnomon" and "/etc/gnomon/gnomon.env" in text
    argv = shlex.split(keys["ExecStart"])
    assert argv[0] == "/opt/gnomon/bin/gnomon"
    # the command and every option it passes exist (values: placeholders of systemd)
    kind, opts = argv[1], [a for a in argv[2:] if a.startswith("--")]
    helped = subprocess.run([str(GNOMON), kind, "--help"], capture_output=True, text=True, timeout=60,
                            env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert helped.returncode == 0, helped.stderr
    for opt in opts:
        assert opt in helped.stdout, f"{unit.name}: gnomon {kind} has no {opt}"


def test_the_example_environment_names_only_what_gnomon_reads() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "src" / "gnomon").rglob("*.py"))
    units = "\n".join(u.read_text() for u in SERVICES)
    names = re.findall(r"^(GNOMON_[A-Z_]+)=", (UNITS / "gnomon.env").read_text(), re.M)
    assert len(names) >= 10
    for name in names:
        assert f'"{name}"' in source or "${" + name + "}" in units, f"nothing reads {name}"
