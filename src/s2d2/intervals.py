"""Small statistics shared by ``s2d2 bench`` and ``s2d2 eval``."""

from __future__ import annotations

import math


def wilson_interval(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes in ``n`` trials (95% for the default ``z``).

    Unlike the normal approximation it stays sensible at 0/n and n/n.
    """
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    lo = 0.0 if k <= 0 else max(0.0, center - half)
    hi = 1.0 if k >= n else min(1.0, center + half)
    return (lo, hi)
