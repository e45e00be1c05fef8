"""Token buckets for the tenants' rate limits: requests/s and input tokens/min.

Requests are taken before the request runs. Input tokens are known only once the model has tokenized
them, so they are charged after the answer and may overdraw the bucket once; a tenant in debt is refused
until the bucket refills past zero. With ``n`` ingress replicas each replica enforces ``1/n`` of a limit
(``docs/security.md`` says what that costs in precision).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    rate: float  # refill per second
    capacity: float
    level: float
    updated: float  # monotonic seconds of the last refill

    @staticmethod
    def full(rate: float, capacity: float, now: float) -> TokenBucket:
        return TokenBucket(rate, capacity, capacity, now)

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def try_take(self, amount: float, now: float) -> bool:
        self._refill(now)
        if self.level >= amount:
            self.level -= amount
            return True
        return False

    def has_credit(self, now: float) -> bool:
        self._refill(now)
        return self.level > 0

    def charge(self, amount: float, now: float) -> None:
        """Take ``amount`` even past zero (tokens counted after the fact)."""
        self._refill(now)
        self.level -= amount

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` can be taken (0 when it can now)."""
        self._refill(now)
        return max(0.0, (amount - self.level) / self.rate) if self.rate > 0 else math.inf

    def reset_s(self, now: float) -> float:
        """Seconds until the bucket is full again."""
        self._refill(now)
        return max(0.0, (self.capacity - self.level) / self.rate) if self.rate > 0 else 0.0

    def rescale(self, rate: float, capacity: float, now: float) -> None:
        """New limits (a changed policy, or another ingress replica count), keeping the fill fraction."""
        self._refill(now)
        fraction = self.level / self.capacity if self.capacity > 0 else 1.0
        self.rate, self.capacity, self.level = rate, capacity, fraction * capacity
