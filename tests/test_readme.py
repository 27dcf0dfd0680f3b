"""README.md and the manual in docs/ (USAGE, SERVING, MODELS) run as written: every fenced code block is
run here, except those marked on the line before with ``<!-- readme-test: skip (REASON) -->`` (the
network, a long-running server, minutes of work, a file's shape). A block marked ``<!-- readme-test:
tool-server (WHAT) -->`` is an OpenAI client's code against ``s2d2 serve`` on port 8000: it runs against
a real server on a free port, serving a model that can write JSON and tool calls (tests/tool_fixtures.py)
under the name the block uses. Python blocks run each in a fresh namespace (so each is complete on its
own, as a reader copies it) with an unknown-word warning as an error; shell blocks run in bash with
``s2d2`` the command line of this checkout, each in an empty directory. The README itself fits a
screenful (300 lines), names every package, and no doc names a tracker issue."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, tiny_model_path

README = REPO / "README.md"
#: The files whose code blocks run here: the README and the manual it links to.
RUN_DOCS = (README, REPO / "docs" / "USAGE.md", REPO / "docs" / "SERVING.md", REPO / "docs" / "MODELS.md")
#: Every package of ``src/s2d2`` is named in README's layout list.
PACKAGES = sorted(
    p.name for p in (REPO / "src" / "s2d2").iterdir() if p.is_dir() and not p.name.startswith("_")
)
SKIP = re.compile(r"^<!-- readme-test: skip \((.+)\) -->$")
TOOL_SERVER = re.compile(r"^<!-- readme-test: tool-server \((.+)\) -->$")
README_URL = "http://127.0.0.1:8000/v1"
RUNS = ("python", "bash")


@dataclass
class Block:
    path: Path  # the Markdown file
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None  # the marker's reason
    tool_server: bool = False  # runs against a served tool-calling fixture


def doc_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang, start = lines[i][3:].strip(), i
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            before = lines[i - 1].strip() if i > 0 else ""
            marker = SKIP.match(before)
            code = "\n".join(lines[i + 1 : j]) + "\n"
            tool = bool(TOOL_SERVER.match(before))
            blocks.append(Block(path, start + 1, lang, code, marker and marker[1], tool))
            i = j
        i += 1
    return blocks


BLOCKS = [b for path in RUN_DOCS for b in doc_blocks(path)]
TO_RUN = [b for b in BLOCKS if b.skip is None]


def _where(b: Block) -> str:
    return f"{b.path.relative_to(REPO)}:{b.line}"


def _id(b: Block) -> str:
    return f"{b.path.stem}-line{b.line}"


def test_readme_fits_a_screenful_and_names_every_package():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    missing = [name for name in PACKAGES if f"`s2d2.{name}`" not in text]
    assert not missing, f"README's layout list misses {missing}"
    for link in re.findall(r"\]\(((?:docs/)?[A-Z][A-Za-z_]*\.md)(?:#[^)]*)?\)", text):
        assert (REPO / link).is_file(), link


def test_no_tracker_issue_numbers_in_the_docs():
    for path in [README, REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]:
        found = re.findall(r"\b[Ii]ssues? #?\d+|#\d{2,}\b", path.read_text())
        assert not found, f"{path.name}: {found}"


def test_every_block_runs_or_says_why_not():
    assert len(BLOCKS) > 15 and len(TO_RUN) >= 7
    for b in TO_RUN:
        assert b.lang in RUNS, f"{_where(b)}: a {b.lang or 'plain'} block needs a readme-test marker"


@pytest.fixture(autouse=True)
def _need_model():
    if tiny_model_path() is None:
        pytest.skip("the built-in tiny-gsm model is not installed")


@pytest.mark.parametrize("block", [b for b in TO_RUN if b.lang == "python" and not b.tool_server], ids=_id)
def test_python_block(block, tmp_path, monkeypatch, capsys):
    from s2d2.model import UnknownWordsWarning

    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownWordsWarning)
        exec(compile(block.code, _where(block), "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert out.strip(), "every Python block shows what it computed"
    assert "@@" not in out  # no raw word pieces or unknown tokens in what a reader sees


def test_first_python_block_answers_its_question(capsys, tmp_path, monkeypatch):
    first = next(b for b in TO_RUN if b.lang == "python" and b.path == README)
    monkeypatch.chdir(tmp_path)
    exec(compile(first.code, _where(first), "exec"), {"__name__": "__readme__"})
    text, nfe, per_token = capsys.readouterr().out.rsplit(maxsplit=2)
    assert text.endswith("#### 5") and int(nfe) > 0 and 0 < float(per_token) < 1


@pytest.mark.parametrize("block", [b for b in TO_RUN if b.lang == "bash"], ids=_id)
def test_shell_block(block, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "s2d2").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m s2d2.cli "$@"\n')
    (bin_dir / "s2d2").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    src = str(REPO / "src")
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": path}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    script = "set -euo pipefail\n" + block.code
    proc = subprocess.run(
        ["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{_where(block)}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    for bad in ("error:", "warning:", "Traceback"):
        assert bad not in proc.stderr, f"{_where(block)}: {proc.stderr[-2000:]}"
    if "--output results.jsonl" in block.code:
        lines = Path(work / "results.jsonl").read_text().splitlines()
        assert len(lines) == 2 and all('"token_ids"' in line for line in lines)


@pytest.mark.parametrize("block", [b for b in TO_RUN if b.tool_server], ids=_id)
def test_tool_server_block(block, tmp_path, capsys):
    pytest.importorskip("xgrammar")
    pytest.importorskip("uvicorn")
    pytest.importorskip("openai")
    sys.path.insert(0, str(REPO / "tests" / "serving"))
    from test_server import running_server

    import s2d2
    from s2d2.serving.app import create_app
    from tool_fixtures import make_sdar_tool_model

    served = re.search(r'model = "([^"]+)"', block.code)[1]
    model = s2d2.load(make_sdar_tool_model(tmp_path / "model"), device="cpu", dtype="fp32")
    assert README_URL in block.code
    with running_server(create_app(model, served_name=served)) as base:
        code = block.code.replace(README_URL, base + "/v1")
        exec(compile(code, _where(block), "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tool_calls get_weather {") and out[-1].startswith("function_call get_weather {")
