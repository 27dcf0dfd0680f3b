"""``serve --ray``'s drain handshake (serving/ray_drain.py) without Ray: the command stops Ray Serve only
once every replica that started has gone idle, so a busy replica's streams are never cut by an idle
replica's mark (Ray Serve's count of running replicas may be short of them)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from s2d2.serving.ray_drain import POLL_S, wait_idle, watch_flag


def _app(inflight: int) -> SimpleNamespace:
    engine = SimpleNamespace(draining=False, inflight=inflight)
    return SimpleNamespace(state=SimpleNamespace(s2d2=SimpleNamespace(engine=engine)))


def test_an_idle_replica_does_not_stand_for_a_busy_one(tmp_path):
    flag = str(tmp_path / "drain")
    busy = _app(inflight=1)
    watcher = watch_flag(busy, flag)  # this process: a replica with a request still streaming
    other = 4_000_000 + os.getpid()  # a second replica with nothing running: up and idle at once
    (tmp_path / f"drain.up.{other}").touch()
    (tmp_path / f"drain.idle.{other}").touch()
    assert not wait_idle(flag, replicas=1, grace=5 * POLL_S)  # Ray Serve said 1 replica runs
    assert busy.state.s2d2.engine.draining  # the busy replica drains: new requests get 503
    busy.state.s2d2.engine.inflight = 0
    t = time.monotonic()
    assert wait_idle(flag, replicas=1, grace=10.0)
    assert time.monotonic() - t < 2.0
    watcher.join(2.0)
    assert not watcher.is_alive()


def test_wait_idle_waits_for_as_many_replicas_as_reported(tmp_path):
    flag = str(tmp_path / "drain")
    for pid in (11, 12):
        (tmp_path / f"drain.up.{pid}").touch()
    (tmp_path / "drain.idle.11").touch()
    assert not wait_idle(flag, replicas=1, grace=3 * POLL_S)
    (tmp_path / "drain.idle.12").touch()
    assert wait_idle(flag, replicas=2, grace=3 * POLL_S)
    assert not wait_idle(flag, replicas=3, grace=3 * POLL_S)
