"""What each request has been sent so far: the engine's per-step outputs (:class:`~.outputs.RequestOutput`)
carry only what is new since (the unit of streaming), and a finished request's whole result."""

from __future__ import annotations

import time
from typing import Any

from .outputs import DecodeOutput, RequestOutput
from .request import Request, Status


class Emitted:
    """Tokens sent a request so far, by request id (from :meth:`start` to :meth:`finished`)."""

    def __init__(self) -> None:
        self._sent: dict[Any, int] = {}

    def start(self, request_id: Any) -> None:
        self._sent[request_id] = 0

    def __contains__(self, request_id: Any) -> bool:
        """Whether the request is between :meth:`start` and :meth:`finished`."""
        return request_id in self._sent

    def progress(self, req: Request) -> RequestOutput:
        """The running request's newly final tokens (and log-probabilities); its first one's time is
        recorded as the request's time to first token."""
        ids = req.final_ids() if req.status == Status.RUNNING else []
        sent = self._sent.get(req.request_id, 0)
        if ids and not sent:
            req.stats.first_token_seconds = time.perf_counter() - req.t_start
        self._sent[req.request_id] = max(sent, len(ids))
        lps = req.final_logprobs(len(ids))
        new_lp = None if lps is None else lps[sent:]
        return RequestOutput(req.request_id, ids[sent:], False, new_logprobs=new_lp)

    def finished(self, req: Request) -> RequestOutput:
        """A retired request's result (finished, failed or aborted) and the tokens not sent yet."""
        sent = self._sent.pop(req.request_id, 0)
        ids = req.output_ids if req.status == Status.FINISHED else []
        out = DecodeOutput(
            token_ids=list(ids or []),
            stats=req.stats,
            trace=req.tracer.steps,
            request_id=req.request_id,
            status=req.status.value,
            error=req.error,
            exception=req.exception,
            logprobs=req.final_logprobs(len(ids or [])),
        )
        new_lp = None if out.logprobs is None else out.logprobs[sent:]
        return RequestOutput(req.request_id, out.token_ids[sent:], True, out, new_lp)
