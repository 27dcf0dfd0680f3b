"""The HTML trace in headless Chromium (Debian's chromium through Playwright).

Set-up: installs the ``playwright`` Python package and Debian's ``chromium`` (``apt-get install -y
chromium``) once when they are missing; never ``playwright install``. The test is skipped, saying why,
only if no browser can be installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_model_path

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _run(cmd: list[str], timeout: int = 900) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _ensure_browser() -> str | None:
    """None when Playwright and Chromium are ready, else why they are not."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        if not _run([sys.executable, "-m", "pip", "install", "-q", "playwright"]):
            return "cannot install the playwright Python package (pip install playwright failed)"
    if not CHROMIUM.exists():
        if shutil.which("apt-get") is None:
            return "Debian's chromium is not installed and apt-get is not available"
        if not _run(["apt-get", "install", "-y", "chromium"]):
            _run(["apt-get", "update"])
            if not _run(["apt-get", "install", "-y", "chromium"]):
                return "cannot install Debian's chromium (apt-get install -y chromium failed)"
    return None if CHROMIUM.exists() else f"{CHROMIUM} is missing after installing chromium"


@pytest.fixture(scope="module")
def browser():
    reason = _ensure_browser()
    if reason is not None:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield b
        b.close()


@pytest.mark.skipif(tiny_model_path() is None, reason="the built-in tiny-gsm model is not installed")
def test_html_trace_counts_tokens_by_kind_and_the_slider_moves(browser, tmp_path):
    import s2d2
    from s2d2.tracing import commit_counts, view_of
    from s2d2.tracing.render_html import write_html

    m = s2d2.load("tiny-gsm", max_num_seqs=1)
    prompt = "Tom has 3 apples and buys 5 more."
    ids = m.encode(prompt)
    res = m.generate(ids, trace=True, block_size=8, policy="score", score="dynamic", max_new_tokens=32)
    counts = commit_counts(res.trace)
    assert sum(counts.values()) > 0
    page_path = write_html(view_of(m, ids, res, prompt), tmp_path / "trace.html")

    page = browser.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(page_path.as_uri())
    for how in ("accepted", "resampled", "fallback", "ar", "baseline", "edited"):
        assert page.locator(f"span.tok[data-how='{how}']").count() == counts.get(how, 0), how
    n_steps = len(res.trace)
    assert page.locator("div.step").count() == n_steps
    assert requests == [page_path.as_uri()]  # nothing but the page itself is loaded

    def move(k: int) -> str:
        page.eval_on_selector(
            "#step-slider", f"el => {{ el.value = {k}; el.dispatchEvent(new Event('input')); }}"
        )
        return page.inner_text("#step-label")

    assert move(0).startswith(f"step 1/{n_steps}")
    assert page.locator("div.step:not(.future)").count() == 1
    assert page.locator("div.step.current").get_attribute("data-index") == "0"
    last = move(n_steps - 1)
    assert last.startswith(f"step {n_steps}/{n_steps}") and f"NFE {res.stats.nfe}" in last
    assert page.locator("div.step:not(.future)").count() == n_steps
    # hovering a token shows its probabilities
    page.hover("span.tok >> nth=0")
    assert "draft confidence" in page.inner_text("#info")
    page.close()
