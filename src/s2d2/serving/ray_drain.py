"""``serve --ray`` drains as the plain server does: new requests get a 503 with ``Retry-After`` while the
running ones finish, never the proxy's 404 of an application already gone.

On a stop signal the command that started the cluster creates a *drain flag* (a file whose path every
replica was given): each replica watches it (:func:`watch_flag`, a poll every :data:`POLL_S`) and, once
it appears, drains like the plain server (its engine admits nothing more, so
:class:`~.drain.DrainGate` answers 503 + ``Retry-After``, ``/health`` 503), and writes an *idle mark*
beside the flag when its last running request has ended. Each replica also leaves a *presence mark*
when it starts watching, so the command waits for an idle mark from every replica that ever started,
not only as many as Ray Serve reports running (an idle replica's mark must not stand for a busy one's),
at most the grace (:func:`wait_idle`), before it stops Ray Serve. The flag is a local
file, so this holds for the cluster the command starts on its own machine; on a cluster it joins
(``RAY_ADDRESS``) the replicas may run elsewhere and the application is deleted as before.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

#: how often a replica looks for the flag, and how often the command looks for idle marks
POLL_S = 0.2


def watch_flag(app: Any, flag: str) -> threading.Thread:
    """Start a replica's watcher of ``flag`` for the app ``create_app`` made (a daemon thread), after
    leaving its presence mark."""
    Path(f"{flag}.up.{os.getpid()}").touch()

    def watch() -> None:
        path = Path(flag)
        while not path.exists():
            time.sleep(POLL_S)
        state = app.state.s2d2
        state.engine.draining = True
        while state.engine.inflight > 0:
            time.sleep(POLL_S)
        Path(f"{flag}.idle.{os.getpid()}").touch()

    thread = threading.Thread(target=watch, name="s2d2-drain-watch", daemon=True)
    thread.start()
    return thread


def running_replicas(serve: Any, app_name: str) -> int:
    """How many replicas of the application run now (1 if Ray Serve does not say)."""
    try:
        status = serve.status().applications[app_name]
        return sum(d.replica_states.get("RUNNING", 0) for d in status.deployments.values()) or 1
    except Exception:  # (a status layout of another Ray version: wait for one mark at least)
        return 1


def wait_idle(flag: str, replicas: int, grace: float) -> bool:
    """Raise the flag, then wait until every replica that left a presence mark has left an idle mark,
    and at least ``replicas`` have, or ``grace`` seconds passed; returns whether every replica went idle."""
    Path(flag).touch()
    deadline = time.monotonic() + grace
    folder, name = Path(flag).parent, Path(flag).name
    while time.monotonic() < deadline:
        up = {p.name.rsplit(".", 1)[1] for p in folder.glob(f"{name}.up.*")}
        idle = {p.name.rsplit(".", 1)[1] for p in folder.glob(f"{name}.idle.*")}
        if up <= idle and len(idle) >= replicas:
            return True
        time.sleep(POLL_S)
    return False
