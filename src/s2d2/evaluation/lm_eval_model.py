"""lm-evaluation-harness integration: the model ``s2d2``.

Importing this module registers :class:`S2D2LM` with lm-eval as ``s2d2`` (lm-eval's own models stay
available). From Python::

    import lm_eval
    import s2d2.evaluation.lm_eval_model  # registers "s2d2"
    from lm_eval.tasks import TaskManager

    lm_eval.simple_evaluate(
        model="s2d2",
        model_args="model=/path/to/checkpoint,preset=lossless,block_size=8",
        tasks=["my_task"],
        task_manager=TaskManager(include_path="my_tasks/"),
    )

From the command line: ``s2d2 lm-eval --model s2d2 --model_args model=DIR,preset=lossless,block_size=8
--tasks my_task --include_path my_tasks/`` (every argument goes to lm-eval's own CLI).

model_args: ``model`` (or ``pretrained``): a built-in name, checkpoint directory or Hugging Face repository
``ORG/NAME`` (default ``tiny-gsm``); ``revision`` (a Hub repository's branch, tag or commit); ``device``,
``dtype``; every other key is a decoding setting (``decoder``, ``preset``, ``block_size``, ``steps``,
``threshold``, ``policy``, ``estimator``, ``temperature``, ...), with values parsed to ints, floats and
booleans where they look like them.

* ``generate_until``: the requests decode on the batched engine (:meth:`s2d2.S2D2Model.generate_batch`),
  ``batch_size`` rows at a time (the same outputs as one at a time); stop strings (``until``) trim the
  generated text, ``max_gen_toks`` sets ``max_new_tokens``, and ``do_sample`` / ``temperature`` /
  ``top_p`` / ``top_k`` override the sampling settings.
* ``loglikelihood`` (``multiple_choice`` tasks) and ``loglikelihood_rolling`` (perplexity): the model's
  exact AR-mode (block size 1) log-likelihoods (:meth:`s2d2.S2D2Model.score`), the text split, truncated
  and windowed as lm-eval's HF model does it; requests sharing a context share its forward.

``batch_size`` (lm-eval's ``--batch_size``): the engine's rows for generation, requests per scoring call
for likelihoods; requests go longest first as lm-eval's own models sort them. ``auto``: 16 rows
(``s2d2.model.DEFAULT_MAX_NUM_SEQS``) and the scorer's own packing. ``--apply_chat_template`` works where
the tokenizer has a chat template.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any

from lm_eval.api.model import LM
from lm_eval.models.utils import Collator
from tqdm import tqdm

from ..decoding.stats import GenerationStats
from ..errors import S2D2Error

__all__ = ["S2D2LM", "parse_batch_size", "parse_value", "register", "run_cli"]

log = logging.getLogger(__name__)

#: Keys of model_args that are not decoding settings.
_LOAD_KEYS = ("model", "pretrained", "revision", "device", "dtype")
#: Keys lm-eval adds or that other models take; accepted and ignored.
_IGNORED_KEYS = ("max_batch_size", "trust_remote_code", "parallelize", "max_length")
#: Requests per scoring call with ``batch_size=auto`` (the scorer packs its forwards by its own budget).
AUTO_SCORE_BATCH = 256

_INT = re.compile(r"^[+-]?\d+$")


def parse_value(value: Any) -> Any:
    """A model_args value as int / float / bool / None where the string looks like one, else unchanged."""
    if not isinstance(value, str):
        return value
    s = value.strip()
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if _INT.match(s):
        return int(s)
    try:
        return float(s)
    except ValueError:
        return s


def parse_batch_size(value: Any) -> int | None:
    """lm-eval's ``batch_size``: an integer >= 1, or ``auto`` / ``auto:N`` (None: automatic)."""
    parsed = parse_value(value)
    if parsed is None or (isinstance(parsed, str) and parsed.lower().split(":")[0] == "auto"):
        return None
    if isinstance(parsed, bool) or not isinstance(parsed, int) or parsed < 1:
        raise S2D2Error(f"batch_size must be an integer >= 1 or 'auto', got {value!r}")
    return parsed


def _as_list(until: Any) -> list[str]:
    if until is None:
        return []
    if isinstance(until, str):
        return [until]
    return [str(u) for u in until]


