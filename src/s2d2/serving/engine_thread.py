"""The engine's own thread: the step loop, a command queue in, one asyncio queue per request out.

:class:`~s2d2.engine.llm_engine.LLMEngine` is not thread-safe, so ONE thread owns it: it runs the step
loop and is the only caller of ``add_request`` / ``abort``, which the event loop sends it as commands
through a thread-safe queue (taken between steps, so a new request joins the running batch at the next
step). Each step's outputs go to their request's asyncio queue with ``loop.call_soon_threadsafe``.

Admission control is here too: a request over the engine's limits raises its
:class:`~s2d2.engine.request_limits.RequestLimitError` at :meth:`EngineThread.submit` (the app's 400), and
at most ``max_num_seqs + max_queue`` requests are in the server at once (running, waiting, or on their
way to the engine); one more raises :class:`QueueFull` (the app's 429).

A request that fails inside the engine reaches its client as "internal error" with its request id; the
engine's own message (torch's, Python's) goes to the log under that id only. :meth:`EngineThread.expire`
ends every request still in the server at once with a given error (a shutdown whose grace ran out).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from ..config import DecodeConfig
from ..decoding.stats import GenerationStats
from ..engine.llm_engine import LLMEngine
from ..engine.outputs import DecodeOutput, RequestOutput
from ..errors import RequestCannotEnd
from .metrics import ServerMetrics

log = logging.getLogger("s2d2.serving")


class QueueFull(Exception):
    """The waiting queue is full (answer 429)."""


class Draining(Exception):
    """The server is shutting down and admits nothing new (answer 503)."""


#: what a client reads when the tensor-parallel group failed under its request (the details: the log)
RANK_FAILED = "a tensor-parallel rank failed; the server is stopping"


class GroupFailed(Exception):
    """A request's failure because the model's tensor-parallel group broke (answer 503, Retry-After)."""


@dataclass
class Submission:
    """One request on its way through the engine, as the event loop sees it."""

    request_id: str
    prompt_ids: list[int]
    config: DecodeConfig
    loop: asyncio.AbstractEventLoop
    #: :class:`RequestOutput` items; the last one has ``finished=True``
    outputs: asyncio.Queue[RequestOutput] = field(default_factory=asyncio.Queue)
    #: resolves once the engine took the request (or raised its PromptError)
    accepted: asyncio.Future[None] | None = None
    #: structured output: the compiled constraint (None: free text)
    constraint: Any = None


class EngineThread:
    """Owns an :class:`LLMEngine` and runs it (see the module docstring)."""

    def __init__(self, engine: LLMEngine, *, max_queue: int = 64, metrics: ServerMetrics | None = None):
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.engine = engine
        self.max_queue = max_queue
        self.metrics = metrics or ServerMetrics()
        self.capacity = engine.max_num_seqs + max_queue
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._subs: dict[str, Submission] = {}
        self._inflight = 0
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self.draining = False
        self.error: BaseException | None = None
        #: why the engine can run nothing more (a tensor-parallel rank died or hung), None while it can
        self.fatal: str | None = None
        #: called once with :attr:`fatal` when it is set (the server then exits non-zero)
        self.on_fatal: Any = None

    # ------------------------------------------------------------------ event-loop side
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="s2d2-engine", daemon=True)
        self._thread.start()

    def ensure_started(self) -> None:
        """Start the thread unless it runs (or ran: a stopped engine stays stopped)."""
        with self._lock:
            if self._thread is None and not self.draining:
                self.start()

    @property
    def inflight(self) -> int:
        """Requests in the server now: running, waiting, or on their way to the engine."""
        return self._inflight

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def check_limits(self, config: DecodeConfig) -> None:
        """The engine's own per-row bound, checked before a request is queued (a pure computation);
        raises :class:`~s2d2.engine.request_limits.RequestLimitError` naming the setting to lower."""
        self.engine.check_limits(config)

    def submit(self, prompt_ids: list[int], config: DecodeConfig, constraint: Any = None) -> Submission:
        """Queue a request (call from the event loop); raises a ``RequestLimitError``,
        :class:`QueueFull` or :class:`Draining`."""
        if self.draining:
            raise Draining("the server is shutting down")
        self.check_limits(config)
        with self._lock:
            if self._inflight >= self.capacity:
                raise QueueFull(f"the waiting queue is full ({self.max_queue} requests)")
            self._inflight += 1
        loop = asyncio.get_running_loop()
        sub = Submission(f"req-{next(self._ids)}", prompt_ids, config, loop, constraint=constraint)
        sub.accepted = loop.create_future()
        self._commands.put(("add", sub))
        return sub

    def abort(self, request_id: str) -> None:
        """Abort a request (its row is freed at the next step); unknown or finished ids are ignored."""
        self._commands.put(("abort", request_id))

    def expire(self, message: str) -> None:
        """End every request still in the server now, each with ``message`` as its error (any thread)."""
        self.draining = True
        self._commands.put(("expire", message))

    def stop(self, timeout: float = 10.0) -> None:
        """Abort what is left, let the thread end, join it."""
        self.draining = True
        self._commands.put(("stop", None))
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        stopping = False
        while True:
            busy = self.engine.has_unfinished()
            stopping = self._take_commands(block=not busy) or stopping
            if stopping and not self._subs and not self.engine.has_unfinished():
                break
            if self.engine.has_unfinished():
                self._step()
            if self.fatal is None and self._broken() is not None:
                self._go_fatal(self._broken())

    def _broken(self) -> str | None:
        """Why the model's tensor-parallel group is unusable (None: it works, or there is none)."""
        return getattr(getattr(self.engine.adapter, "tp", None), "broken", None)

    def _go_fatal(self, message: str) -> None:
        """The model can run no forward any more: every request still here fails with ``message``, new
        ones get 503 (draining), and :attr:`on_fatal` tells the server to exit."""
        self.fatal = message
        self.draining = True
        log.error("the engine cannot continue: %s", message)
        for rid in list(self._subs):
            log.error("request %s failed: %s", rid, message)
            self._end(rid, RANK_FAILED, GroupFailed(RANK_FAILED))
        if self.on_fatal is not None:
            self.on_fatal(message)

    def _take_commands(self, *, block: bool) -> bool:
        """Run the queued commands; True if one of them was ``stop``."""
        stop = False
        try:
            item = self._commands.get(timeout=0.1) if block else self._commands.get_nowait()
        except queue.Empty:
            return False
        while True:
            kind, arg = item
            if kind == "add":
                self._add(arg)
            elif kind == "abort":
                self._abort(arg)
            elif kind == "expire":
                for rid in list(self._subs):
                    self._end(rid, arg)
            else:
                stop = True
                for rid in list(self._subs):
                    self._abort(rid)
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                return stop

    def _add(self, sub: Submission) -> None:
        try:
            self.engine.add_request(sub.prompt_ids, sub.config, sub.request_id, constraint=sub.constraint)
        except Exception as exc:  # a PromptError (or any bad input): this request alone fails
            self._release()
            sub.loop.call_soon_threadsafe(_resolve, sub.accepted, exc)
            return
        self._subs[sub.request_id] = sub
        sub.loop.call_soon_threadsafe(_resolve, sub.accepted, None)

    def _abort(self, request_id: str) -> None:
        """Abort in the engine; a request still waiting leaves at once, with no engine output: end it here."""
        running = self.engine.is_running(request_id)
        if self.engine.abort(request_id) and not running:
            out = DecodeOutput([], GenerationStats(), request_id=request_id, status="aborted")
            self._dispatch([RequestOutput(request_id, [], True, out)])
            self.metrics.record_engine(self.engine)

    def _end(self, request_id: str, message: str, exception: BaseException | None = None) -> None:
        """Abort a request in the engine and end it here now as failed with ``message``."""
        self.engine.abort(request_id)
        out = DecodeOutput([], GenerationStats(), request_id=request_id, status="failed", error=message)
        out.exception = exception
        self._dispatch([RequestOutput(request_id, [], True, out)])
        self.metrics.record_engine(self.engine)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception:  # outside the forward (its failures are isolated per row): fail the running rows
            log.exception("engine step failed")
            outputs = self._fail_all()
        broken = self._broken()
        for out in outputs:
            if out.finished and out.output is not None and out.output.status == "failed":
                if broken is not None:  # the client reads RANK_FAILED; the details go to the log
                    log.error("request %s failed: %s", out.request_id, broken)
                    out.output.error, out.output.exception = RANK_FAILED, GroupFailed(RANK_FAILED)
                elif not isinstance(out.output.exception, RequestCannotEnd):
                    _hide_internal_error(out.output)  # (a request that cannot end keeps its own reason)
        self._dispatch(outputs)
        self.metrics.record_engine(self.engine)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            sub = self._subs.get(out.request_id)
            if sub is None:
                continue
            self.metrics.record_tokens(len(out.new_token_ids))
            if out.finished:
                del self._subs[out.request_id]
                self._release()
                self.metrics.record_finished(out.output, len(sub.prompt_ids))
            sub.loop.call_soon_threadsafe(sub.outputs.put_nowait, out)

    def _fail_all(self) -> list[RequestOutput]:
        outs = []
        for rid in [rid for rid in self.engine.running_ids() if rid in self._subs]:
            self._abort(rid)
            failed = DecodeOutput([], GenerationStats(), request_id=rid, status="failed", error="step failed")
            outs.append(RequestOutput(rid, [], True, failed))
        return outs

    def _release(self) -> None:
        with self._lock:
            self._inflight -= 1


def internal_error(request_id: str) -> str:
    """What a client is told about a failure inside the server: nothing internal, an id to quote."""
    return f"internal error (request id {request_id})"


def _hide_internal_error(output: DecodeOutput) -> None:
    """Log a failed request's own error under its id; its client gets :func:`internal_error` only."""
    log.error("request %s failed in the engine: %s", output.request_id, output.error)
    output.error = internal_error(str(output.request_id))
    output.exception = None


def _resolve(fut: asyncio.Future[None] | None, exc: BaseException | None) -> None:
    if fut is None or fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
