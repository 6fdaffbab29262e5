"""The sandbox's default seccomp filter: a classic BPF program bubblewrap loads
(``bwrap --seccomp FD``) right before it runs the command.

A command in the sandbox runs as nobody in its own namespaces, but every system call of
the host kernel was reachable, the kernel's least-trodden ones included (io_uring, keyrings,
BPF, perf events, userfaultfd: the usual local-privilege-escalation surface). The filter
answers ``EPERM`` to the calls in ``DENIED`` and to every x32 call, and allows the rest;
a call made through another ABI than the host's (32-bit ``int 0x80`` on x86-64) kills the
process.

Written here, not with libseccomp: the program is a few dozen instructions, built from
the table below, and the test suite checks the numbers against the kernel headers and
runs each call inside the sandbox. Only x86-64 has a table; on another architecture
``program()`` is None and the worker says at start that commands run unfiltered.
"""

from __future__ import annotations

import errno
import platform
import struct

# linux/filter.h and linux/seccomp.h
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_NR_OFFSET = 0  # struct seccomp_data: int nr; __u32 arch; ...
_ARCH_OFFSET = 4
_X32_BIT = 0x40000000

AUDIT_ARCH_X86_64 = 0xC000003E

DENIED: dict[str, dict[str, int]] = {
    # name -> number, x86-64 (asm/unistd_64.h)
    "x86_64": {
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "keyctl": 250, "add_key": 248, "request_key": 249,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "mount": 165, "umount2": 166, "pivot_root": 155, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "unshare": 272, "setns": 308,
        "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163,
        "quotactl": 179, "syslog": 103, "vhangup": 153, "lookup_dcookie": 212,
        "open_by_handle_at": 304,
    },
}
_AUDIT_ARCH = {"x86_64": AUDIT_ARCH_X86_64}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this host's) as ``struct sock_filter`` bytes,
    or None where no table exists."""
    machine = machine or platform.machine()
    denied = DENIED.get(machine)
    if denied is None:
        return None
    numbers = sorted(set(denied.values()))
    # layout: 0 ld arch; 1 jeq arch; 2 kill; 3 ld nr; 4 jge x32; 5.. jeq each; allow; deny
    n = len(numbers)
    allow_at = 5 + n
    deny_at = allow_at + 1
    out = [
        _insn(_LD_W_ABS, 0, 0, _ARCH_OFFSET),
        _insn(_JEQ_K, 1, 0, _AUDIT_ARCH[machine]),  # the host's ABI: on (skip the kill)
        _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, _NR_OFFSET),
        _insn(_JGE_K, deny_at - 5, 0, _X32_BIT),  # x32 numbers: refused
    ]
    for i, nr in enumerate(numbers):
        at = 5 + i
        out.append(_insn(_JEQ_K, deny_at - (at + 1), 0, nr))
    out.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
    out.append(_insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM))
    assert len(out) == deny_at + 1 and all(deny_at - (5 + i + 1) <= 255 for i in range(n))
    return b"".join(out)
