"""Models named by Hugging Face repository (``ORG/NAME``), resolved offline from a Hub cache laid out in a
temporary directory as ``huggingface_hub`` writes it (tests/hub_cache.py): ``s2d2.load``, the lm-eval
model, ``s2d2 generate`` and ``s2d2 serve``, with ``--revision``; a missing name is one line, exit 2.

The library reads ``HF_HOME`` / ``HF_HUB_OFFLINE`` when it is imported, so every check runs in a fresh
process with that environment."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from conftest import FIXTURES, assert_one_line_error, run_cli, tiny_model_path
from hub_cache import add_snapshot, offline_env

FAMILIES = ("sdar", "fast_dllm_v2", "llada2")


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> dict:
    """``HF_HOME`` with the fixture checkpoints as ``test-org/<family>``, the built-in model as
    ``test-org/tiny-gsm``, and ``test-org/pick``: main -> the sdar fixture, branch v2 -> the llada2 one."""
    if not all((FIXTURES / f).is_dir() for f in FAMILIES) or tiny_model_path() is None:
        pytest.skip("conformance fixtures or the built-in model not available")
    home = tmp_path_factory.mktemp("hf_home")
    cache = home / "hub"
    for fam in FAMILIES:
        add_snapshot(cache, f"test-org/{fam}", FIXTURES / fam)
    add_snapshot(cache, "test-org/tiny-gsm", tiny_model_path())
    main = add_snapshot(cache, "test-org/pick", FIXTURES / "sdar")
    v2 = add_snapshot(cache, "test-org/pick", FIXTURES / "llada2", branch="v2")
    return {"home": home, "cache": cache, "env": offline_env(home), "main": main, "v2": v2}


def _python(env: dict, code: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "s2d2.cli", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_load_resolves_hub_names_from_the_cache_for_every_family(hub):
    got = _python(
        hub["env"],
        f"""
        import json, s2d2
        from s2d2.evaluation.lm_eval_model import S2D2LM
        out = {{}}
        for fam in {FAMILIES!r}:
            m = s2d2.load("test-org/" + fam, device="cpu", dtype="fp32")
            out[fam] = [m.adapter.info.family, str(m.path), m.name]
        out["pick"] = s2d2.load("test-org/pick").adapter.info.family
        out["pick@v2"] = s2d2.load("test-org/pick", revision="v2").adapter.info.family
        out["pick@main-sha"] = s2d2.load("test-org/pick", revision={hub["main"]!r}).adapter.info.family
        lm = S2D2LM(model="test-org/pick", revision="v2", device="cpu")
        out["lm-eval@v2"] = lm.model.adapter.info.family
        errors = {{}}
        for name, rev in [("test-org/absent", None), ("test-org/pick", "no-such-branch"), ("tiny-gsm", "v2")]:
            try:
                s2d2.load(name, revision=rev)
            except s2d2.S2D2Error as exc:
                errors[f"{{name}}@{{rev}}"] = [type(exc).__name__, str(exc)]
        out["errors"] = errors
        print(json.dumps(out))
        """,
    )
    for fam in FAMILIES:
        family, path, name = got[fam]
        assert family == fam and name == f"test-org/{fam}"
        snapshots = hub["cache"] / f"models--test-org--{fam}" / "snapshots"
        assert Path(path).parent == snapshots  # the snapshot itself, not a copy
    assert (got["pick"], got["pick@v2"], got["pick@main-sha"], got["lm-eval@v2"]) == (
        "sdar",
        "llada2",
        "sdar",
        "llada2",
    )
    errors = got["errors"]
    assert set(errors) == {"test-org/absent@None", "test-org/pick@no-such-branch", "tiny-gsm@v2"}
    for kind, message in errors.values():
        assert kind == "ModelLoadError" and "\n" not in message
    assert "HF_HUB_OFFLINE" in errors["test-org/absent@None"][1]
    assert "test-org/absent" in errors["test-org/absent@None"][1]
    assert "no-such-branch" in errors["test-org/pick@no-such-branch"][1]
    assert "built-in model 'tiny-gsm'" in errors["tiny-gsm@v2"][1]


def test_generate_by_hub_name_and_revision_matches_the_local_directories(hub, capsys):
    prompt = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    hub_run = _cli(
        hub["env"], "generate", prompt, "--model", "test-org/tiny-gsm", "--json", "--max-new-tokens", "16"
    )
    assert hub_run.returncode == 0, hub_run.stderr
    code, out, _ = run_cli(
        capsys, "generate", prompt, "--model", "tiny-gsm", "--json", "--max-new-tokens", "16"
    )
    assert code == 0
    assert json.loads(hub_run.stdout)["token_ids"] == json.loads(out)["token_ids"]

    ids = ["generate", "5 6 7", "--ids", "--json", "--max-new-tokens", "6"]
    picked = _cli(hub["env"], *ids, "--model", "test-org/pick", "--revision", "v2")
    assert picked.returncode == 0, picked.stderr
    code, out, _ = run_cli(capsys, *ids, "--model", str(FIXTURES / "llada2"))
    assert code == 0
    assert json.loads(picked.stdout)["token_ids"] == json.loads(out)["token_ids"]


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_a_missing_name_is_one_line_and_exit_2(hub, command):
    args = ["generate", "hello"] if command == "generate" else ["serve", "--port", "0"]
    proc = _cli(hub["env"], *args, "--model", "test-org/absent")
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: model 'test-org/absent' is not a built-in model"), lines[0]
    assert "HF_HUB_OFFLINE" in lines[0] and "Traceback" not in proc.stderr


def test_revision_of_a_local_directory_is_refused(capsys):
    if not (FIXTURES / "sdar").is_dir():
        pytest.skip("conformance fixtures not available")
    code, _, err = run_cli(capsys, "generate", "1 2", "--model", str(FIXTURES / "sdar"), "--revision", "v2")
    assert_one_line_error(code, err, "revision")
    assert "applies to Hugging Face repositories" in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_by_hub_name_offline(hub, capsys):
    from openai import OpenAI

    port = _free_port()
    cmd = [sys.executable, "-m", "s2d2.cli", "serve", "--model", "test-org/tiny-gsm", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--log-level", "warning"], env=hub["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"s2d2 serve did not start: {proc.communicate()[0].decode()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        assert [m.id for m in client.models.list().data] == ["test-org/tiny-gsm"]
        prompt = "Tom has 3 apples and buys 4 more. How many apples does he have?"
        reply = client.completions.create(
            model="test-org/tiny-gsm", prompt=prompt, max_tokens=16, temperature=0
        )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    code, out, _ = run_cli(
        capsys, "generate", prompt, "--model", "tiny-gsm", "--json", "--max-new-tokens", "16"
    )
    assert code == 0
    assert reply.choices[0].text == json.loads(out)["text"]
