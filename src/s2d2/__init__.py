"""s2d2: fast, training-free self-speculative decoding (S2D2) for block-diffusion language models."""

from .config import DecodeConfig
from .decoding.stats import GenerationStats, StepTrace
from .errors import ConfigError, ModelLoadError, PromptError, S2D2Error
from .model import GenerationResult, S2D2Model, load
from .presets import PRESETS
from .version import __version__

__all__ = [
    "__version__",
    "PRESETS",
    "ConfigError",
    "DecodeConfig",
    "GenerationResult",
    "GenerationStats",
    "ModelLoadError",
    "PromptError",
    "S2D2Error",
    "S2D2Model",
    "StepTrace",
    "load",
]
