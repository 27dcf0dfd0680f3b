"""scripts/gpu-check, as a dry run on the CPU: every step runs and leaves its figures in one folder."""

from __future__ import annotations

import json
import os
import subprocess

from conftest import REPO


def test_gpu_check_dry_run_on_the_cpu(tmp_path):
    out = tmp_path / "gpu-check"
    env = {**os.environ, "S2D2_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    env.pop("S2D2_EMULATED_DEVICE", None)
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu-check"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    summary = (out / "summary.txt").read_text().splitlines()
    assert proc.returncode == 0, (summary, proc.stdout[-2000:], proc.stderr[-2000:])
    steps = ["env", "tests", "bench-forward", "gpu-forward", "op-count", "bench-batch"]
    assert [line.split(":")[0] for line in summary] == steps
    assert all(": ok" in line for line in summary)
    forward = json.loads((out / "bench-forward.json").read_text())
    assert forward["device"] == "cpu" and {c["batch"] for c in forward["cells"]} == {1, 2}
    batch = json.loads((out / "bench-batch.json").read_text())
    rows = batch["rows"]
    assert {r["config"] for r in rows} == {"ar", "lossless-b16"}
    assert all(r["host_syncs_per_step"] <= 2 and r["other_ms_per_step"] > 0 for r in rows)
    pace = json.loads((out / "gpu-forward.json").read_text())
    assert [(c["rows"], c["query"]) for c in pace["cells"]] == [(1, 1), (4, 4)]
    assert all(c["replay_vs_eager_max_abs"] < 1e-4 and c["replay_replayed"] for c in pace["cells"])
    assert [e["rows"] for e in pace["engine"]] == [1, 4] and all(e["tokens"] > 0 for e in pace["engine"])
    log = (out / "steps.log").read_text()
    assert "ops/forward" in log and "=== op-count" in log
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8, files  # what a device run can bring back
