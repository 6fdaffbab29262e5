"""Retry strategy: exponential backoff with full jitter, deterministic.

Jitter comes from a hash of (run_id, attempt), not a random generator, so a replay of
the same events makes the same decision (the core has no randomness).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from gnomon.core.model import RetryPolicy


def unit_hash(*parts: str) -> float:
    """A stable number in [0, 1) from the given strings."""
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class BackoffStrategy:
    policy: RetryPolicy

    def should_retry(self, attempt: int) -> bool:
        """``attempt`` is the 1-based number of the attempt that just failed."""
        return attempt < self.policy.max_attempts

    def delay_ms(self, run_id: str, attempt: int) -> int:
        """Full jitter: uniform in [0, min(cap, base * 2**(attempt-1))]."""
        ceiling_s = min(self.policy.backoff_cap_s, self.policy.backoff_base_s * 2 ** min(attempt - 1, 30))
        return int(ceiling_s * 1000 * unit_hash(run_id, str(attempt)))
