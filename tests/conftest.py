"""Shared test fixtures: paths to the conformance checkpoints and a small random SDAR-format model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]

# Tests never reach the Hugging Face Hub: a model named ORG/NAME comes from a local cache or fails.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Tiny models run fastest single-threaded, and tests must not fight a busy machine for cores.
torch.set_num_threads(1)

#: Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE``: ``ci`` (the default) runs every property test at
#: its full example count; ``dev`` caps each at :data:`DEV_EXAMPLES` for a quick inner loop (README).
DEV_EXAMPLES = 8
settings.register_profile("ci", deadline=None)
settings.register_profile("dev", deadline=None, max_examples=DEV_EXAMPLES)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("ci", "dev"):
    raise pytest.UsageError(f"HYPOTHESIS_PROFILE must be ci or dev, got {PROFILE!r}")
settings.load_profile(PROFILE)


#: Test folders whose every test gets a marker (``-m "not server"``, ``-m "not properties"``): the
#: servers on a real port, and the engine-equality properties (the emulated-device list of ``.ci/run``).
FOLDER_MARKERS = {"serving": "server", "properties": "properties"}


#: Tests marked ``slow`` (``-m "not slow"``: the README's inner loop): whole files by name, or one test by
#: ``file::name``. Each takes 10 s or more on two cores (subprocesses, training, a browser, lm-eval).
SLOW = (
    "test_readme.py",
    "test_model_source.py",
    "test_lm_eval_likelihood.py",
    "test_trace_html.py",
    "test_gpu_check.py",
    "test_tune.py",
    "test_tiny_gsm.py::test_train_tiny_cli_trains_resumes_and_loads",
    "test_builtin_model.py::test_readme_command_prints_a_correct_worked_answer",
    "test_builtin_model.py::test_words_outside_the_vocabulary_are_named",
    "test_evaluation.py::test_s2d2_lm_eval_cli_forwards_to_lm_eval",
    "test_acceptance.py::test_probabilistic_rule_is_exact_in_distribution",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(item.fspath)
        if path.parent.name in FOLDER_MARKERS:
            item.add_marker(FOLDER_MARKERS[path.parent.name])
        name = item.name.split("[")[0]
        if path.name in SLOW or f"{path.name}::{name}" in SLOW:
            item.add_marker("slow")


def examples(n: int) -> int:
    """A property test's example count: ``n`` under the ``ci`` profile, at most :data:`DEV_EXAMPLES` under
    ``dev`` (an explicit ``@settings(max_examples=...)`` would otherwise override the profile)."""
    return min(n, DEV_EXAMPLES) if PROFILE == "dev" else n


def fixtures_dir() -> Path:
    """``$S2D2_FIXTURES`` when set, else the conformance fixtures kept in the repository (tests/fixtures)."""
    env = os.environ.get("S2D2_FIXTURES")
    return Path(env) if env else REPO / "tests" / "fixtures"


FIXTURES = fixtures_dir()
SDAR_FIXTURE = FIXTURES / "sdar"
#: The side files of published checkpoints (no weights), beside the clone: ``../shared/fixtures/published``
#: (``$S2D2_PUBLISHED`` overrides); tests that read them skip when they are absent.
PUBLISHED = Path(os.environ.get("S2D2_PUBLISHED") or REPO.parent / "shared" / "fixtures" / "published")


def published(name: str) -> Path:
    """The published side files of checkpoint ``name`` (e.g. ``SDAR-4B-Chat``), or a skip with the reason."""
    if not (PUBLISHED / name).is_dir():
        pytest.skip(f"published side files not found: {PUBLISHED / name} (set $S2D2_PUBLISHED)")
    return PUBLISHED / name


def family_fixture(name: str) -> Path:
    """The conformance checkpoint of family ``name`` (``sdar``, ``fast_dllm_v2``, ``llada2``), or a skip;
    ``sdar_moe``: the checkpoint the tests write (:mod:`sdar_moe_fixture`)."""
    if name == "sdar_moe":
        from sdar_moe_fixture import sdar_moe_checkpoint

        return sdar_moe_checkpoint()
    if not (FIXTURES / name).is_dir():
        pytest.skip(f"conformance fixtures not found in {FIXTURES} (tests/fixtures, or $S2D2_FIXTURES)")
    return FIXTURES / name


#: Statistics every `s2d2 generate --json` reply carries.
STAT_KEYS = {
    "nfe",
    "nfe_prefill",
    "nfe_draft",
    "nfe_verify",
    "nfe_commit",
    "generated_tokens",
    "verify_steps",
    "drafted",
    "accepted",
    "seconds",
}


def make_random_sdar(
    directory: Path, *, vocab: int = 48, seed: int = 0, max_positions: int = 256, std: float = 0.5
) -> Path:
    """Write a small random Qwen3 network in the SDAR on-disk format (config.json + safetensors)."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    cfg = dict(
        model_type="sdar",
        architectures=["SDARForCausalLM"],
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        hidden_act="silu",
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        use_sliding_window=False,
        sliding_window=None,
        attention_bias=False,
        mask_token_id=vocab - 1,
        eos_token_id=vocab - 2,
        bos_token_id=vocab - 2,
        block_size=4,
    )
    torch.manual_seed(seed)
    q = Qwen3Config(
        **{
            k: v
            for k, v in cfg.items()
            if k not in ("model_type", "architectures", "mask_token_id", "block_size", "rope_theta")
        }
    )
    model = Qwen3ForCausalLM(q)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, std)  # sharper distributions than the default init: less degenerate output
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors")
    )
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    return directory


