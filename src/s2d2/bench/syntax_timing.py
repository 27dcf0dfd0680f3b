"""``python -m s2d2.bench.syntax_timing [MODEL] [N]``: host time of the ``syntax`` policy's static checks.

Decodes the first N tiny-code test problems (default 200) with ``policy=syntax`` at B8, without and
with key positions, in batches of 16 on one thread, and prints each run's checked steps, dead spans,
``compile()`` calls, the checks' host time a checked step and their share of the wall time. The checks'
time is ``SyntaxView.seconds / SyntaxView.checks`` summed over the requests' views (collected while the
runs last).
"""

from __future__ import annotations

import contextlib
import sys
import time

from ..decoding import syntax_view

__all__ = ["collect_views", "main"]


@contextlib.contextmanager
def collect_views():
    """Every :class:`~s2d2.decoding.syntax_view.SyntaxView` made while the block runs, in a list."""
    views: list[syntax_view.SyntaxView] = []
    init = syntax_view.SyntaxView.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        views.append(self)

    syntax_view.SyntaxView.__init__ = recording
    try:
        yield views
    finally:
        syntax_view.SyntaxView.__init__ = init


def main(argv: list[str] | None = None) -> None:
    import torch

    from ..model import load
    from ..tasks.tiny_code.splits import load_split

    args = sys.argv[1:] if argv is None else argv
    torch.set_num_threads(1)
    m = load(args[0] if args else "tiny-code", use_preset=False, max_num_seqs=16)
    prompts = [p["question"] for p in load_split("test", int(args[1]) if len(args) > 1 else 200)]
    for keys in (False, True):
        with collect_views() as views:
            t0 = time.perf_counter()
            outs = m.generate_batch(
                prompts, decoder="s2d2", block_size=8, policy="syntax", key_positions=keys, max_new_tokens=48
            )
            wall = time.perf_counter() - t0
        checks, secs = sum(v.checks for v in views), sum(v.seconds for v in views)
        print(
            f"key_positions={keys}: {checks} checked steps, {sum(v.dead_spans for v in views)} dead spans, "
            f"{sum(v.checker.compiles for v in views)} compile() calls, "
            f"{1e6 * secs / max(checks, 1):.0f} us a checked step, {100 * secs / wall:.1f}% of the wall "
            f"time ({wall:.1f} s, {sum(o.stats.steps for o in outs)} steps)"
        )


if __name__ == "__main__":
    main()
