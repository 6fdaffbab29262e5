#!/usr/bin/env bash
# The sandbox suite again, as a worker that is not root (issue 24, finding 8): a test user
# with subordinate uid/gid ranges (/etc/subuid, /etc/subgid) runs tests/security/test_sandbox.py,
# which then asserts that each attempt runs as a host uid of its own from that range
# (GNOMON_EXPECT_SUBUIDS=1 makes a host that cannot do it a failure, not a pass).
#
# Run as root (CI is): it makes the user `gnomon-nonroot` (once) with a range, copies the
# sources, the tests and the venv's packages to a world-readable directory (the checkout
# and the venv's interpreter may sit under 0700 directories the user cannot enter) and
# runs pytest there with the system's Python of the venv's version. Not root: the suite
# already ran as this user (`make test-security`); nothing to do.
#
#   tests/nonroot.sh                       the sandbox suite (make test-nonroot)
#   tests/nonroot.sh bench/sandbox_starts.py --attempts 200 --container-attempts 0
#                                          a script instead, as that user
set -euo pipefail
cd "$(dirname "$0")/.."
USER_NAME=gnomon-nonroot
RANGE_START=400000
RANGE_COUNT=65536

if [ "$(id -u)" != 0 ]; then
  echo "gnomon: not root: the sandbox suite already ran as uid $(id -u)"
  exit 0
fi
for tool in newuidmap newgidmap useradd usermod runuser; do
  command -v "$tool" >/dev/null || { echo "gnomon: $tool is missing (make sysdeps installs uidmap)"; exit 1; }
done
if ! id "$USER_NAME" >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$USER_NAME"
fi
if ! grep -q "^$USER_NAME:" /etc/subuid 2>/dev/null; then
  usermod --add-subuids "$RANGE_START-$((RANGE_START + RANGE_COUNT - 1))" "$USER_NAME"
fi
if ! grep -q "^$USER_NAME:" /etc/subgid 2>/dev/null; then
  usermod --add-subgids "$RANGE_START-$((RANGE_START + RANGE_COUNT - 1))" "$USER_NAME"
fi

venv_py=.venv/bin/python
version=$($venv_py -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
site=$($venv_py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python=""
for candidate in "$(readlink -f "$venv_py")" "/usr/bin/python$version"; do
  if [ -x "$candidate" ] && runuser -u "$USER_NAME" -- "$candidate" -c pass 2>/dev/null; then
    python=$candidate
    break
  fi
done
[ -n "$python" ] || { echo "gnomon: no Python $version that $USER_NAME may run (apt-get install python$version)"; exit 1; }

work=$(mktemp -d /var/tmp/gnomon-nonroot.XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 0755 "$work"
cp -a src tests bench streams schemas pyproject.toml "$work/"  # (src/gnomon/_data links to streams/ and schemas/)
cp -a "$site" "$work/site"
chmod -R go+rX,go-w "$work"
chown "$USER_NAME" "$work"  # its own scratch space (the tests write .gnomon/ and state/ there)
echo "gnomon: the sandbox suite as $USER_NAME (uid $(id -u "$USER_NAME"), subordinate ids" \
     "$(grep "^$USER_NAME:" /etc/subuid | cut -d: -f2-)) with $python"
if [ $# -gt 0 ]; then args=("$@"); else args=(-q -p no:cacheprovider -p no:randomly tests/security/test_sandbox.py); fi
cd "$work"
runuser -u "$USER_NAME" -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$work" LANG=C.UTF-8 \
  GNOMON_EXPECT_SUBUIDS=1 GNOMON_STATE_DIR="$work/state" PYTHONPATH="$work/src:$work/site" "$python" -c '
import runpy, site, sys
sys.path.insert(0, sys.argv[1] + "/src")
site.addsitedir(sys.argv[1] + "/site")
args = sys.argv[2:]
if args[0].endswith(".py"):  # a script (a bench), with its arguments
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")
else:
    import pytest
    sys.exit(pytest.main(args))
' "$work" "${args[@]}"
