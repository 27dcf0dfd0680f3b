"""Python's static checks: Python's own tokenizer on the text, ``compile()`` on its completed lines.

:meth:`PythonChecker.check` calls a text dead (:class:`~.base.Verdict`) when no continuation can make the
program valid:

* the tokenizer (``tokenize``) finds a closing bracket that closes nothing or the wrong bracket, an
  inconsistent dedent, a one-line string left open at a line's end, or a character Python has no token
  for (a text that ends inside an open bracket or a triple-quoted string is merely incomplete);
* ``compile()`` rejects the completed logical lines (up to the last ``NEWLINE`` token): a block header
  with no body yet gets a placeholder body first, and a ``try`` still waiting for its ``except`` is
  incomplete, not dead;
* ``compile()`` rejects the line being written (its open brackets closed) at a token that other tokens
  already follow (``for x in xs::if``): no continuation reaches back to fix it.

``compile()`` parses and builds code objects; it runs nothing.

With ``final`` the program ends with the text (the span holds its stop token): the whole text must
compile as it is.

Incremental and cheap: the tokenizer reads only the text after the last completed lines found valid
(behind a header that restores the indentation stack there), and ``compile()`` runs only when the
completed lines changed since the last check (the verdict of the last completed text is kept).
"""

from __future__ import annotations

import io
import re
import tokenize

from .base import OK, Verdict, register
from .keys import python_key_positions

__all__ = ["PythonChecker"]

_CLOSERS = {")": "(", "]": "[", "}": "{"}
_OPENERS = {v: k for k, v in _CLOSERS.items()}
_SIGNIFICANT = (tokenize.NAME, tokenize.NUMBER, tokenize.OP, tokenize.STRING, tokenize.ERRORTOKEN)
_QUOTES = ("'", '"')
#: compile() messages of completed lines that a later line can still complete
_INCOMPLETE = ("expected 'except' or 'finally' block",)
#: compile() messages of the line being written that name what is still missing (it may follow)
_LINE_GOES_ON = ("expected", "never closed", "unexpected EOF")


def _indent_header(indents: list[str]) -> str:
    """Lines that leave Python's tokenizer with the indentation stack ``indents`` (the indentation
    strings of the open blocks, outermost first), so a text's tail can be tokenized alone."""
    lines, prev = [], ""
    for ind in indents:
        lines.append(prev + "if 1:\n")
        prev = ind
    return "".join(lines) + (prev + "pass\n" if indents else "")


class _Scan:
    """One tokenizer pass: a verdict, where the completed logical lines end (and the indentation stack
    there), whether the end is open. With ``start`` (a completed lines' end, whose stack is ``indents``)
    only ``text[start:]`` is tokenized, behind :func:`_indent_header`."""

    def __init__(self, text: str, start: int = 0, indents: list[str] | None = None):
        header = _indent_header(indents or [])
        self._src = header + text[start:]
        self._shift = start - len(header)  # an offset into _src plus _shift is one into text
        self.verdict = OK
        self.complete_end = start
        self.indents_at_complete = list(indents or [])
        self._indents: list[str] = []
        self.open_at_end = False
        #: the text ends inside a string; the brackets open at its end; where its last token starts
        self.in_string = False
        self.brackets: list[str] = []
        self.last_start = -1
        starts = [0]
        for line in self._src.splitlines(keepends=True):
            starts.append(starts[-1] + len(line))
        self._starts = starts
        self._run()

    def _offset(self, pos: tuple[int, int]) -> int:
        """The offset into ``_src`` of a tokenizer position."""
        row, col = pos
        return (self._starts[row - 1] if row - 1 < len(self._starts) else len(self._src)) + col

    def _run(self) -> None:
        stack: list[str] = []
        try:
            for tok in tokenize.generate_tokens(io.StringIO(self._src).readline):
                if not self._token(tok, stack):
                    return
        except tokenize.TokenError as exc:  # EOF inside a bracket, a triple-quoted string, after a backslash
            self.open_at_end = True
            self.in_string = "string" in str(exc)
        except IndentationError as exc:
            self.verdict = Verdict(True, f"indentation: {exc.msg}")
            return
        except SyntaxError as exc:  # newer tokenizers raise on what older ones mark as ERRORTOKEN
            self.verdict = Verdict(True, f"tokens: {exc.msg}")
            return
        finally:
            self.brackets = stack
        if stack:
            self.open_at_end = True

    def _token(self, tok: tokenize.TokenInfo, stack: list[str]) -> bool:
        """Take one token; False once the text is dead (``verdict`` set)."""
        if tok.type in _SIGNIFICANT:
            self.last_start = self._offset(tok.start) + self._shift
        if tok.type == tokenize.OP:
            if tok.string in "([{":
                stack.append(tok.string)
            elif tok.string in _CLOSERS:
                if not stack or stack[-1] != _CLOSERS[tok.string]:
                    self.verdict = Verdict(True, f"bracket: {tok.string!r} does not close an open bracket")
                    return False
                stack.pop()
        elif tok.type == tokenize.ERRORTOKEN:
            return self._error_token(tok)
        elif tok.type == tokenize.INDENT:
            self._indents.append(tok.string)
        elif tok.type == tokenize.DEDENT:
            self._indents.pop()
        elif tok.type == tokenize.NEWLINE and tok.string:
            end = self._offset(tok.end) + self._shift
            if end > self.complete_end:
                self.complete_end = end
                self.indents_at_complete = list(self._indents)
        return True

    def _error_token(self, tok: tokenize.TokenInfo) -> bool:
        rest = self._src[self._offset(tok.start) :]
        if tok.string.isspace():
            return True
        if tok.string[:1] in _QUOTES:
            if "\n" in rest:  # the string's line ended unterminated
                self.verdict = Verdict(True, "string: unterminated at the end of its line")
                return False
            self.open_at_end = self.in_string = True
            return True
        if len(rest.rstrip()) <= len(tok.string) and tok.string in ("!", "$", "?", "\\"):
            self.open_at_end = True  # the text's last character: a longer token may still begin here
            return True
        self.verdict = Verdict(True, f"tokens: no Python token starts with {tok.string!r}")
        return False


