"""Tuning S2D2's routing on a dev set (``s2d2 tune``) and the preset files it writes.

:mod:`s2d2.presets` (read/write preset JSON files; re-exported here) has no heavy imports; :mod:`.space`
(the search space), :mod:`.trial_eval` (one batched dev run), :mod:`.study` (the Optuna study) and
:mod:`.trial_report` (plot and table) import Optuna / matplotlib only where they need them.
"""

from ..presets import MODEL_PRESET_FILE, PresetFile, read_preset_file, write_preset_file

__all__ = ["MODEL_PRESET_FILE", "PresetFile", "read_preset_file", "write_preset_file"]
