"""A benchmark command exits without noise: the heap it froze for its run (``freeze_loaded_heap``) goes back
to the collector at exit, so extension modules loaded beside torch (triton's nanobind bindings) find
nothing of theirs leaked and print nothing ("nanobind: leaked ..." lines, dozens a run, before)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_a_benchmark_command_exits_without_leak_reports(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "s2d2.cli", "bench-batch", "--n", "2", "--limits", "1", "--configs", "ar",
           "--no-progress", "--threads", "1"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tokens/s" in proc.stdout  # it ran and printed its table
    assert "leaked" not in proc.stderr, proc.stderr[-2000:]