def _probe(complete: str) -> str | None:
    """The completed lines made compilable where a later line could still complete them: a block header
    ending them gets an indented ``pass``; None when they end in a decorator (its ``def`` may follow)."""
    lines = complete.rstrip("\n").split("\n")
    last = next((ln for ln in reversed(lines) if ln.strip() and not ln.lstrip().startswith("#")), "")
    if last.lstrip().startswith("@"):
        return None
    code = re.sub(r"#[^'\"]*$", "", last).rstrip()
    if code.endswith(":"):
        indent = last[: len(last) - len(last.lstrip())]
        return complete + ("" if complete.endswith("\n") else "\n") + indent + "    pass\n"
    return complete


def _compiles(text: str) -> str | None:
    """None when ``text`` compiles, else the error message."""
    try:
        compile(text, "<draft>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return str(exc.msg)
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return type(exc).__name__
    return None


class PythonChecker:
    """The static checks of Python (see the module docstring); keeps the last completed text's verdict."""

    name = "python"

    def __init__(self) -> None:
        self._last: tuple[str, Verdict] | None = None
        #: the last completed lines found valid and the indentation stack at their end: a text that
        #: starts with them is tokenized from there on
        self._base: tuple[str, list[str]] | None = None
        #: compile() calls made (the rest were answered from the kept verdict)
        self.compiles = 0

    def check(self, text: str, final: bool = False) -> Verdict:
        base = self._base
        if base is not None and text.startswith(base[0]):
            scan = _Scan(text, len(base[0]), base[1])
        else:
            scan = _Scan(text)
        if scan.verdict.dead:
            return scan.verdict
        if final:
            if scan.open_at_end:
                return Verdict(True, "end: a bracket or string is still open")
            msg = _compiles(text)
            self.compiles += 1
            return OK if msg is None else Verdict(True, f"compile: {msg}")
        verdict = self._complete(text[: scan.complete_end])
        if verdict.dead:
            return verdict
        self._base = (text[: scan.complete_end], scan.indents_at_complete)
        return self._line(text, scan)

    def _line(self, text: str, scan: _Scan) -> Verdict:
        """The line being written, compiled after the completed lines with its open brackets closed (and
        a placeholder body after a header): dead when ``compile()`` fails before the line's last token
        (tokens already follow the error, so no continuation reaches back to fix it). An error at the
        last token or later is where the line may still go on; a false alarm costs one verification."""
        tail = text[scan.complete_end :]
        if not tail.strip() or scan.in_string or scan.last_start < scan.complete_end or tail.endswith("\\"):
            return OK
        probe = text + "".join(_OPENERS[b] for b in reversed(scan.brackets))
        if probe.rstrip().endswith(":"):
            first = tail.lstrip("\n")
            probe += "\n" + first[: len(first) - len(first.lstrip())] + "    pass"
        self.compiles += 1
        try:
            compile(probe + "\n", "<draft>", "exec", dont_inherit=True)
        except SyntaxError as exc:
            msg = str(exc.msg)
            if exc.lineno is None or exc.offset is None or any(m in msg for m in _LINE_GOES_ON):
                return OK
            lines = probe.split("\n")
            at = sum(len(ln) + 1 for ln in lines[: exc.lineno - 1]) + exc.offset - 1
            if at < scan.last_start:
                return Verdict(True, f"line: {msg}")
        except (ValueError, RecursionError, MemoryError, OverflowError):
            return OK
        return OK

    def _complete(self, complete: str) -> Verdict:
        if not complete.strip():
            return OK
        if self._last is not None and self._last[0] == complete:
            return self._last[1]
        probe = _probe(complete)
        verdict = OK
        if probe is not None:
            self.compiles += 1
            msg = _compiles(probe)
            if msg is not None and not any(m in msg for m in _INCOMPLETE):
                verdict = Verdict(True, f"compile: {msg}")
        self._last = (complete, verdict)
        return verdict

    def key_positions(self, before: str, pieces: list[str]) -> list[int]:
        return python_key_positions(before, pieces)


register("python", PythonChecker)
