"""Where a model's files are: a built-in name, a local directory, or a Hugging Face Hub repository.

:func:`resolve_model_path` is the one place every entry point (``s2d2.load``, every ``--model`` of the
command line, the server, the lm-eval model ``s2d2`` and Ray Serve's replicas) turns what the user named
into a checkpoint directory:

1. a built-in model's name (:data:`BUILTIN_MODELS`): its directory inside the package;
2. an existing local path: that path (a missing path that cannot be a repository name, such as an
   absolute or ``./`` path, is that path too, and its loader reports it missing);
3. otherwise a repository id (``ORG/NAME``): ``huggingface_hub.snapshot_download`` of the files s2d2
   reads (:data:`HUB_FILES`: the config, safetensors weights, tokenizer and preset files, never code),
   at ``revision`` (a branch, tag or commit; default ``main``). The library's own settings apply:
   ``HF_HUB_OFFLINE=1`` reads the cache only, ``HF_HOME`` / ``HF_HUB_CACHE`` place the cache, ``HF_TOKEN``
   authenticates. A repository that is neither cached nor downloadable is a one-line
   :class:`~s2d2.errors.ModelLoadError`.

The directory is then loaded as any local checkpoint: the family from ``config.json``, weights from
safetensors only, no remote code.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from .errors import ModelLoadError
from .presets import MODEL_PRESET_FILE

__all__ = ["BUILTIN_MODELS", "HUB_FILES", "builtin_path", "resolve_model_path"]

#: Models shipped inside the package, by name.
BUILTIN_MODELS = ("tiny-gsm", "tiny-code")

#: The files of a Hub repository s2d2 reads (``allow_patterns`` of ``snapshot_download``): the config,
#: safetensors weights (and their index), tokenizer files, a chat template and the model's preset file.
#: Python files and pickled weights are never fetched.
HUB_FILES = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    MODEL_PRESET_FILE,
]


def builtin_path(name: str) -> Path:
    return Path(str(resources.files("s2d2") / "models" / name))


def resolve_model_path(name_or_path: str | os.PathLike[str], revision: str | None = None) -> Path:
    """The checkpoint directory ``name_or_path`` names (see the module docstring); ``revision`` applies
    to a Hub repository only. A one-line :class:`ModelLoadError` when there is none."""
    name = str(name_or_path)
    if name in BUILTIN_MODELS:
        _no_revision(revision, f"the built-in model {name!r}")
        path = builtin_path(name)
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"the built-in model {name!r} is not installed in this package ({path})")
        return path
    path = Path(name).expanduser()
    if path.exists() or not _is_repo_id(name):
        _no_revision(revision, f"the local path {name}")
        return path
    return _snapshot(name, revision)


def _no_revision(revision: str | None, what: str) -> None:
    if revision is not None:
        raise ModelLoadError(f"revision {revision!r} applies to Hugging Face repositories, not to {what}")


def _is_repo_id(name: str) -> bool:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _snapshot(repo_id: str, revision: str | None) -> Path:
    """The local snapshot of ``repo_id`` at ``revision`` (from the cache, or downloaded)."""
    from huggingface_hub import snapshot_download

    from .version import __version__

    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=HUB_FILES,
            library_name="s2d2",
            library_version=__version__,
        )
    except Exception as exc:  # the library raises many types; the user needs one line
        raise ModelLoadError(_not_found(repo_id, revision, exc)) from None
    return Path(folder)


def _not_found(repo_id: str, revision: str | None, exc: Exception) -> str:
    """The one line that says why ``snapshot_download`` found no snapshot."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f" at revision {revision!r}" if revision is not None else ""
    head = (
        f"model {repo_id!r}{at} is not a built-in model ({', '.join(BUILTIN_MODELS)}), a local directory "
        "or a Hugging Face repository"
    )
    if isinstance(exc, RevisionNotFoundError):
        return f"revision {revision!r} of the Hugging Face repository {repo_id!r} does not exist"
    if isinstance(exc, LocalEntryNotFoundError):
        where = f"in the cache {constants.HF_HUB_CACHE}"
        if constants.HF_HUB_OFFLINE:
            return f"{head} {where} (HF_HUB_OFFLINE is set: nothing is downloaded)"
        return f"{head} {where}, and the Hub cannot be reached ({_first_line(exc)})"
    if isinstance(exc, GatedRepoError):
        return f"{head} you may read (it is gated: accept its terms, then set HF_TOKEN)"
    if isinstance(exc, RepositoryNotFoundError):
        return f"{head} (the Hub has no such repository, or it is private: set HF_TOKEN)"
    if isinstance(exc, (HfHubHTTPError, OSError, ValueError)):
        return f"cannot fetch {repo_id!r}{at} from the Hugging Face Hub: {_first_line(exc)}"
    raise exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__
