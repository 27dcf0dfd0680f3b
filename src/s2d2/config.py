"""Decoding settings: one validated dataclass, plus named presets.

Every setting uses the CLI flag's name with underscores (``--block-size`` -> ``block_size``).
``DecodeConfig.build(preset=..., **settings)`` merges a preset with explicit settings (explicit wins)
and validates the result; invalid or contradictory settings raise :class:`~s2d2.errors.ConfigError`
with a one-line message.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .presets import PRESETS, PresetFile, looks_like_preset_file, read_preset_file
from .setting_checks import check_settings
from .setting_ranges import MAX_TEMPERATURE, MAX_TOP_LOGPROBS, MIN_TEMPERATURE  # noqa: F401 - re-exported

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
UCB_SCOPES = ("request", "engine")
UCB_REWARDS = ("auto", "committed", "checked")
UCB_ENTROPY_SCALES = ("auto", "linear", "log")
#: ``fixed``: every step decodes as the settings say; ``auto``: the engine's cost-aware planner chooses each
#: verification (s2d2.engine.planner.step_planner)
PLANS = ("fixed", "auto")
#: The routing policies by name; :data:`s2d2.decoding.policies.POLICIES` registers one class for each
#: (asserted there), so the settings never import the decoders.
POLICY_NAMES = ("never", "always", "min-span", "score", "hysteresis", "ucb", "syntax")

#: Each categorical setting's options (checked by :meth:`DecodeConfig.validate`).
CHOICES: dict[str, tuple[str, ...]] = {
    "decoder": DECODERS,
    "fallback": FALLBACKS,
    "policy": POLICY_NAMES,
    "estimator": ESTIMATORS,
    "score": SCORES,
    "acceptance": ACCEPTANCE,
    "last_block": LAST_BLOCK,
    "ucb_scope": UCB_SCOPES,
    "ucb_reward": UCB_REWARDS,
    "ucb_entropy_scale": UCB_ENTROPY_SCALES,
    "plan": PLANS,
}

#: Default parameter of each acceptance estimator (docs/METHOD.md section 4).
ESTIMATOR_DEFAULTS: dict[str, float | None] = {
    "hard-margin": 0.05,
    "hard-entropy": 0.1,
    "confidence-power": 0.8,
    "clipped-margin": 1.0,
    "soft-entropy": 1.0,
    "renyi2": None,
}


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
    #: ``syntax`` policy: the language of the static checks (:mod:`s2d2.codecheck`; ``python``).
    syntax_language: str = "python"
    #: ``syntax`` policy: also verify a span with a key position (a line's first token, a name after
    #: ``def``/``return``/``=``, an operator, a closing bracket) whose acceptance estimate is below
    #: ``key_confidence``.
    key_positions: bool = False
    key_confidence: float = 0.9
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
    #: Drop tokens whose probability is below ``min_p`` times the most likely one's (0 = off; vLLM's).
    min_p: float = 0.0
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
    #: vLLM's: a logit of a token in the prompt or the output so far is divided by it (if positive) or
    #: multiplied by it (if negative); 1 = off, in (0, 2].
    repetition_penalty: float = 1.0
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
    #: verification forwards cost at most :data:`s2d2.engine.planner.block_size.TOLERANCE` more than the
    #: smallest's (while a forward is bound by reading the weights, as on a GPU at low load, a bigger
    #: block is free). The tokens are AR greedy's whichever is chosen. Empty: ``block_size`` always.
    plan_block_sizes: tuple[int, ...] = ()
    #: Structured output (jump-forward): tokens the grammar forces (it allows exactly one) are committed
    #: without a forward, and forced drafts are set to them before verification; the tokens are unchanged.
    jump_forward: bool = True
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
        existing file; see :mod:`s2d2.presets`).

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
            # a model's own defaults give way to explicit settings fusion does not apply to (e.g. --decoder
            # ar on a model whose preset fuses); a named preset's fusion is refused (s2d2.applicability)
            check_inherited_fusion(cfg, preset)
            cfg.fuse = False
        cfg.validate()
        return cfg

    def replace(self, **settings: Any) -> DecodeConfig:
        return DecodeConfig.build(self, **settings)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise a one-line :class:`ConfigError` for the first invalid or contradictory setting
        (:func:`s2d2.setting_checks.check_settings`, against :data:`CHOICES`)."""
        check_settings(self, CHOICES)

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


def check_inherited_fusion(config: DecodeConfig, preset: str | None) -> None:
    """``config`` fuses without ``fuse`` being given and its other settings exclude fusion: return if that
    fusion gives way (the model's defaults, or sampling under ``acceptance="auto"``), else raise a one-line
    :class:`ConfigError` naming the preset and what fusion needs."""
    if preset is None:
        return
    needs = config.fusion_blockers()
    if needs == ["strict acceptance"] and config.acceptance == "auto":
        return
    raise ConfigError(
        f"fuse (fused verification, from the preset {preset!r}) needs {', '.join(needs)}; "
        "set fuse=false or use the preset 'lossless'"
    )


def preset_settings(preset: str) -> dict[str, Any]:
    """The settings of a named preset or of a preset file (a copy); an unknown one is a ``ConfigError``."""
    if not isinstance(preset, str) or not preset:
        raise ConfigError(f"preset must be a name or a .json file, got {preset!r}")
    if preset in PRESETS:
        return dict(PRESETS[preset])
    if looks_like_preset_file(preset):
        return checked_preset_file(preset).settings
    raise ConfigError(
        f"unknown preset {preset!r}; choose one of: {', '.join(sorted(PRESETS))}, or give a PRESET.json file"
    )


#: Preset files whose settings were checked, by (path, settings as JSON): a batch builds a config a request.
_CHECKED: set[tuple[str, str]] = set()


def checked_preset_file(path: str | os.PathLike[str]) -> PresetFile:
    """Read a preset file and check its settings: the one place a preset file's settings are validated.

    Every name must be a decoding setting and the settings must be valid on their own; any problem is one
    ``ConfigError`` line naming the file.
    """
    pf = read_preset_file(path)
    key = (str(pf.path), json.dumps(pf.settings, sort_keys=True, default=str))
    if key in _CHECKED:
        return pf

    def fail(reason: str) -> ConfigError:
        return ConfigError(f"preset file {pf.path}: {reason}")

    names = {f.name for f in dataclasses.fields(DecodeConfig)}
    for name in pf.settings:
        if name not in names:
            raise fail(f'unknown decoding setting {name!r} in "settings"')
    try:
        DecodeConfig.build(**{k: v for k, v in pf.settings.items() if v is not None})
    except (ConfigError, TypeError, ValueError) as exc:
        raise fail(f"invalid settings: {exc}") from None
    _CHECKED.clear() if len(_CHECKED) > 64 else None
    _CHECKED.add(key)
    return pf
