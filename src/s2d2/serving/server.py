"""Running the app under uvicorn: connection timeouts and a graceful, bounded shutdown.

**Timeouts.** An idle keep-alive connection, and a connection whose request head (request line and
headers) has not fully arrived, are closed after ``timeout_keep_alive`` seconds (a head trickled in a
byte at a time cannot hold a connection open: the deadline runs from the connection, or the previous
response, to the end of the head). The body has its own deadline (:mod:`.limits`).

**Shutdown.** On SIGTERM or SIGINT (Ctrl-C) the server stops admitting at once: it keeps listening, and
every new request, on a new connection or an open one, gets a 503 with ``Retry-After`` (:mod:`.drain`;
``/health`` turns 503). The running requests finish, for up to ``grace`` seconds; then every request
still open ends with an error (a stream with an OpenAI error event and ``data: [DONE]``, a plain request
with a 500). Once none is left the server stops listening, the engine thread stops, the app writes its
routing state, and ``s2d2 serve`` exits 0 (1 if the routing state could not be written). A second
signal ends the open requests at once the same way; if the process has not exited
:data:`HARD_EXIT_S` seconds later (a forward that does not return), it writes the routing state if it
can and exits without waiting.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("s2d2.serving")

DEFAULT_GRACE_S = 30.0
DEFAULT_TIMEOUT_KEEP_ALIVE_S = 5.0
#: uvicorn cancels what is still running this long after the grace (our own expiry ends it first)
CANCEL_MARGIN_S = 5.0
#: after a second stop signal the process is gone within this many seconds, whatever still runs
HARD_EXIT_S = 5.0
#: how often a draining server looks whether its running requests are done
DRAIN_POLL_S = 0.05
#: ``s2d2 serve``'s exit status after the engine stopped for good (a tensor-parallel rank died or hung)
FATAL_STATUS = 4
#: the error of a request the shutdown ended
SHUTDOWN_MESSAGE = "the server shut down before the request finished"


class HeadTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head (see the module docstring)."""

    head_timeout: float = DEFAULT_TIMEOUT_KEEP_ALIVE_S
    _head_timer: Any = None

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            log.debug("closing a connection whose request head did not arrive in time")
            self.transport.close()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a whole request head arrived
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        self._arm_head_timer()  # before: a pipelined request handled in there cancels it again
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)


def head_timeout_protocol(seconds: float) -> type[HeadTimeoutH11]:
    """:class:`HeadTimeoutH11` with a head deadline of ``seconds``."""
    return type("HeadTimeoutH11", (HeadTimeoutH11,), {"head_timeout": float(seconds)})


class GracefulServer(uvicorn.Server):
    """A uvicorn server with the shutdown of the module docstring."""

    def __init__(self, config: uvicorn.Config, app: Any, grace: float = DEFAULT_GRACE_S):
        super().__init__(config)
        self._s2d2_app = app
        self.grace = grace
        self.signals = 0
        #: why the engine stopped for good (a tensor-parallel rank died or hung): exit non-zero
        self.fatal: str | None = None

    def _state(self) -> Any:
        return getattr(self._s2d2_app.state, "s2d2", None)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # not uvicorn's own: it would re-raise the signal after the shutdown (a crash exit) and a second
        # SIGINT would skip the app's shutdown (no routing state written, the engine thread left running)
        self.signals += 1
        state = self._state()
        if state is None:
            self.should_exit = True
            return
        if self.signals == 1:
            log.info("stop signal: admitting no new requests, finishing the running ones (%gs)", self.grace)
            state.engine.draining = True
            timer = threading.Timer(self.grace, state.engine.expire, args=(SHUTDOWN_MESSAGE,))
            timer.daemon = True
            timer.start()
            # keep listening (new requests get 503) until the running requests are done
            threading.Thread(target=self._exit_when_drained, args=(state,), daemon=True).start()
            return
        self.should_exit = True
        log.warning("second stop signal: ending every open request now")
        state.engine.expire(SHUTDOWN_MESSAGE)
        if self.signals == 2:
            watchdog = threading.Timer(HARD_EXIT_S, self._hard_exit)
            watchdog.daemon = True
            watchdog.start()

    def fatal_stop(self, message: str) -> None:
        """The engine can run nothing more (its requests have failed with ``message``): answer 503 while
        the failed responses go out, then stop; ``serve`` returns :data:`FATAL_STATUS`."""
        self.fatal = message
        state = self._state()
        if state is None:
            self.should_exit = True
            return
        threading.Thread(target=self._exit_when_drained, args=(state,), daemon=True).start()

    def _exit_when_drained(self, state: Any) -> None:
        """Stop the server (uvicorn's own shutdown) once no request is left in the engine thread."""
        while state.engine.inflight > 0 and not self.should_exit:
            time.sleep(DRAIN_POLL_S)
        self.should_exit = True

    def _hard_exit(self) -> None:
        state = self._state()
        ok = state.write_routing_state() if state is not None else True
        log.error("the server did not stop within %gs of the second signal: exiting now", HARD_EXIT_S)
        logging.shutdown()
        os._exit(0 if ok else 1)


def make_server(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    grace: float = DEFAULT_GRACE_S,
    log_level: str = "info",
    timeout_keep_alive: float = DEFAULT_TIMEOUT_KEEP_ALIVE_S,
) -> GracefulServer:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=head_timeout_protocol(timeout_keep_alive),
        timeout_keep_alive=max(int(timeout_keep_alive), 1),
        timeout_graceful_shutdown=int(grace + CANCEL_MARGIN_S),
        log_level=log_level,
        lifespan="on",
        access_log=log_level == "debug",
    )
    return GracefulServer(config, app, grace)


def serve(app: Any, **options: Any) -> int:
    """Serve ``app`` until a stop signal; the exit status: 0 after a clean shutdown, 1 if the app's
    shutdown failed (its routing state could not be written), 3 if the server did not start,
    :data:`FATAL_STATUS` if the engine could run nothing more (a tensor-parallel rank died or hung)."""
    server = make_server(app, **options)
    state = getattr(app.state, "s2d2", None)
    if state is not None:
        state.engine.on_fatal = server.fatal_stop
    server.run()
    if not server.started:
        return 3
    if server.fatal is not None:
        return FATAL_STATUS
    return 1 if state is not None and state.shutdown_failed else 0
