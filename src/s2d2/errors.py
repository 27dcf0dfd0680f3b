"""User-facing errors.

Every problem caused by user input (a bad path, a broken checkpoint, invalid settings, a prompt that is
too long) raises :class:`S2D2Error` with a one-line message. The CLI prints that line to stderr and exits
non-zero without a traceback; library users can catch it like a ``ValueError``.
"""

from __future__ import annotations


class S2D2Error(ValueError):
    """A clear, one-line error about something the user gave us."""


class ModelLoadError(S2D2Error):
    """The model directory is missing, incomplete, unsupported or broken."""


class ConfigError(S2D2Error):
    """Decoding settings are invalid or contradict each other."""


class RequestCannotEnd(S2D2Error):
    """A request that could not go on after admission (a constraint's dead end no look-ahead saw, a row
    that made no progress): it fails alone with this one-line reason, which the server passes on (a 422)."""


class PromptError(S2D2Error):
    """The prompt cannot be decoded (too long, empty, wrong type)."""
