"""`gnomon dev`'s supervisor with fake children and a fake clock: an exited child is
started again after a backoff that doubles up to a cap, goes back to the start once
the child ran long enough, and every restart is said."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gnomon.cli.supervisor import Supervisor


class FakeChild:
    pids = 100

    def __init__(self, name: str) -> None:
        FakeChild.pids += 1
        self.pid = FakeChild.pids
        self.name = name
        self.code: int | None = None
        self.terminated = False

    def poll(self) -> int | None:
        return self.code

    def terminate(self) -> None:
        self.terminated = True
        self.code = -15

    def kill(self) -> None:
        self.code = -9

    def wait(self, timeout: float | None = None) -> int:
        assert self.code is not None
        return self.code


class Env:
    def __init__(self) -> None:
        self.t = 0.0
        self.spawned: list[FakeChild] = []
        self.said: list[str] = []

    def spawn(self, name: str, _args: Sequence[str]) -> FakeChild:
        self.spawned.append(FakeChild(name))
        return self.spawned[-1]

    def now(self) -> float:
        return self.t


def make() -> tuple[Env, Supervisor]:
    env = Env()
    sup = Supervisor(env.spawn, env.now, backoff_s=1, backoff_max_s=8, stable_s=60, say=env.said.append)
    return env, sup


def crash_and_restart(env: Env, sup: Supervisor) -> float:
    """Let the latest child exit; how long until it was started again."""
    env.spawned[-1].code = 75
    sup.tick()
    exited_at, n = env.t, len(env.spawned)
    while len(env.spawned) == n:
        env.t += 0.5
        sup.tick()
        assert env.t - exited_at < 1000
    return env.t - exited_at


def test_an_exited_child_is_restarted_with_a_doubling_capped_backoff() -> None:
    env, sup = make()
    sup.start("processor", ["processor"])
    waits = [crash_and_restart(env, sup) for _ in range(6)]
    assert waits == [1, 2, 4, 8, 8, 8]
    assert sup.children["processor"].restarts == 6
    assert any("processor exited with code 75" in s and "restarting it in 2 s" in s for s in env.said)
    assert any("processor restarted (restart 6" in s for s in env.said)


def test_the_backoff_starts_again_after_a_stable_run() -> None:
    env, sup = make()
    sup.start("worker", ["worker"])
    assert [crash_and_restart(env, sup) for _ in range(3)] == [1, 2, 4]
    env.t += 61  # ran well for a while
    assert crash_and_restart(env, sup) == 1


def test_a_running_child_is_left_alone_and_the_others_are_not_touched() -> None:
    env, sup = make()
    sup.start("a", ["a"])
    sup.start("b", ["b"])
    env.spawned[0].code = 1
    for _ in range(10):
        env.t += 0.5
        sup.tick()
    assert [c.name for c in env.spawned] == ["a", "b", "a"]
    assert env.spawned[1].code is None


def test_stop_all_terminates_the_running_children_and_restarts_nothing() -> None:
    env, sup = make()
    sup.start("a", ["a"])
    sup.start("b", ["b"])
    env.spawned[0].code = 1
    sup.tick()
    sup.stop_all(1)
    assert env.spawned[1].terminated
    for _ in range(3):
        env.t += 100
        sup.tick()
    assert len(env.spawned) == 2


def test_the_backoff_must_be_sane() -> None:
    env = Env()
    with pytest.raises(ValueError):
        Supervisor(env.spawn, env.now, backoff_s=10, backoff_max_s=1)
