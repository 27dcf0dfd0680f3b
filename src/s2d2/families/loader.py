"""One loader for every family: a family is a :class:`FamilySpec` (what names it in ``config.json``, its
native transformers class and config, how its weights become the native ones, its rules where the files
are silent) and :func:`load` does the rest the same way for all: the options check, the config, the mask
id, whole or rank weights, the native model, and its :class:`~.base.ModelInfo`, built in one place
(:func:`~.checkpoint_facts.model_info`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError
from .checkpoint import matches_family
from .checkpoint_facts import CheckpointFacts, FamilyRules, model_info
from .hf import HFAdapter

#: ``weights(path, config, native, tp) -> (weights, build_config, prepare)``: the checkpoint's tensors under
#: the native class's names (a tensor-parallel rank's slices only where ``tp``), the config to build the
#: native model with (the rank's sizes under tensor parallelism) and what to do to it before loading
#: (None: nothing).
WeightsFn = Callable[[Path, dict[str, Any], Any, Any], tuple[dict[str, torch.Tensor], Any, Any]]


@dataclass(frozen=True)
class FamilySpec:
    """Everything :func:`load` needs to know about one family."""

    #: the family's name (``ModelInfo.family``, error messages)
    name: str
    #: how error messages name its config (``SDAR``: "is not a valid SDAR config")
    title: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    #: lower-cased remote-code module/class fragments named in ``auto_map``
    auto_map_names: tuple[str, ...]
    rules: FamilyRules
    #: the transformers class the family runs on (by name: transformers is imported when loading)
    native_class: str
    #: ``config.json`` -> the native class's config (raises KeyError/TypeError/ValueError on a bad one)
    native_config: Callable[[dict[str, Any]], Any]
    weights: WeightsFn
    #: ``config.json`` -> the checkpoint tensor names the family reads (``s2d2 info``)
    tensor_names: Callable[[dict[str, Any]], list[str]]
    adapter: type[HFAdapter] = HFAdapter
    #: options of ``load`` the family's adapter takes (keywords of its constructor)
    options: tuple[str, ...] = ()
    #: logits at position i-1 predict token i
    shifted: bool = False
    #: the positions it accepts where the config gives no ``max_position_embeddings``
    max_length: int = 32768

    def detect(self, config: dict[str, Any]) -> bool:
        """Whether ``config`` names this family."""
        return matches_family(config, self.model_types, self.architectures, self.auto_map_names)

    def parse_config(self, path: Path, config: dict[str, Any]) -> Any:
        """The native config, or a one-line :class:`ModelLoadError`."""
        try:
            return self.native_config(config)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(
                f"{path}/config.json is not a valid {self.title} config ({exc.__class__.__name__}: {exc})"
            ) from None


def load(
    spec: FamilySpec,
    path: Path,
    config: dict[str, Any],
    facts: CheckpointFacts,
    *,
    device: torch.device,
    dtype: torch.dtype,
    tp: Any = None,
    **options: Any,
) -> HFAdapter:
    """The adapter of checkpoint ``path`` of family ``spec`` (``tp``: this rank's tensor-parallel group)."""
    import transformers

    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        takes = f" (it takes {', '.join(spec.options)})" if spec.options else ""
        raise ModelLoadError(f"unknown option(s) for the {spec.name} family: {', '.join(unknown)}{takes}")
    native = spec.parse_config(path, config)
    mask_id = facts.require_mask(path, native.vocab_size)
    weights, build, prepare = spec.weights(path, config, native, tp)
    cls = getattr(transformers, spec.native_class)
    model = HFAdapter.build_native(cls, build, weights, path, device, dtype, prepare)
    info = model_info(spec.name, facts, config, mask_token_id=mask_id, vocab_size=native.vocab_size,
                      max_length=spec.max_length, shifted=spec.shifted)  # fmt: skip
    return spec.adapter(model, info, path, tp=tp, **options)
