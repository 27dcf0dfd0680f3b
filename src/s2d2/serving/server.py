"""Running the app under uvicorn, with a graceful SIGTERM.

On SIGTERM (or Ctrl-C) the server stops admitting at once (new requests on open connections get 503,
``/health`` turns 503), stops listening, lets the running requests finish for up to ``grace`` seconds
(then cancels them, which aborts their rows), stops the engine thread and returns, so ``s2d2 serve``
exits 0. A second signal exits at once.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Any

import uvicorn

log = logging.getLogger("s2d2.serving")

DEFAULT_GRACE_S = 30.0


class GracefulServer(uvicorn.Server):
    """A uvicorn server that marks the app's engine as draining as soon as a stop signal arrives."""

    def __init__(self, config: uvicorn.Config, app: Any):
        super().__init__(config)
        self._s2d2_app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state = getattr(self._s2d2_app.state, "s2d2", None)
        if state is not None and not state.engine.draining:
            log.info("stop signal: admitting no new requests, finishing the running ones")
            state.engine.draining = True
        super().handle_exit(sig, frame)
        # uvicorn re-raises captured signals after its shutdown (the process would die of SIGTERM);
        # a graceful SIGTERM shutdown is a normal exit here, status 0
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list) and sig == signal.SIGTERM:
            while signal.SIGTERM in captured:
                captured.remove(signal.SIGTERM)


def make_server(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    grace: float = DEFAULT_GRACE_S,
    log_level: str = "info",
) -> GracefulServer:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        timeout_graceful_shutdown=max(int(grace), 1),
        log_level=log_level,
        lifespan="on",
        access_log=log_level == "debug",
    )
    return GracefulServer(config, app)


def serve(app: Any, **options: Any) -> bool:
    """Serve ``app`` until a stop signal; True if it started and shut down cleanly."""
    server = make_server(app, **options)
    server.run()
    return bool(server.started)