def trim_at_stops(text: str, stops: list[str]) -> str:
    """``text`` up to the earliest occurrence of any stop string."""
    cut = len(text)
    for s in stops:
        if s:
            i = text.find(s)
            if 0 <= i < cut:
                cut = i
    return text[:cut]


class S2D2LM(LM):
    """An s2d2 model for lm-eval: ``generate_until`` through :meth:`s2d2.S2D2Model.generate`."""

    def __init__(
        self,
        model: str | None = None,
        pretrained: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        revision: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        from ..model import load

        name = model if model is not None else pretrained
        name = str(name) if name is not None else "tiny-gsm"
        for key in _IGNORED_KEYS:
            kwargs.pop(key, None)
        #: requests per batch (None: automatic, see the module docstring)
        self.batch_size = parse_batch_size(kwargs.pop("batch_size", 1))
        settings = {k: parse_value(v) for k, v in kwargs.items()}
        device = self._pick_device(parse_value(device))
        rows = {} if self.batch_size is None else {"max_num_seqs": self.batch_size}
        if revision is not None:
            rows["revision"] = str(revision)
        for key in ("tensor_parallel_size", "distributed_executor_backend"):  # vLLM's model_args names
            if key in settings:
                rows[key] = settings.pop(key)
        self.model = load(name, device=device, dtype=None if dtype is None else str(dtype), **rows)
        self.config = self.model.make_config(**settings)  # invalid settings fail here, one line
        self.model_name = name
        self.totals = GenerationStats()
        self._warned: set[str] = set()

    @staticmethod
    def _pick_device(device: Any) -> str | None:
        """lm-eval passes ``cuda:0`` by default: fall back to automatic choice when CUDA is absent."""
        if device in (None, "", "auto"):
            return None
        device = str(device)
        if device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                # lm-eval's CLI passes cuda:0 unless told otherwise: only other requests deserve a warning
                report = log.info if device == "cuda:0" else log.warning
                report("s2d2: device %s requested but CUDA is not available; using the CPU", device)
                return "cpu"
        return device

    # ------------------------------------------------------------------ what lm-eval reads
    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    @property
    def tokenizer_name(self) -> str:
        tok = self.model.tokenizer
        return str(getattr(tok, "name_or_path", None) or self.model_name).replace("/", "__")

    @property
    def device(self) -> Any:
        return self.model.adapter.device if hasattr(self.model.adapter, "device") else None

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        tok = self.model.tokenizer
        return getattr(tok, "chat_template", None) or ""

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        tok = self.model.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise S2D2Error(f"model {self.model_name} has no chat template; drop --apply_chat_template")
        return tok.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )

    def get_model_info(self) -> dict[str, Any]:
        t = self.totals
        return {
            "s2d2_model": self.model_name,
            "s2d2_config": self.config.to_dict(),
            "s2d2_stats": {
                **t.to_dict(),
                "nfe_per_token": t.nfe_per_token,
                "tokens_per_forward": t.generated_tokens / t.nfe if t.nfe else 0.0,
                "acceptance_rate": t.acceptance_rate,
            },
        }

    # ------------------------------------------------------------------ requests
    def _settings_from(self, gen_kwargs: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        kw = dict(gen_kwargs or {})
        stops = _as_list(kw.pop("until", None))
        settings: dict[str, Any] = {}
        if "max_gen_toks" in kw:
            settings["max_new_tokens"] = int(kw.pop("max_gen_toks"))
        if "max_new_tokens" in kw:
            settings["max_new_tokens"] = int(kw.pop("max_new_tokens"))
        do_sample = kw.pop("do_sample", None)
        for key in ("temperature", "top_p", "top_k", "seed"):
            if key in kw:
                value = parse_value(kw.pop(key))
                if value is not None:
                    settings[key] = int(value) if key in ("top_k", "seed") else float(value)
        if do_sample is not None and not parse_value(do_sample):
            settings["temperature"] = 0.0  # greedy, as lm-eval's HF model does for do_sample=False
        for key in kw:
            if key not in self._warned:
                self._warned.add(key)
                log.warning("s2d2: ignoring generation setting %r=%r", key, kw[key])
        return stops, settings

    def _bar(self, total: int, desc: str, disable_tqdm: bool) -> tqdm:
        return tqdm(total=total, disable=disable_tqdm or self.rank != 0, desc=desc)

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Requests with the same generation settings, longest prompts first, decode on the batched engine
        (:meth:`s2d2.S2D2Model.generate_batch`) with ``batch_size`` rows at a time: a finished row's place
        goes to the next request at once."""
        args = [(req.args[0], req.args[1] if len(req.args) > 1 else {}) for req in requests]
        lengths = {context: len(self.model.encode(context)) for context, _ in args}
        groups = Collator(args, sort_fn=lambda a: (-lengths[a[0]], a[0]), group_by="gen_kwargs")
        outputs: list[str] = []
        with self._bar(len(args), "s2d2 generate_until", disable_tqdm) as bar:
            for group in groups.get_batched(n=0):  # n=0: each group whole
                stops, settings = self._settings_from(group[0][1])
                prompts = [c for c, _ in group]
                results = self.model.generate_batch(
                    prompts, self.config, on_finish=lambda *_: bar.update(1), **settings
                )
                for (context, gen_kwargs), result in zip(group, results, strict=True):
                    text = trim_at_stops(result.text, stops)
                    self.totals.add(result.stats)
                    self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                    outputs.append(text)
        t = self.totals
        if requests:
            print(
                f"[s2d2] {len(requests)} generations: {t.generated_tokens} tokens, {t.nfe} forwards "
                f"({t.nfe_per_token:.3f}/token), {t.seconds:.1f} s",
                file=sys.stderr,
            )
        return groups.get_original(outputs)

    def _score(self, pairs: list[tuple[list[int], list[int]]], desc: str, disable_tqdm: bool) -> list[Any]:
        """:meth:`s2d2.S2D2Model.score` of token pairs in batches, longest contexts first (requests with
        one context stay together, so they share its forward); results in input order."""
        batches = Collator(pairs, sort_fn=lambda p: (-len(p[0]), p[0], -len(p[1])))
        scores: list[Any] = []
        with self._bar(len(pairs), desc, disable_tqdm) as bar:
            for batch in batches.get_batched(n=self.batch_size or AUTO_SCORE_BATCH):
                scores += self.model.score(batch)
                bar.update(len(batch))
        return batches.get_original(scores)

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """Per ``(context, continuation)``: its AR-mode log-likelihood and whether it is all greedy."""
        args = [tuple(req.args[:2]) for req in requests]
        pairs = self.model.likelihood_requests(args)
        out = []
        for arg, s in zip(args, self._score(pairs, "s2d2 loglikelihood", disable_tqdm), strict=True):
            answer = (s.total, all(s.greedy))
            self.cache_hook.add_partial("loglikelihood", arg, answer)
            out.append(answer)
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Per text: the AR-mode log-likelihood of all its tokens, in disjoint windows of the context."""
        windows = [self.model.rolling_requests(req.args[0]) for req in requests]
        scores = iter(
            self._score([w for ws in windows for w in ws], "s2d2 loglikelihood_rolling", disable_tqdm)
        )
        out = []
        for req, ws in zip(requests, windows, strict=True):
            total = sum(next(scores).total for _ in ws)
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
            out.append(total)
        return out


def register(name: str = "s2d2") -> type[S2D2LM]:
    """Register :class:`S2D2LM` with lm-eval as ``name`` (idempotent); lm-eval's own models stay available."""
    import lm_eval.models  # noqa: F401 - registers lm-eval's models (it skips this once the registry is non-empty)
    from lm_eval.api.registry import model_registry

    current = model_registry.get(name, None)
    if current is None:
        model_registry.register(name)(S2D2LM)
    elif current is not S2D2LM and getattr(current, "__qualname__", None) != S2D2LM.__qualname__:
        raise S2D2Error(f"lm-eval already has a different model named {name!r}: {current}")
    return S2D2LM


def run_cli(argv: list[str]) -> None:
    """lm-eval's own command line with ``argv`` (as after ``lm-eval``) and the ``s2d2`` model registered."""
    register()
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        cli_evaluate()
    except S2D2Error:
        raise
    except (ValueError, KeyError, FileNotFoundError, NotImplementedError) as exc:
        if os.environ.get("S2D2_DEBUG"):
            raise
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise S2D2Error(f"lm-eval: {exc.__class__.__name__}: {msg}") from None
    finally:
        sys.argv = saved


register()
