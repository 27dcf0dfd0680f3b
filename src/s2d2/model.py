"""Public API: ``s2d2.load(...)`` and ``model.generate(...)``."""

from __future__ import annotations

import atexit
import gc
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .applicability import refuse_for_family
from .config import DecodeConfig, checked_preset_file
from .constraints import CompiledConstraint, GrammarCache, OutputConstraint, constraint_of
from .cost.profile import resolve_cost_profile
from .cost.step_cost import StepCost
from .decoding.stats import GenerationStats
from .engine.llm_engine import LLMEngine
from .engine.outputs import DecodeOutput
from .engine.request import check_prompt
from .engine.request_limits import default_max_query_tokens_per_row
from .errors import ConfigError, PromptError, S2D2Error
from .families import ModelAdapter
from .families.tokenizer import load_tokenizer, text_ids, without_mask
from .forward.kv_pool import DEFAULT_PAGE_SIZE
from .generation_result import GenerationResult
from .model_source import BUILTIN_MODELS, builtin_path, resolve_model_path  # noqa: F401 - re-exported
from .parallel import load_parallel
from .presets import MODEL_PRESET_FILE, PresetFile
from .scoring.likelihoods import Likelihoods
from .word_pieces import continuation_prefix, decoded

DEFAULT_MODEL = "tiny-gsm"
#: Keywords of ``generate`` / ``generate_batch`` (and request files) that ask for structured output.
CONSTRAINT_KEYS = ("response_format", "json_schema", "regex", "choice", "grammar")
#: Rows the engine decodes together unless ``s2d2.load(..., max_num_seqs=N)`` says otherwise.
DEFAULT_MAX_NUM_SEQS = 16


class UnknownWordsWarning(UserWarning):
    """A prompt holds words the model's tokenizer does not know (they become its unknown token)."""