@pytest.fixture(scope="session")
def random_sdar_dir(tmp_path_factory) -> Path:
    return make_random_sdar(tmp_path_factory.mktemp("random_sdar"))


@pytest.fixture(scope="session")
def random_sdar(random_sdar_dir):
    import s2d2

    return s2d2.load(random_sdar_dir, device="cpu", dtype="fp32")


@pytest.fixture(scope="session")
def sdar_fixture():
    import s2d2

    if not SDAR_FIXTURE.is_dir():
        pytest.skip(f"conformance fixtures not found at {SDAR_FIXTURE}")
    return s2d2.load(SDAR_FIXTURE, device="cpu", dtype="fp32")


@pytest.fixture(scope="session")
def sdar_moe_model():
    """The SDAR-MoE checkpoint the tests write (:mod:`sdar_moe_fixture`), loaded on the CPU in float32."""
    return load_or_skip("sdar_moe")


# ---------------------------------------------------------------------------------------------- helpers
def tiny_model_path() -> Path | None:
    """The built-in tiny-gsm model (or ``S2D2_TEST_TINY_MODEL``), None if it is not installed."""
    env = os.environ.get("S2D2_TEST_TINY_MODEL")
    if env:
        return Path(env)
    from s2d2.model import builtin_path

    path = builtin_path("tiny-gsm")
    return path if (path / "config.json").is_file() else None


def load_or_skip(name: str, **options):
    """The built-in tiny-gsm model, a conformance fixture (``sdar``, ``fast_dllm_v2``, ``llada2``) or the
    SDAR-MoE checkpoint the tests write (``sdar_moe``, :mod:`sdar_moe_fixture`) on the CPU in float32
    (``options`` go to ``s2d2.load``); the test is skipped if it is not installed."""
    import s2d2

    if name == "sdar_moe":
        from sdar_moe_fixture import sdar_moe_checkpoint

        path = sdar_moe_checkpoint()
    elif name == "tiny-gsm":
        path = tiny_model_path()
        if path is None:
            pytest.skip("the built-in tiny-gsm model is not installed")
    else:
        path = FIXTURES / name
        if not path.is_dir():
            pytest.skip(f"conformance fixtures not found at {path}")
    return s2d2.load(path, device="cpu", dtype="fp32", **options)


@pytest.fixture(scope="module")
def step_by_step_planning():
    """Every engine the module makes plans each ``plan="auto"`` request step by step whatever its load
    (for the tests of the per-step planner and of planned rows in batches; the choice by load itself is
    tests/test_plan_regime.py's)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("s2d2.engine.planner.step_planner.MIN_FIXED_SHARE", 0.0)
        yield


def load_tiny_fp32():
    """The built-in tiny-gsm model on the CPU in float32 with one engine row (skipped if not installed)."""
    return load_or_skip("tiny-gsm", max_num_seqs=1)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run the ``s2d2`` CLI in-process; return (exit code, stdout, stderr)."""
    from s2d2.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line_error(code, err, *fragments):
    """A user error: non-zero exit, exactly one ``error: ...`` line on stderr, no traceback."""
    assert code != 0
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], (f, lines[0])


# S2D2_EMULATED_DEVICE=1: every engine runs on a CPU-emulated second device that refuses host tensors
# in the step (tests/emulated_device.py); CI runs the lossless, batch == alone, fused and seeded-sampling
# families that way too.
if os.environ.get("S2D2_EMULATED_DEVICE") == "1":
    import emulated_device

    emulated_device.install()


class GapRecorder:
    """Wraps an adapter; remembers the smallest top-1/top-2 log-probability gap of any logits row."""

    def __init__(self, adapter):
        self.inner, self.info = adapter, adapter.info
        self.min_gap = float("inf")

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, segments):
        out = self.inner.run(segments)
        for lg in out:
            lg = lg[lg.amax(dim=-1) > lg.amin(dim=-1)]  # a constant row (one not computed) decides nothing
            if lg.shape[0]:
                lp = torch.log_softmax(lg.index_fill(1, torch.tensor([self.info.mask_token_id]), -1e9), -1)
                top = lp.topk(2, dim=-1).values
                self.min_gap = min(self.min_gap, float((top[:, 0] - top[:, 1]).min()))
        return out
