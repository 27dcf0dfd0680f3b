"""Run untrusted generated Python in a separate, limited process (never ``exec`` in ours).

Each program runs as ``python -I program.py`` (isolated mode: no user site, no ``PYTHON*`` variables, no
script directory on ``sys.path`` beyond its own temp dir) in a fresh temporary directory that is its working
directory and ``HOME``, with stdin closed, a minimal environment, its own process group (killed as a whole
afterwards) and resource limits set before it starts: CPU seconds, address space, file size, no core
files. A wall-clock timeout kills the group. The program passes when it exits with status 0 after running
to its end: a random marker printed as its last statement must appear, so ``sys.exit(0)`` or
``os._exit(0)`` before the tests does not count as passing.

This is a guard against accidents (infinite loops, runaway memory, crashes), not a security boundary: the
program still runs as the current user, with network access if the machine has it.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import S2D2Error

__all__ = ["ExecResult", "run_python", "DEFAULT_TIMEOUT", "DEFAULT_MEMORY_MB"]

DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 1536
DEFAULT_FILE_SIZE_MB = 16

#: Exception names (last line of a traceback) -> error kind.
_KINDS = {
    "AssertionError": "assertion",
    "MemoryError": "memory",
    "SyntaxError": "syntax",
    "IndentationError": "syntax",
    "TabError": "syntax",
    "RecursionError": "recursion",
    "TimeoutError": "timeout",
}


@dataclass
class ExecResult:
    """Outcome of one program: ``passed``, else an ``error_kind`` and a one-line ``error``."""

    passed: bool
    #: None | timeout | memory | syntax | assertion | recursion | exception | crash | no_result
    error_kind: str | None
    error: str | None
    returncode: int | None
    seconds: float


def _limit_setter(cpu_seconds: int, memory_bytes: int | None, file_bytes: int):
    """A preexec_fn that lowers the child's limits (computed here, in the parent, so it cannot fail)."""
    import resource

    def clamp(which: int, value: int) -> tuple[int, int]:
        _soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        return value, value

    limits = [
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_CPU, clamp(resource.RLIMIT_CPU, cpu_seconds)),
        (resource.RLIMIT_FSIZE, clamp(resource.RLIMIT_FSIZE, file_bytes)),
    ]
    if memory_bytes is not None:
        limits.append((resource.RLIMIT_AS, clamp(resource.RLIMIT_AS, memory_bytes)))

    def apply() -> None:
        for which, value in limits:
            resource.setrlimit(which, value)

    return apply


def _tail(path: Path, n: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _last_error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _classify(line: str) -> str:
    name = line.split(":", 1)[0].strip().rsplit(".", 1)[-1]
    return _KINDS.get(name, "exception")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(OSError):  # already gone (ProcessLookupError) or not ours
        os.killpg(pid, signal.SIGKILL)


def run_python(
    source: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    memory_mb: int | None = DEFAULT_MEMORY_MB,
    file_size_mb: int = DEFAULT_FILE_SIZE_MB,
    python: str | None = None,
) -> ExecResult:
    """Run ``source`` in a separate limited Python process; see the module docstring.

    ``timeout``: wall-clock seconds (the CPU limit is ``ceil(timeout) + 1``); ``memory_mb``: address-space
    limit (None = no limit); ``file_size_mb``: largest file it may write (its stdout/stderr included).
    """
    if os.name != "posix":
        raise S2D2Error("running generated code needs a POSIX system (Linux or macOS)")
    if not timeout > 0:
        raise S2D2Error(f"the code timeout must be > 0 seconds, got {timeout}")
    marker = f"__s2d2_done_{secrets.token_hex(8)}__"
    program = f"{source}\n\nprint({marker!r}, flush=True)\n"
    preexec = _limit_setter(
        cpu_seconds=int(math.ceil(timeout)) + 1,
        memory_bytes=None if memory_mb is None else int(memory_mb) * 1024 * 1024,
        file_bytes=int(file_size_mb) * 1024 * 1024,
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="s2d2-exec-") as tmp:
        work = Path(tmp)
        (work / "program.py").write_text(program, encoding="utf-8")
        out_path, err_path = work / ".stdout", work / ".stderr"
        with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
            proc = subprocess.Popen(
                [python or sys.executable, "-I", "program.py"],
                cwd=tmp,
                env=_clean_env(tmp),
                stdin=subprocess.DEVNULL,
                stdout=out_f,
                stderr=err_f,
                preexec_fn=preexec,
                start_new_session=True,
                close_fds=True,
            )
            rc, timed_out = _wait(proc, timeout)
        seconds = time.perf_counter() - start
        stderr = _tail(err_path)
        stdout_tail = _tail(out_path, 512)
    if timed_out:
        return ExecResult(False, "timeout", f"timed out after {timeout:g} s", rc, seconds)
    return _verdict(rc, marker in stdout_tail, _last_error_line(stderr), seconds)


def _clean_env(home: str) -> dict[str, str]:
    """The child's whole environment: a PATH, a private HOME / TMPDIR, UTF-8, one thread per library."""
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _wait(proc: subprocess.Popen, timeout: float) -> tuple[int, bool]:
    """``(exit status, timed out)``; the child's process group is killed either way."""
    timed_out = False
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        rc = proc.wait()
    finally:
        _kill_group(proc.pid)  # whatever it left behind in its group
    return rc, timed_out


def _verdict(rc: int, finished: bool, line: str, seconds: float) -> ExecResult:
    """The result of a run that did not time out: exit status ``rc``, whether the end marker was printed
    (``finished``) and the last error line of its stderr."""
    if rc == 0 and finished:
        return ExecResult(True, None, None, rc, seconds)
    if rc == 0:
        return ExecResult(False, "no_result", "the program exited before its tests finished", rc, seconds)
    if rc < 0:
        sig = -rc
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return ExecResult(False, "timeout", f"CPU time limit ({signal.Signals(sig).name})", rc, seconds)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        kind = "memory" if line.startswith("MemoryError") else "crash"
        detail = f"killed by signal {name}" + (f": {line}" if line else "")
        return ExecResult(False, kind, detail, rc, seconds)
    if not line:
        return ExecResult(False, "exception", f"exit status {rc}", rc, seconds)
    return ExecResult(False, _classify(line), line, rc, seconds)