class S2D2Model(Likelihoods):
    """A block-diffusion model ready to decode (and to score: :class:`~s2d2.scoring.Likelihoods`): an
    adapter plus (optionally) its tokenizer."""

    def __init__(
        self,
        adapter: ModelAdapter,
        tokenizer: Any | None = None,
        path: Path | None = None,
        name: str | None = None,
        *,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        kv_budget_tokens: int | None = None,
        preset: PresetFile | None = None,
        max_query_tokens_per_row: int | None = None,
        cost: StepCost | None = None,
        prefix_cache: bool = True,
        kv_page_size: int = DEFAULT_PAGE_SIZE,
        max_num_batched_tokens: int | None = None,
    ):
        self.adapter = adapter
        #: KV memory: reuse cached prompt prefixes across requests; positions a page
        self.prefix_cache, self.kv_page_size = prefix_cache, kv_page_size
        #: most query tokens of one engine step, all rows together (the step planner keeps it)
        self.max_num_batched_tokens = max_num_batched_tokens
        #: the engine's step-cost profile (:mod:`s2d2.cost.step_cost`), if any
        self.cost = cost
        #: the checkpoint's own default decoding settings (its ``s2d2_preset.json``), if any
        self.preset = preset
        self.tokenizer = tokenizer
        self.path = path
        self.name = name or (str(path) if path else adapter.info.family)
        if max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if kv_budget_tokens is not None and kv_budget_tokens < 1:
            raise ConfigError(f"kv_budget_tokens must be >= 1, got {kv_budget_tokens}")
        self.max_num_seqs = max_num_seqs
        self.kv_budget_tokens = kv_budget_tokens
        if max_query_tokens_per_row is not None and max_query_tokens_per_row < 1:
            raise ConfigError(f"max_query_tokens_per_row must be >= 1, got {max_query_tokens_per_row}")
        if max_query_tokens_per_row is None:  # the default: the shipped presets and this model's own fit
            own = [preset.settings] if preset is not None else []
            max_query_tokens_per_row = default_max_query_tokens_per_row(adapter.info.default_block_size, own)
        #: the engine's bound on query tokens per row and forward (:mod:`s2d2.engine.request_limits`)
        self.max_query_tokens_per_row = max_query_tokens_per_row
        self._engine: LLMEngine | None = None
        self._grammars: GrammarCache | None = None

    @property
    def engine(self) -> LLMEngine:
        """The batched engine every generation of this model runs on (made at first use)."""
        if self._engine is None:
            self._engine = LLMEngine(
                self.adapter,
                max_num_seqs=self.max_num_seqs,
                kv_budget_tokens=self.kv_budget_tokens,
                max_query_tokens_per_row=self.max_query_tokens_per_row,
                cost=self.cost,
                prefix_cache=self.prefix_cache,
                kv_page_size=self.kv_page_size,
                max_num_batched_tokens=self.max_num_batched_tokens,
                capture_graphs=True,
            )
            self._engine.routing.detokenize = self.decode_ids if self.tokenizer else None  # syntax checks
        return self._engine

    def engine_stats(self) -> dict[str, float]:
        """The engine's counters (:meth:`~s2d2.engine.llm_engine.LLMEngine.stats`): forwards, rows and
        step times, and its KV memory: ``kv_pages_used``, ``kv_pages_free``, ``kv_pages_cached``,
        ``prefix_hit_rate`` (prompt positions reused / looked up), ``preemptions``."""
        return self.engine.stats()

    @property
    def info(self):
        return self.adapter.info

    def checkpoint_config(self) -> DecodeConfig:
        """The library's defaults adapted to the checkpoint: its block size and its sampling defaults
        (``generation_config.json``'s, unless loaded with ``generation_config="vllm"``)."""
        bs = self.info.default_block_size
        return DecodeConfig(**self.info.generation_defaults, **({"block_size": int(bs)} if bs else {}))

    def default_config(self) -> DecodeConfig:
        """This model's default settings: :meth:`checkpoint_config` with the model's preset applied."""
        if self.preset is None:
            return self.checkpoint_config()
        return DecodeConfig.build(self.checkpoint_config(), **self.preset.settings)

    # ------------------------------------------------------------------ text <-> ids
    def encode(self, prompt: str, *, chat: bool = False) -> list[int]:
        if self.tokenizer is None:
            raise PromptError(f"model {self.name} has no tokenizer: pass token ids instead of text")
        if chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise PromptError(f"model {self.name} has no chat template; drop --chat")
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return without_mask(self.tokenizer, ids, self.info.mask_token_id)
        enc = text_ids(self.tokenizer, prompt, return_offsets_mapping=True)
        ids = [int(i) for i in enc["input_ids"]]
        self._warn_unknown_words(prompt, ids, enc.get("offset_mapping"))
        return ids

    def _warn_unknown_words(self, prompt: str, ids: list[int], offsets: Any) -> None:
        """Warn (once per prompt) when the tokenizer read words of ``prompt`` as its unknown token."""
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if unk is None or unk not in ids:
            return
        words = [prompt[a:b] for i, (a, b) in zip(ids, offsets or [], strict=False) if i == unk]
        names = ", ".join(dict.fromkeys(repr(w) for w in words)) or "some words"
        warnings.warn(
            f"the prompt holds words outside the vocabulary of model {self.name}: {names}; it reads them "
            "as an unknown token, so the answer is unlikely to mean anything",
            UnknownWordsWarning,
            stacklevel=5,
        )

    def decode_ids(self, ids: Sequence[int], skip_special_tokens: bool = True, drop_stop: bool = True) -> str:
        """The text of ``ids``, a last EOS (the stop that ended an output) left out unless ``drop_stop``."""
        ids = list(ids)
        if drop_stop and ids and ids[-1] in self.info.eos_token_ids:
            ids = ids[:-1]
        if self.tokenizer is None:
            return " ".join(str(i) for i in ids)
        if not hasattr(self, "_piece_prefix"):
            self._piece_prefix = continuation_prefix(self.tokenizer)
        return decoded(self.tokenizer, ids, self._piece_prefix, skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ structured output
    def compile_constraint(self, constraint: OutputConstraint | None) -> CompiledConstraint | None:
        """``constraint`` compiled for this model's tokenizer (cached: once per distinct constraint)."""
        if constraint is None:
            return None
        if self._grammars is None:
            self._grammars = GrammarCache(self.tokenizer, self.info.vocab_size, self.info.eos_token_ids)
        return self._grammars.compile(constraint)

    def _pop_constraint(self, settings: dict[str, Any]) -> CompiledConstraint | None:
        """Take the structured-output keywords out of ``settings``; their compiled constraint, if any."""
        given = {k: settings.pop(k) for k in CONSTRAINT_KEYS if k in settings}
        return self.compile_constraint(constraint_of(**given))

    # ------------------------------------------------------------------ generation
    def make_config(self, config: DecodeConfig | None = None, **settings: Any) -> DecodeConfig:
        """``config`` (default: :meth:`default_config`) with a preset and explicit settings on top.

        An explicit ``preset`` (a name or a PRESET.json file) replaces the model's own preset; explicit
        settings win over both. Settings that cannot apply (to this family, or a preset's fusion with
        explicit settings that exclude it) are a one-line :class:`ConfigError` (:mod:`s2d2.applicability`).
        """
        preset = settings.pop("preset", None)
        if config is None:
            config = self.default_config() if preset is None else self.checkpoint_config()
        cfg = DecodeConfig.build(config, preset=preset, **settings)
        refuse_for_family(cfg, self.adapter.info)
        return cfg

    def _ids(self, prompt: str | Sequence[int] | torch.Tensor, chat: bool) -> list[int]:
        if isinstance(prompt, str):
            return self.encode(prompt, chat=chat)
        if isinstance(prompt, torch.Tensor):
            return prompt.view(-1).tolist()
        return list(prompt)

    def _result(self, out: DecodeOutput, cfg: DecodeConfig) -> GenerationResult:
        return GenerationResult(
            text=self.decode_ids(out.token_ids),
            token_ids=out.token_ids,
            stats=out.stats,
            trace=out.trace,
            config=cfg,
            logprobs=out.logprobs,
        )

    def generate(
        self,
        prompt: str | Sequence[int],
        config: DecodeConfig | None = None,
        *,
        chat: bool = False,
        **settings: Any,
    ) -> GenerationResult:
        """Decode a continuation of ``prompt`` (text, or token ids).

        ``settings`` use the CLI flags' names with underscores (``decoder``, ``preset``, ``block_size``,
        ``steps``, ``threshold``, ``policy``, ``estimator``, ``max_new_tokens``, ``temperature``,
        ``top_k``, ``top_p``, ``seed``, ...); they override ``config`` and the preset.

        Structured output (at most one): ``response_format`` (OpenAI's ``{"type": "json_object"}`` or
        ``{"type": "json_schema", "json_schema": {"schema": ...}}``), ``json_schema`` (a dict or JSON
        text), ``regex``, ``choice`` (a list of strings) or ``grammar`` (EBNF); see :mod:`s2d2.constraints`.
        """
        settings = dict(settings)
        constraint = self._pop_constraint(settings)
        cfg = self.make_config(config, **settings)
        out = self.engine.generate([self._ids(prompt, chat)], [cfg], constraints=[constraint])[0]
        if out.exception is not None:
            raise out.exception
        return self._result(out, cfg)

    def generate_batch(
        self,
        prompts: Sequence[str | Sequence[int]],
        config: DecodeConfig | None = None,
        *,
        chat: bool = False,
        per_request: Sequence[dict[str, Any]] | None = None,
        errors: str = "raise",
        on_finish: Any = None,
        **settings: Any,
    ) -> list[GenerationResult]:
        """Decode many prompts together on the batched engine; results in input order.

        ``settings`` apply to every prompt; ``per_request[i]`` (optional) adds prompt i's own settings
        (any decoding setting, ``preset`` included; they win over ``settings``). Each request keeps its own
        random generator, so a seeded request gives the same tokens alone and in any batch. With
        ``errors="raise"`` the first bad prompt or setting raises before anything runs; with
        ``errors="return"`` it gives a result with ``error`` set and the others decode.
        ``on_finish(index, result)`` is called as each request ends (progress bars)."""
        if errors not in ("raise", "return"):
            raise ConfigError(f"errors must be 'raise' or 'return', got {errors!r}")
        if per_request is not None and len(per_request) != len(prompts):
            raise ConfigError(f"per_request has {len(per_request)} entries for {len(prompts)} prompts")
        cfgs: list[DecodeConfig | None] = []
        grammars: list[CompiledConstraint | None] = []
        ids: list[list[int] | None] = []
        failed: dict[int, str] = {}
        for i, prompt in enumerate(prompts):
            cfg, prompt_ids, grammar = None, None, None
            try:
                own = {**settings, **(per_request[i] if per_request else {})}
                grammar = self._pop_constraint(own)
                cfg = self.make_config(config, **own)
                prompt_ids = check_prompt(self._ids(prompt, chat), self.info).tolist()
            except S2D2Error as exc:
                if errors == "raise":
                    raise
                failed[i] = str(exc)
            cfgs.append(cfg)
            grammars.append(grammar)
            ids.append(prompt_ids)
        live = [i for i in range(len(prompts)) if i not in failed]
        results: list[GenerationResult | None] = [None] * len(prompts)
        for i, msg in failed.items():
            results[i] = GenerationResult("", [], GenerationStats(), error=msg)
            if on_finish is not None:
                on_finish(i, results[i])

        def done(j: int, out: DecodeOutput) -> None:
            i = live[j]
            if out.error is not None and errors == "raise":
                raise out.exception if out.exception is not None else S2D2Error(out.error)
            res = (
                self._result(out, cfgs[i])
                if out.error is None
                else GenerationResult("", [], out.stats, error=out.error)
            )
            results[i] = res
            if on_finish is not None:
                on_finish(i, res)

        self.engine.generate(
            [ids[i] for i in live],
            [cfgs[i] for i in live],
            on_finish=done,
            constraints=[grammars[i] for i in live],
        )
        return results  # type: ignore[return-value]


def freeze_loaded_heap() -> None:
    """Move every object alive now (the loaded model's modules, weights and tokenizer) out of the cyclic
    garbage collector's view (``gc.freeze``), so its full collections stop rescanning them (a pause of
    every row of the batch otherwise); reference counting still frees them. For processes that load a
    model once and decode for long (the server, the benchmark commands); not called by :func:`load`
    (cyclic garbage among frozen objects is never collected). At exit they go back to the collector, so
    shutdown frees them (else triton's nanobind bindings report dozens of "leaked" lines)."""
    gc.freeze()
    atexit.register(gc.unfreeze)


def load(
    name_or_path: str | os.PathLike[str] = DEFAULT_MODEL,
    *,
    device: str | None = None,
    dtype: str | None = None,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    kv_budget_tokens: int | None = None,
    use_preset: bool = True,
    max_query_tokens_per_row: int | None = None,
    cost_profile: str | os.PathLike[str] | None = None,
    prefix_cache: bool = True,
    kv_page_size: int = DEFAULT_PAGE_SIZE,
    max_num_batched_tokens: int | None = None,
    revision: str | None = None,
    enforce_eager: bool = False,
    tensor_parallel_size: int = 1,
    distributed_executor_backend: str = "mp",
    block_size: int | None = None,
    generation_config: str | os.PathLike[str] = "auto",
    **options: Any,
) -> S2D2Model:
    """Load a block-diffusion model: a built-in name (``tiny-gsm``), a local checkpoint directory or a
    Hugging Face Hub repository (``ORG/NAME``, at ``revision``; from the cache, or downloaded unless
    ``HF_HUB_OFFLINE=1``; see :mod:`s2d2.model_source`).

    The family is detected from ``config.json``; no remote code runs; weights are read from safetensors;
    stop ids, block size (``block_size`` overrides) and mask id come from the side files
    (:mod:`s2d2.families.checkpoint_facts`), and ``generation_config.json``'s sampling fields are the
    defaults of a request that omits them (``generation_config="vllm"`` or ``"off"``: not).
    ``device``: cpu | cuda (default: cuda if available); ``dtype``: bf16 | fp16 | fp32 (default: fp32 on
    CPU, bf16 on CUDA). ``max_num_seqs`` bounds the rows the batched engine decodes together,
    ``kv_budget_tokens`` the cached positions they hold together (pages of ``kv_page_size`` positions;
    the newest row is preempted, then resumed, when they run out), ``prefix_cache`` whether requests
    reuse the cached pages of an equal prompt prefix, ``max_query_tokens_per_row`` the query tokens one
    row may feed to one forward; ``options`` go to the family's loader. A checkpoint directory holding
    ``s2d2_preset.json`` (a preset file) gets those settings as its defaults (explicit settings and
    ``preset=`` still win; ``use_preset=False`` ignores it). ``cost_profile``: a measured step-cost
    profile file (calibrated and written when missing) or ``roofline:h200`` / ``roofline:a100``; see
    :mod:`s2d2.cost.step_cost` (without one, an accelerator's profile is measured on first use and cached;
    the CPU plans with :data:`s2d2.cost.generic.GENERIC_COST`). ``max_num_batched_tokens``: most query
    tokens of one engine step over all rows (as vLLM's). ``enforce_eager``: run every forward eagerly
    (by default CUDA forwards are captured as graphs, :mod:`s2d2.forward.graph_runner`).
    ``tensor_parallel_size``: ranks (a GPU each on CUDA) the model is split over;
    ``distributed_executor_backend``: ``mp`` or ``ray`` (:mod:`s2d2.parallel`).
    """
    path = resolve_model_path(name_or_path, revision)
    preset_path = path / MODEL_PRESET_FILE  # read first: a broken preset file fails before the slow load
    preset = checked_preset_file(preset_path) if use_preset and preset_path.is_file() else None
    options.update(block_size=block_size, generation_config=str(generation_config), name=str(name_or_path))
    adapter = load_parallel(path, tensor_parallel_size, device=device, dtype=dtype,
                            backend=distributed_executor_backend, **options)  # fmt: skip
    if getattr(adapter, "fast", None) is not None:
        adapter.fast.enforce_eager = enforce_eager
    tokenizer = load_tokenizer(path)
    name = str(name_or_path)
    cost = resolve_cost_profile(cost_profile, adapter, model_path=path, model_name=name)
    return S2D2Model(
        adapter,
        tokenizer,
        path,
        name=name,
        max_num_seqs=max_num_seqs,
        kv_budget_tokens=kv_budget_tokens,
        preset=preset,
        max_query_tokens_per_row=max_query_tokens_per_row,
        cost=cost,
        prefix_cache=prefix_cache,
        kv_page_size=kv_page_size,
        max_num_batched_tokens=max_num_batched_tokens,
    )
