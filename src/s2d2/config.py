"""Decoding settings: one validated dataclass, plus named presets.

Every setting uses the CLI flag's name with underscores (``--block-size`` -> ``block_size``).
``DecodeConfig.build(preset=..., **settings)`` merges a preset with explicit settings (explicit wins)
and validates the result; invalid or contradictory settings raise :class:`~s2d2.errors.ConfigError`
with a one-line message.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .setting_ranges import check_ranges

DECODERS = ("ar", "static", "dynamic", "eb", "s2d2")
FALLBACKS = ("static", "dynamic", "eb")
ESTIMATORS = (
    "hard-margin",
    "hard-entropy",
    "confidence-power",
    "clipped-margin",
    "soft-entropy",
    "renyi2",
)
SCORES = ("static", "dynamic")
ACCEPTANCE = ("auto", "strict", "probabilistic")
LAST_BLOCK = ("truncate", "full")
#: Sampling temperatures outside this range overflow the softmax in float32.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0
UCB_SCOPES = ("request", "engine")
UCB_REWARDS = ("auto", "committed", "checked")
UCB_ENTROPY_SCALES = ("auto", "linear", "log")
#: ``fixed``: every step decodes as the settings say; ``auto``: the engine's cost-aware planner chooses each
#: verification (s2d2.engine.planner)
PLANS = ("fixed", "auto")
#: Most alternatives ``logprobs`` may ask for per token (OpenAI's limit).
MAX_TOP_LOGPROBS = 20

#: Default parameter of each acceptance estimator (docs/METHOD.md section 4).
ESTIMATOR_DEFAULTS: dict[str, float | None] = {
    "hard-margin": 0.05,
    "hard-entropy": 0.1,
    "confidence-power": 0.8,
    "clipped-margin": 1.0,
    "soft-entropy": 1.0,
    "renyi2": None,
}


def policy_names() -> tuple[str, ...]:
    """The routing policies, read from their one registry (:data:`s2d2.decoding.policies.POLICIES`)."""
    from .decoding.policies import POLICIES

    return tuple(POLICIES)


@dataclass
class DecodeConfig:
    """All settings of one generation.

    ``decoder`` picks the algorithm: ``ar`` (block size 1), the baselines ``static`` / ``dynamic`` /
    ``eb`` (entropy-bounded), or ``s2d2`` (draft, route, verify, accept; the baseline named by
    ``fallback`` fills each step's quota when verification is skipped or commits too few tokens).
    """

    decoder: str = "s2d2"
    block_size: int = 4
    #: Denoising steps per block; ``None`` means one step per position (quota of one token per step).
    steps: int | None = None
    #: Confidence threshold tau of the dynamic rule (also S2D2's dynamic fallback and dynamic score).
    threshold: float = 0.9
    #: Entropy budget gamma of the entropy-bounded sampler.
    gamma: float = 0.1
    #: Baseline rule S2D2 falls back to / tops the quota up with.
    fallback: str = "dynamic"
    # --- routing (S2D2 only) ---
    policy: str = "always"
    estimator: str = "soft-entropy"
    #: Parameter of the estimator (theta, a, k or lambda); ``None`` = the estimator's default.
    estimator_param: float | None = None
    #: Score penalty kind: ``static`` (c) or ``dynamic`` (c x positions the dynamic rule would commit).
    score: str = "static"
    penalty: float = 1.0
    score_threshold: float = 0.0
    hysteresis_on: float = 1.0
    hysteresis_off: float = -5.0
    min_span: int = 2
    ucb_beta: float = 1.0
    ucb_bins: int = 2
    #: Whose statistics the UCB bandit learns: ``request`` (each request its own) or ``engine`` (shared by
    #: every request of one engine with the same settings, and kept across them).
    ucb_scope: str = "request"
    #: What a UCB step earns: ``committed`` (the paper's: tokens committed per forward), ``checked``
    #: (each verification also prices what skipping would have committed, ``ucb_error_cost`` per token
    #: it did not vouch for) or ``auto`` (``checked`` at engine scope, ``committed`` at request scope).
    ucb_reward: str = "auto"
    ucb_error_cost: float = 64.0
    #: How the UCB context bins the span's mean normalised entropy: ``linear`` over [0, 1] (the
    #: paper's), ``log`` (equal-width bins of log10 over [-4, 0]) or ``auto`` (``log`` with the checked
    #: reward, ``linear`` otherwise).
    ucb_entropy_scale: str = "auto"
    # --- acceptance ---
    #: ``strict`` accepts iff draft == argmax q; ``probabilistic`` is the paper's min(1, (q/p)^g) rule;
    #: ``auto`` = strict at temperature 0, probabilistic otherwise.
    acceptance: str = "auto"
    tempering: float = 1.0
    #: Compute committed tokens' keys/values token-causally (as AR mode would); the paper's SDAR setting.
    causal_cache: bool = False
    # --- sampling ---
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    # --- length and stopping ---
    max_new_tokens: int = 256
    #: Extra stop token ids (the model's EOS ids always stop unless ``ignore_eos``).
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    #: The stop and EOS ids cannot be committed before this many tokens were generated.
    min_tokens: int = 0
    # --- logit adjustments (OpenAI's; applied to drafter and verifier alike, s2d2.decoding.logits_adjust) ---
    #: Added to the logit of each token id, each bias in [-100, 100].
    logit_bias: dict[int, float] = field(default_factory=dict)
    #: Subtracted from a token's logit once it occurs among the generated tokens, in [-2, 2].
    presence_penalty: float = 0.0
    #: Subtracted from a token's logit per occurrence among the generated tokens, in [-2, 2].
    frequency_penalty: float = 0.0
    # --- family-specific (ignored where a family does not use them) ---
    #: Fast-dLLM v2: draft in sub-blocks of this size inside each block.
    sub_block_size: int | None = None
    #: LLaDA2.1 token-to-token editing: replace a generated token whose prediction changed with
    #: confidence above this; ``None`` disables editing.
    editing_threshold: float | None = None
    #: LLaDA2.1: edit-only passes allowed after a block's masks are gone.
    post_steps: int = 0
    #: The last block: ``truncate`` decodes only positions within ``max_new_tokens``; ``full`` decodes
    #: every position of the block (as the SDAR and LLaDA2 reference decoders do), then returns the
    #: first ``max_new_tokens``.
    last_block: str = "truncate"
    # --- fused verification (one forward per step; docs/METHOD.md section 8) ---
    #: Carry the next step's draft queries ("pre-drafts") in each verification forward, and keep the
    #: verification's token-causal keys/values of a finished block in the cache.
    fuse: bool = False
    #: Pre-draft groups for a first rejection at the k most likely positions of the span.
    predraft_positions: int = 4
    #: Per rejection position, branch on the m most likely correction tokens (drafter's ranking); 0: one
    #: group with the rejected position masked (its drafts are judged by the next verification).
    predraft_tokens: int = 0
    #: On a pre-draft miss, reuse the stale drafts (verification judges them) instead of drafting afresh.
    reuse_stale: bool = False
    #: ``auto``: the engine's step planner chooses each verification of the lossless family (plain, fused
    #: with 0..``predraft_positions`` groups, the span's first k positions, or AR only) for the most
    #: expected tokens per predicted second; the tokens stay AR greedy's. Other settings decode as
    #: ``fixed`` (exactly as they say).
    plan: str = "fixed"
    #: With ``plan="auto"`` on the lossless family: other block sizes the engine may decode a request with
    #: instead of ``block_size``, chosen when the request is added, by the load then (the rows it will
    #: share steps with) and the engine's cost profile: the largest whose draft and whole-block
    #: verification forwards cost at most :data:`s2d2.engine.block_size_choice.TOLERANCE` more than the
    #: smallest's (while a forward is bound by reading the weights, as on a GPU at low load, a bigger
    #: block is free). The tokens are AR greedy's whichever is chosen. Empty: ``block_size`` always.
    plan_block_sizes: tuple[int, ...] = ()
    #: Record a per-step trace of what was committed and how.
    trace: bool = False
    #: Report each committed token's log-probability (``None``: off; 0: the token's own; k: also the k most
    #: likely tokens at that position, k <= MAX_TOP_LOGPROBS); see :mod:`s2d2.engine.logprobs`.
    logprobs: int | None = None

    # ------------------------------------------------------------------ derived values
    @property
    def num_steps(self) -> int:
        """Denoising steps per block (``steps`` or, when unset, one per position)."""
        return self.block_size if self.steps is None else self.steps

    @property
    def ucb_checked(self) -> bool:
        """Whether the UCB policy prices skips by what verifications show (``ucb_reward`` resolved)."""
        if self.ucb_reward == "auto":
            return self.ucb_scope == "engine"
        return self.ucb_reward == "checked"

    @property
    def ucb_log_entropy(self) -> bool:
        """Whether the UCB context bins entropy on a log scale (``ucb_entropy_scale`` resolved)."""
        if self.ucb_entropy_scale == "auto":
            return self.ucb_checked
        return self.ucb_entropy_scale == "log"

    @property
    def strict(self) -> bool:
        """Whether acceptance is the strict greedy rule."""
        if self.acceptance == "auto":
            return self.temperature == 0
        return self.acceptance == "strict"

    @property
    def estimator_value(self) -> float | None:
        return ESTIMATOR_DEFAULTS[self.estimator] if self.estimator_param is None else self.estimator_param

    def quota(self, step: int) -> int:
        """Tokens step ``step`` (0-based) of a block must commit: floor(B/S), +1 for the first B mod S."""
        b, s = self.block_size, self.num_steps
        return b // s + (1 if step < b % s else 0)

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(
        cls, config: DecodeConfig | None = None, *, preset: str | None = None, **settings: Any
    ) -> DecodeConfig:
        """Merge ``config`` (or the defaults), a preset and explicit settings, then validate.

        ``preset`` is a name in :data:`PRESETS` or a preset file (a value ending in ``.json`` or naming an
        existing file; see :mod:`s2d2.tuning.preset_file`).

        Settings whose value is ``None`` are treated as "not given", except ``steps``, ``seed``,
        ``estimator_param``, ``sub_block_size`` and ``editing_threshold`` where ``None`` is meaningful
        only when given through ``config``.
        """
        base = dataclasses.asdict(config) if config is not None else {}
        if preset is not None:
            base.update(preset_settings(preset))
        names = {f.name for f in dataclasses.fields(cls)}
        for key, value in settings.items():
            if key not in names:
                raise ConfigError(f"unknown decoding setting {key!r}")
            if value is not None:
                base[key] = value
        if isinstance(base.get("plan_block_sizes"), list):  # from JSON (a preset file, a request)
            base["plan_block_sizes"] = tuple(base["plan_block_sizes"])
        if base.get("decoder") == "ar":
            base["block_size"] = 1
            base["steps"] = 1
        try:
            cfg = cls(**base)
        except TypeError as exc:  # pragma: no cover - guarded by the name check above
            raise ConfigError(str(exc)) from None
        if cfg.fuse and settings.get("fuse") is None and cfg.fusion_blockers():
            # fusion inherited from a preset or a model's defaults gives way to explicit settings it does
            # not apply to (e.g. --decoder ar on a model whose preset fuses); asked for explicitly, it errs
            cfg.fuse = False
        cfg.validate()
        return cfg

    def replace(self, **settings: Any) -> DecodeConfig:
        return DecodeConfig.build(self, **settings)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:  # noqa: C901 - a flat list of checks reads best
        def fail(msg: str) -> None:
            raise ConfigError(msg)

        def choice(name: str, value: str, options: tuple[str, ...]) -> None:
            if value not in options:
                fail(f"invalid {name} {value!r}; choose one of: {', '.join(options)}")

        choice("decoder", self.decoder, DECODERS)
        choice("fallback", self.fallback, FALLBACKS)
        choice("policy", self.policy, policy_names())
        choice("estimator", self.estimator, ESTIMATORS)
        choice("score", self.score, SCORES)
        choice("acceptance", self.acceptance, ACCEPTANCE)
        choice("last_block", self.last_block, LAST_BLOCK)
        choice("ucb_scope", self.ucb_scope, UCB_SCOPES)
        choice("ucb_reward", self.ucb_reward, UCB_REWARDS)
        choice("ucb_entropy_scale", self.ucb_entropy_scale, UCB_ENTROPY_SCALES)
        choice("plan", self.plan, PLANS)
        if not isinstance(self.block_size, int) or self.block_size < 1:
            fail(f"block_size must be an integer >= 1, got {self.block_size!r}")
        sizes = self.plan_block_sizes
        if not isinstance(sizes, (list, tuple)) or not all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in sizes
        ):
            shown = list(sizes) if isinstance(sizes, tuple) else sizes  # as the user wrote it (JSON, Python)
            fail(f"plan_block_sizes must be a list of integers >= 1, got {shown!r}")
        if self.steps is not None:
            if not isinstance(self.steps, int) or self.steps < 1:
                fail(f"steps must be an integer >= 1, got {self.steps!r}")
            if self.steps > self.block_size:
                fail(f"steps ({self.steps}) cannot exceed block_size ({self.block_size})")
        if not (0.0 < self.threshold <= 1.0) or math.isnan(self.threshold):
            fail(f"threshold (tau) must be in (0, 1], got {self.threshold}")
        if not self.gamma > 0:
            fail(f"gamma must be > 0, got {self.gamma}")
        if self.hysteresis_on <= self.hysteresis_off:
            fail(
                f"hysteresis_on ({self.hysteresis_on}) must be greater than hysteresis_off "
                f"({self.hysteresis_off})"
            )
        if self.min_span < 1:
            fail(f"min_span must be >= 1, got {self.min_span}")
        if self.penalty < 0:
            fail(f"penalty must be >= 0, got {self.penalty}")
        if self.ucb_beta < 0:
            fail(f"ucb_beta must be >= 0, got {self.ucb_beta}")
        if not self.ucb_error_cost >= 0:
            fail(f"ucb_error_cost must be >= 0, got {self.ucb_error_cost}")
        if self.ucb_bins < 1:
            fail(f"ucb_bins must be >= 1, got {self.ucb_bins}")
        if not self.tempering > 0:
            fail(f"tempering must be > 0, got {self.tempering}")
        if self.estimator_param is not None and self.estimator == "renyi2":
            fail("the renyi2 estimator takes no parameter")
        if self.temperature < 0 or math.isnan(self.temperature):
            fail(f"temperature must be >= 0, got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE or self.temperature > MAX_TEMPERATURE:
            fail(
                f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], got "
                f"{self.temperature} (outside it the sampling distribution is not finite)"
            )
        if not isinstance(self.top_k, int) or self.top_k < 0:
            fail(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            fail(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            fail(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.sub_block_size is not None and not (1 <= self.sub_block_size <= self.block_size):
            fail(f"sub_block_size must be in [1, block_size={self.block_size}], got {self.sub_block_size}")
        if self.editing_threshold is not None and not (0.0 < self.editing_threshold <= 1.0):
            fail(f"editing_threshold must be in (0, 1], got {self.editing_threshold}")
        if self.post_steps < 0:
            fail(f"post_steps must be >= 0, got {self.post_steps}")
        self._validate_adjust(fail)
        if self.logprobs is not None and (
            not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS
        ):
            fail(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}] or unset, got {self.logprobs!r}")
        if self.decoder == "ar" and self.block_size != 1:
            fail("the ar decoder uses block_size 1")
        self._validate_fusion(fail)
        check_ranges(self, fail)  # every setting's range, whatever the decoder, policy or family

    def _validate_adjust(self, fail: Any) -> None:
        """OpenAI's ranges for logit_bias, the penalties and min_tokens."""
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) or self.min_tokens < 0:
            fail(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -2.0 <= value <= 2.0:
                fail(f"{name} must be a number in [-2, 2], got {value!r}")
        if not isinstance(self.logit_bias, dict):
            fail(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}")
        for tok, bias in self.logit_bias.items():
            if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                fail(f"logit_bias keys must be token ids (integers >= 0), got {tok!r}")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100.0 <= bias <= 100.0:
                fail(f"logit_bias[{tok}] must be a number in [-100, 100], got {bias!r}")

    def _validate_fusion(self, fail: Any) -> None:
        """Fused verification is built for strict, always-verify, one-token-quota decoding with a causal
        cache (the lossless family): there every step verifies and nothing is committed unverified."""
        if not isinstance(self.predraft_positions, int) or self.predraft_positions < 0:
            fail(f"predraft_positions must be an integer >= 0, got {self.predraft_positions!r}")
        if not isinstance(self.predraft_tokens, int) or self.predraft_tokens < 0:
            fail(f"predraft_tokens must be an integer >= 0, got {self.predraft_tokens!r}")
        missing = self.fusion_blockers() if self.fuse else []
        if missing:
            fail(f"fuse needs {', '.join(missing)} (as in the lossless preset)")

    def block_size_choices(self) -> tuple[int, ...]:
        """The block sizes the engine may decode these settings with (``plan_block_sizes``, with
        ``block_size``), ascending; empty where only ``block_size`` applies: not ``plan="auto"``, no
        other sizes, or settings outside the lossless family, whose tokens would depend on the block."""
        if self.plan != "auto" or not self.plan_block_sizes or self.steps is not None:
            return ()
        if self.sub_block_size is not None or self.fusion_blockers():
            return ()
        return tuple(sorted({self.block_size, *self.plan_block_sizes}))

    def fusion_blockers(self) -> list[str]:
        """What keeps fused verification from applying to these settings (empty: it applies)."""
        needs = {
            "decoder='s2d2'": self.decoder == "s2d2",
            "policy='always'": self.policy == "always",
            "strict acceptance": self.strict,
            "causal_cache=true": self.causal_cache,
            "one token per step (steps = block_size)": self.num_steps == self.block_size,
            "no sub-blocks": self.sub_block_size in (None, self.block_size),
            "no token editing": self.editing_threshold is None,
        }
        return [k for k, ok in needs.items() if not ok]


def preset_settings(preset: str) -> dict[str, Any]:
    """The settings of a named preset or of a preset file (a copy); an unknown one is a ``ConfigError``."""
    if not isinstance(preset, str) or not preset:
        raise ConfigError(f"preset must be a name or a .json file, got {preset!r}")
    if preset in PRESETS:
        return dict(PRESETS[preset])
    from .tuning.preset_file import looks_like_preset_file, read_preset_file

    if looks_like_preset_file(preset):
        return read_preset_file(preset).settings
    raise ConfigError(
        f"unknown preset {preset!r}; choose one of: {', '.join(sorted(PRESETS))}, or give a PRESET.json file"
    )


_FAST_DLLM_V2: dict[str, Any] = dict(
    decoder="s2d2", block_size=32, steps=None, threshold=0.9, fallback="dynamic", last_block="full"
)
_FAST_DLLM_V2_HYSTERESIS: dict[str, Any] = dict(
    policy="hysteresis", score="dynamic", penalty=1.0, hysteresis_on=1.0, hysteresis_off=-5.0
)
_LLADA2: dict[str, Any] = dict(
    decoder="s2d2",
    block_size=32,
    steps=None,
    fallback="dynamic",
    policy="score",
    score="static",
    penalty=4.0,
    last_block="full",
)

_LOSSLESS: dict[str, Any] = dict(
    decoder="s2d2",
    steps=None,
    policy="always",
    acceptance="auto",
    fallback="static",
    causal_cache=True,
    temperature=0.0,
)

#: Named presets: partial settings applied before the user's own. The paper presets decode the last block
#: whole (``last_block="full"``), as the families' reference decoders that produced the paper's figures do.
PRESETS: dict[str, dict[str, Any]] = {
    # SDAR-8B, B=4: score threshold 0 with a static penalty c=1, soft-entropy estimator.
    "paper-sdar-a": dict(
        decoder="s2d2",
        block_size=4,
        steps=4,
        policy="score",
        score="static",
        penalty=1.0,
        score_threshold=0.0,
        estimator="soft-entropy",
        fallback="dynamic",
        threshold=0.85,
        causal_cache=True,
        last_block="full",
    ),
    # SDAR-8B, B=16: verify on every step.
    "paper-sdar-b": dict(
        decoder="s2d2",
        block_size=16,
        steps=16,
        policy="always",
        fallback="dynamic",
        threshold=0.85,
        causal_cache=True,
        last_block="full",
    ),
    # Fast-dLLM v2 7B (block 32, tau 0.9): sub-blocks of 4 or 16 with hysteresis routing (on 1, off -5,
    # dynamic score, c = 1); whole 32-token sub-blocks with a minimum span of 8.
    "paper-fast-dllm-v2-sub4": dict(_FAST_DLLM_V2, sub_block_size=4, **_FAST_DLLM_V2_HYSTERESIS),
    "paper-fast-dllm-v2-sub16": dict(_FAST_DLLM_V2, sub_block_size=16, **_FAST_DLLM_V2_HYSTERESIS),
    "paper-fast-dllm-v2-sub32": dict(_FAST_DLLM_V2, sub_block_size=32, policy="min-span", min_span=8),
    # LLaDA2.1-Mini (block 32) with token editing: conservative (mask tau 0.95, edit tau 0.9, score
    # threshold -5) and quality (mask tau 0.7, edit tau 0.5, score threshold 0); static score, c = 4.
    "paper-llada2-conservative": dict(_LLADA2, threshold=0.95, editing_threshold=0.9, score_threshold=-5.0),
    "paper-llada2-quality": dict(_LLADA2, threshold=0.7, editing_threshold=0.5, score_threshold=0.0),
    # Output equals AR greedy decoding token for token, at any block size.
    "lossless": _LOSSLESS,
    # The same output in about one forward per step: verification forwards carry the next step's drafts.
    "lossless-fused": dict(_LOSSLESS, fuse=True, predraft_positions=4, predraft_tokens=0),
    # The same output again; the engine's planner chooses each step's verification by its cost.
    "lossless-auto": dict(
        _LOSSLESS, fuse=True, predraft_positions=4, predraft_tokens=0, plan="auto", plan_block_sizes=(8, 16)
    ),
}
