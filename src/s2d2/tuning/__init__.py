"""Tuning S2D2's routing on a dev set (``s2d2 tune``) and the preset files it writes.

:mod:`.preset_file` (read/write preset JSON files) has no heavy imports; :mod:`.space` (the search space),
:mod:`.evaluate` (one batched dev run), :mod:`.study` (the Optuna study) and :mod:`.report` (plot and
table) import Optuna / matplotlib only where they need them.
"""

from .preset_file import MODEL_PRESET_FILE, PresetFile, read_preset_file, write_preset_file

__all__ = ["MODEL_PRESET_FILE", "PresetFile", "read_preset_file", "write_preset_file"]
