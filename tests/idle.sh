#!/usr/bin/env bash
# Run a command at idle priority: tests/idle.sh CMD [ARGS...]
# `nice` alone is not enough where the kernel groups tasks by session (autogroup, the
# default on Linux desktops and many servers): each session's group gets an equal share
# of the CPU whatever its tasks' nice. So the command gets a session of its own (setsid)
# whose group is niced to 19 too. Used by `make test` for the simulation's seed sweeps,
# which run beside the real-stack suites on the cores those leave idle.
set -uo pipefail
exec setsid --wait bash -c 'echo 19 > /proc/self/autogroup 2>/dev/null; exec nice -n 19 "$@"' idle "$@"
