"""Incremental detokenization with stop strings: final token ids in, text that is safe to send out.

The engine hands over token ids that can no longer change; this turns them into text that is never taken
back. Each push decodes the whole output so far (outputs are at most a context long, and a fast
tokenizer decodes that in microseconds) and sends the part after what was already sent, holding back

- a trailing U+FFFD: the last tokens end inside a multi-byte character, whose other bytes come next;
- a tail that could be the start of a stop string: it is sent once the next text shows it is not one;
- everything, if the tokenizer rewrote text that was already sent (it waits until the text agrees).

When a stop string appears the text ends just before it and :attr:`TextStream.stopped` is set; the
request's token count (:attr:`TextStream.n_tokens`, its ``completion_tokens``) then runs through the
first token whose text completes the stop string, never past it, whatever the decoder committed after it
in the same step. A non-streamed response is built with the same class, so streamed text ==
non-streamed text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class TextStream:
    """The text of one request, grown from its final token ids (see the module docstring)."""

    def __init__(
        self, decode: Callable[[list[int]], str], stop: Sequence[str] = (), *, include_stop: bool = False
    ):
        self._decode = decode
        self._stop = [s for s in stop if s]
        #: vLLM's ``include_stop_str_in_output``: the text ends after the stop string, not before it
        self.include_stop = include_stop
        self.ids: list[int] = []
        #: the text sent so far
        self.text = ""
        self.stopped = False
        #: tokens through the one that completed the stop string (set when one appears)
        self.stop_at: int | None = None
        self._before = 0

    @property
    def n_tokens(self) -> int:
        """The tokens the returned text stands for: through the stop string's end, else all of them."""
        return self.stop_at if self.stop_at is not None else len(self.ids)

    def push(self, new_ids: Sequence[int]) -> str:
        """Add final token ids; returns the new text that can be sent (maybe empty)."""
        if self.stopped or not new_ids:
            return ""
        self._before = len(self.ids)
        self.ids.extend(int(i) for i in new_ids)
        return self._emit(self._decode(self.ids), final=False)

    def finish(self) -> str:
        """The request ended: returns the rest of the text (what was held back)."""
        if self.stopped:
            return ""
        return self._emit(self._decode(self.ids), final=True)

    # ------------------------------------------------------------------ internals
    def _find_stop(self, full: str) -> int | None:
        hits = [i for i in (full.find(s) for s in self._stop) if i >= 0]
        return min(hits) if hits else None

    def _stop_tokens(self) -> int:
        """The fewest tokens whose text holds a stop string (none did before the last push)."""
        for k in range(self._before + 1, len(self.ids)):
            if self._find_stop(self._decode(self.ids[:k])) is not None:
                return k
        return len(self.ids)

    def _partial_stop(self, full: str) -> int:
        """Length of the longest tail of ``full`` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(full)), best, -1):
                if full.endswith(s[:k]):
                    best = k
                    break
        return best

    def _emit(self, full: str, *, final: bool) -> str:
        hit = self._find_stop(full)
        if hit is not None:
            end = hit
            if self.include_stop:
                end += max(len(s) for s in self._stop if full.startswith(s, hit))
            full, final = full[:end], True
            self.stopped = True
            self.stop_at = self._stop_tokens()
        if not final:
            cut = len(full)
            while cut > 0 and full[cut - 1] == REPLACEMENT:
                cut -= 1
            full = full[:cut]
            full = full[: len(full) - self._partial_stop(full)]
        if not full.startswith(self.text):
            if not final:
                return ""
            # the tokenizer rewrote sent text: nothing can be taken back, send what follows the sent part
            common = 0
            while common < min(len(full), len(self.text)) and full[common] == self.text[common]:
                common += 1
            new = full[max(common, len(self.text)) :] if len(full) > len(self.text) else ""
            self.text += new
            return new
        new = full[len(self.text) :]
        self.text = full
        return new
