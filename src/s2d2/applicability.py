"""Settings that cannot apply, refused one way: a one-line :class:`~s2d2.errors.ConfigError`.

Two checks, used wherever settings meet a model or a preset:

* :func:`refuse_for_family` (here): a setting the model's family cannot run (fused verification on a
  shifted-prediction family, Fast-dLLM v2). Called by ``S2D2Model.make_config`` (so the command line,
  the server and lm-eval refuse before any work) and by the engine's admission for every request.
* :func:`s2d2.config.check_inherited_fusion`: fused verification that came with settings rather than
  being asked for, where the explicit settings exclude it (``DecodeConfig.build``). Fusion named by a preset
  (``lossless-fused``, ``lossless-auto``, a preset file) is asked for: with, say, ``editing_threshold``
  or ``policy="score"`` it is refused, never dropped silently. Two cases give way, as documented: the
  model's own defaults (its ``s2d2_preset.json``) yield to explicit settings, and a lossless preset's
  ``acceptance="auto"`` samples unfused at temperature > 0 (speculative sampling has no fused form).
"""

from __future__ import annotations

from .config import DecodeConfig
from .errors import ConfigError
from .families.base import ModelInfo

__all__ = ["refuse_for_family"]


def refuse_for_family(config: DecodeConfig, info: ModelInfo) -> None:
    """Raise a one-line :class:`ConfigError` if ``config`` asks for what ``info``'s family cannot run."""
    if config.fuse and info.shifted:
        raise ConfigError(
            f"fuse (fused verification) does not apply to {info.family} models (shifted predictions): their "
            "verification is a plain causal forward with no 2L layout to carry pre-drafts; set fuse=false "
            "or use the preset 'lossless'"
        )
