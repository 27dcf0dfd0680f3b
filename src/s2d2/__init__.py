"""s2d2: fast, training-free self-speculative decoding (S2D2) for block-diffusion language models."""

from . import moved_modules
from .config import DecodeConfig
from .decoding.stats import GenerationStats, StepTrace
from .errors import ConfigError, ModelLoadError, PromptError, S2D2Error
from .model import GenerationResult, S2D2Model, load
from .presets import PRESETS

__version__ = "0.1.0"

moved_modules.install()

__all__ = [
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
