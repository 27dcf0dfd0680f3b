"""Settings that cannot apply are refused one way (s2d2.applicability): a one-line ConfigError, exit 2 on
the command line; in the library, at make_config and again in the engine. A named preset's fused
verification with explicit settings that exclude it is refused as fusion on Fast-dLLM v2 is, where it
used to run unfused without a word (LLaDA2 with token editing: 16 forwards against 9)."""

from __future__ import annotations

import pytest

import s2d2
from conftest import FIXTURES, assert_one_line_error, load_or_skip, run_cli
from s2d2.config import DecodeConfig


def _one_line_config_error(call) -> str:
    with pytest.raises(s2d2.ConfigError) as exc:
        call()
    assert type(exc.value) is s2d2.ConfigError and "\n" not in str(exc.value)
    return str(exc.value)


def test_a_fused_preset_with_token_editing_is_refused_like_fusion_on_a_shifted_family():
    llada2, shifted = load_or_skip("llada2"), load_or_skip("fast_dllm_v2")
    editing = _one_line_config_error(
        lambda: llada2.make_config(preset="lossless-fused", editing_threshold=0.9)
    )
    assert editing.startswith(
        "fuse (fused verification, from the preset 'lossless-fused') needs no token editing"
    )
    family = _one_line_config_error(lambda: shifted.make_config(preset="lossless-fused"))
    assert family.startswith("fuse (fused verification) does not apply to fast_dllm_v2 models (shifted")
    for message in (editing, family):
        assert message.endswith("set fuse=false or use the preset 'lossless'")
    # what the messages advise works
    assert not llada2.make_config(preset="lossless", editing_threshold=0.9).fuse
    assert not shifted.make_config(preset="lossless-fused", fuse=False).fuse
    # the engine refuses a config made without make_config the same way
    fused = DecodeConfig.build(preset="lossless-fused", max_new_tokens=4)
    assert _one_line_config_error(lambda: shifted.generate([5, 6, 7], fused)) == family


@pytest.mark.parametrize(
    ("family", "extra", "fragment"),
    [
        ("llada2", ["--set", "editing_threshold=0.9"], "needs no token editing"),
        ("fast_dllm_v2", [], "does not apply to fast_dllm_v2 models"),
        ("sdar", ["--policy", "score"], "needs policy='always'"),
    ],
)
def test_the_command_line_refuses_each_with_one_line(capsys, family, extra, fragment):
    if not (FIXTURES / family).is_dir():
        pytest.skip("conformance fixtures not available")
    args = ["generate", "5 6 7", "--ids", "--model", str(FIXTURES / family), "--preset", "lossless-fused"]
    code, out, err = run_cli(capsys, *args, *extra, "--max-new-tokens", "4")
    assert code == 2 and out == ""
    assert_one_line_error(code, err, fragment)
    assert fragment in err


def test_what_gives_way_is_documented_defaults_and_sampling():
    tiny = load_or_skip("tiny-gsm")
    assert tiny.default_config().fuse  # the model's own preset fuses ...
    assert not tiny.make_config(decoder="ar").fuse  # ... and gives way to explicit settings
    assert not tiny.make_config(policy="score").fuse
    sampled = tiny.make_config(
        preset="lossless-fused", temperature=1.0
    )  # acceptance="auto": samples, unfused
    assert not sampled.fuse and not sampled.strict
    _one_line_config_error(
        lambda: tiny.make_config(
            preset="lossless-fused", temperature=1.0, acceptance="strict", policy="score"
        )
    )
