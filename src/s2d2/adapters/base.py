"""The model adapter layer: how one family of block-diffusion models is called.

Decoders never touch a family's details. The engine asks an adapter for one :class:`Segment` per running
row and step, then runs all of them as ONE batched forward (:meth:`ModelAdapter.run`):

* ``prefill_segment(state, ids, block_size, causal)``: write prompt blocks into the row's cache.
* ``draft_segment(state, pending, block, start, ...)``: one diffusion forward over the current block.
  Tokens that were committed but are not yet cached (``pending``: the previous block, or nothing) are fed
  in front of the block and their keys/values are written to the cache in the same forward, so
  committing a finished block costs no forward of its own. The block itself is never written.
* ``verify_segment(state, filled, start, slots)``: the AR-mode (block size 1) distribution for each slot
  in ``slots``, conditioned on the cache and ``filled[:slot]`` (the block with every masked position
  filled by its draft). Read only.
* ``commit_segment(state, ids, ...)``: write tokens' keys/values explicitly (rarely needed).
* ``score_segment(state, prefix, branches, score_from=...)``: AR-mode (block size 1) logits of given
  tokens, for scoring: ``prefix`` is written token-causally (kept), each branch continues it (not kept).
* ``new_pool()``: the key/value memory of an engine; ``pool.new_state()`` admits a row,
  ``pool.release(state)`` retires it.

``prefill``, ``draft``, ``verify`` and ``commit`` run one segment alone (a batch of one row).

All logits come back aligned to block slots: row ``j`` is the model's prediction for the token at slot
``j``, whatever the family's convention (same-position or shifted).

Attention masks here are boolean ``[queries, keys]`` matrices, True = the query may see the key.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError
from .kv_pool import KVState
from .segment import Segment


@dataclass
class ModelInfo:
    """What decoders need to know about a model, family-independent."""

    family: str
    mask_token_id: int
    eos_token_ids: list[int]
    vocab_size: int
    #: Largest number of positions the model accepts.
    max_length: int
    #: Block size the checkpoint was trained/configured with, if it says.
    default_block_size: int | None = None
    #: True when logits at position i-1 predict token i (Fast-dLLM v2).
    shifted: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None


class ModelAdapter(ABC):
    """Calls one family of block-diffusion models. See the module docstring for the protocol."""

    info: ModelInfo
    device: torch.device
    dtype: torch.dtype

    # ------------------------------------------------------------------ what a family implements
    @abstractmethod
    def new_pool(
        self, *, page_size: int = 16, max_pages: int | None = None, reserve_tokens: int | None = None
    ) -> Any:
        """Key/value memory for many rows: ``.new_state() -> KVState`` and ``.release(state)``; a paged
        pool (:class:`~s2d2.adapters.kv_pool.KVPool`) has ``page_size`` positions a page and at most
        ``max_pages`` pages (None: it grows; ``reserve_tokens`` is a hint of the positions its rows may
        hold together, :func:`~s2d2.adapters.kv_pool.host_reservation`)."""

    @abstractmethod
    def prefill_segment(self, state: KVState, ids: torch.Tensor, *, block_size: int, causal: bool) -> Segment:
        """Write ``ids`` (positions ``state.length`` onwards) into the cache; no logits."""

    @abstractmethod
    def draft_segment(
        self,
        state: KVState,
        pending: torch.Tensor | Sequence[int],
        block: torch.Tensor | Sequence[int],
        *,
        start: int,
        block_size: int,
        causal: bool,
        cached: int = 0,
        extend: bool = False,
        lead: int | None = None,
    ) -> Segment:
        """Diffusion logits ``[len(block), vocab]`` for the block at positions ``start...`` (token ids as
        host tensors or lists).

        ``pending`` holds the committed tokens at positions ``start - len(pending) .. start - 1`` that
        are not cached yet; they are written to the cache (block-causally, or token-causally when
        ``causal``). With ``causal`` the block's committed (non-mask) tokens also attend token-causally;
        then the block's first ``cached`` slots may already be in the cache (not fed again), and with
        ``extend`` the fed block's leading committed tokens are kept too (``keep`` counts them).
        Families whose blocks cannot be cached in parts (shifted predictions) refuse ``cached > 0``.

        ``lead`` (a causal cache, where :meth:`supports_lead`): the block's first masked slot; the
        forward also carries the AR-mode query of that slot (a mask token at its position that sees the
        cache, the pending tokens and the block's committed slots before it, all token-causal), and the
        logits gain one row: ``[len(block) + 1, vocab]``, the last row being AR mode's prediction there.
        """

    @abstractmethod
    def verify_segment(
        self, state: KVState, filled: Sequence[int] | torch.Tensor, *, start: int, slots: list[int],
        cached: int = 0,
    ) -> Segment:  # fmt: skip
        """AR-mode logits ``[len(slots), vocab]``: row i is q for ``s = slots[i]`` given ``filled[:s]``
        (its first ``cached`` slots read from the cache)."""

    def commit_segment(self, state: KVState, ids: torch.Tensor, *, block_size: int, causal: bool) -> Segment:
        """Write ``ids`` (positions ``state.length`` onwards) into the cache with one forward."""
        return self.prefill_segment(state, ids, block_size=block_size, causal=causal)

    def score_segment(
        self, state: KVState, prefix: torch.Tensor, branches: Sequence[torch.Tensor], *, score_from: int
    ) -> Segment:
        """AR-mode (block size 1) logits of given tokens, in one forward (for scoring, not decoding).

        ``prefix`` ``[p]`` sits at positions ``state.length...`` and is written to the cache token-causally
        (kept: the row's length advances by ``p``). Each of ``branches`` (``[b_j]``, ``b_j >= 1``) continues
        the prefix at positions ``state.length + p...``; it sees the cache, the prefix and its own earlier
        tokens, and is not kept. Logit rows ``[(p - score_from) + sum(b_j), vocab]``: the AR prediction of
        ``prefix[score_from:]`` then of every branch token in order, each given everything before it.
        """
        raise NotImplementedError(f"the {self.info.family} adapter cannot score tokens")

    @abstractmethod
    def run(self, segments: Sequence[Segment]) -> list[torch.Tensor]:
        """Run ``segments`` (one per row, rows distinct) as one forward; advance each row's length by
        its ``keep`` and return each segment's logits (after its ``finish``)."""

    #: whether a block's committed prefix may be cached before the block is complete (causal cache)
    caches_partial_blocks: bool = True

    def supports_lead(self, causal: bool) -> bool:
        """Whether :meth:`draft_segment` can carry the AR-mode query of the block's first masked slot
        (``lead``): same-position families with a causal cache."""
        return False

    def lead_segment(
        self,
        state: KVState,
        pending: Sequence[int],
        block: Sequence[int],
        *,
        start: int,
        cached: int = 0,
        extend: bool = False,
    ) -> Segment:
        """AR mode's prediction at the block's first masked slot, alone: the lead of :meth:`draft_segment`
        without the drafted block (where :meth:`supports_lead`). It feeds ``pending``, the block's
        committed slots from ``cached`` up to its first masked slot and one mask query there, all
        token-causal; ``pending`` is kept, and with ``extend`` the fed committed slots too. Logits
        ``[1, vocab]``."""
        raise NotImplementedError(f"the {self.info.family} adapter has no AR lead")

    def can_fold_prefill(self, causal: bool) -> bool:
        """Whether a prompt's whole blocks may be written by the first draft forward (as its ``pending``
        tokens) instead of a prefill forward of their own: true wherever the two compute the same keys."""
        return True

    # ------------------------------------------------------------------ one row alone
    def new_state(self) -> KVState:
        """A fresh row in a pool of its own."""
        return self.new_pool().new_state()

    def prefill(self, state: KVState, ids: torch.Tensor, *, block_size: int, causal: bool) -> None:
        if ids.numel():
            self.run([self.prefill_segment(state, ids, block_size=block_size, causal=causal)])

    def commit(self, state: KVState, ids: torch.Tensor, *, block_size: int, causal: bool) -> None:
        if ids.numel():
            self.run([self.commit_segment(state, ids, block_size=block_size, causal=causal)])

    def draft(
        self,
        state: KVState,
        pending: torch.Tensor,
        block: torch.Tensor,
        *,
        start: int,
        block_size: int,
        causal: bool,
    ) -> torch.Tensor:
        seg = self.draft_segment(state, pending, block, start=start, block_size=block_size, causal=causal)
        return self.run([seg])[0]

    def verify(self, state: KVState, filled: torch.Tensor, *, start: int, slots: list[int]) -> torch.Tensor:
        return self.run([self.verify_segment(state, filled, start=start, slots=slots)])[0]


# ---------------------------------------------------------------------------------------------- masks
def block_causal(q_pos: torch.Tensor, k_pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """Query at absolute position i sees key at j iff ``j // B <= i // B``."""
    return (k_pos[None, :] // block_size) <= (q_pos[:, None] // block_size)


def token_causal(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Query at absolute position i sees key at j iff ``j <= i``."""
    return k_pos[None, :] <= q_pos[:, None]


def context_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, block_size: int, causal: bool) -> torch.Tensor:
    """Mask among committed context tokens: token-causal for a causal cache, else block-causal."""
    return token_causal(q_pos, k_pos) if causal else block_causal(q_pos, k_pos, block_size)


def draft_mask(
    n_cache: int, n_pending: int, block_committed: torch.Tensor, *, block_size: int, causal: bool, start: int
) -> torch.Tensor:
    """Mask of a draft forward: queries ``[pending | block]``, keys ``[cache | pending | block]``.

    Pending rows see the cache and the pending tokens (block- or token-causally) but not the block.
    Block rows see the cache, all pending tokens and the whole block bidirectionally; with ``causal``
    the block's committed tokens see only block keys at or before their own slot (as AR mode would).
    """
    n_block = block_committed.numel()
    m = n_pending
    mask = torch.zeros(m + n_block, n_cache + m + n_block, dtype=torch.bool)
    mask[:, :n_cache] = True
    if m:
        pos = torch.arange(start - m, start)
        mask[:m, n_cache : n_cache + m] = context_mask(pos, pos, block_size, causal)
        mask[m:, n_cache : n_cache + m] = True
    inner = torch.ones(n_block, n_block, dtype=torch.bool)
    if causal:
        slots = torch.arange(n_block)
        inner[block_committed] = token_causal(slots, slots)[block_committed]
    mask[m:, n_cache + m :] = inner
    return mask


def verify2l_mask(n_cache: int, n_first: int, slots: list[int]) -> torch.Tensor:
    """The "2L" verify mask: queries ``[first half | one MASK per verified slot]``.

    Keys are ``[cache | first half | second half]``. First-half row j sees first-half keys <= j
    (token-causal); the second-half row for slot s sees first-half keys < s and only itself.
    """
    n_second = len(slots)
    mask = torch.zeros(n_first + n_second, n_cache + n_first + n_second, dtype=torch.bool)
    mask[:, :n_cache] = True
    idx = torch.arange(n_first)
    mask[:n_first, n_cache : n_cache + n_first] = token_causal(idx, idx)
    s = torch.tensor(slots, dtype=torch.long)
    mask[n_first:, n_cache : n_cache + n_first] = idx[None, :] < s[:, None]
    mask[n_first:, n_cache + n_first :] = torch.eye(n_second, dtype=torch.bool)
    return mask


def score_mask(n_prefix: int, score_from: int, branches: Sequence[int]) -> torch.Tensor:
    """The AR scoring mask of a same-position model (the first half of :func:`verify2l_mask`, per branch).

    Queries and keys are ``[prefix | one MASK per prefix[score_from:] | per branch: its tokens but the last,
    then one MASK per token]``. Prefix rows are token-causal; the MASK of prefix token i sees prefix keys
    < i and itself; a branch's token rows see the whole prefix and the branch's tokens up to their own;
    the MASK of branch token k sees the whole prefix, the branch's first k tokens and itself.
    """
    p, s = n_prefix, n_prefix - score_from
    n = p + s + sum(2 * b - 1 for b in branches)
    mask = torch.zeros(n, n, dtype=torch.bool)
    idx = torch.arange(p)
    mask[:p, :p] = token_causal(idx, idx)
    mask[p : p + s, :p] = idx[None, :] < torch.arange(score_from, p)[:, None]
    mask[p : p + s, p : p + s] = torch.eye(s, dtype=torch.bool)
    at = p + s
    for b in branches:
        fed, slots = torch.arange(b - 1), torch.arange(b)
        mask[at : at + 2 * b - 1, :p] = True
        mask[at : at + b - 1, at : at + b - 1] = token_causal(fed, fed)
        mask[at + b - 1 : at + 2 * b - 1, at : at + b - 1] = fed[None, :] < slots[:, None]
        mask[at + b - 1 : at + 2 * b - 1, at + b - 1 : at + 2 * b - 1] = torch.eye(b, dtype=torch.bool)
        at += 2 * b - 1
    return mask


# ---------------------------------------------------------------------------------------------- loading
def read_config(path: Path) -> dict[str, Any]:
    """Read ``config.json`` of a model directory with clear errors."""
    if not path.exists():
        raise ModelLoadError(f"model path does not exist: {path}")
    if not path.is_dir():
        raise ModelLoadError(f"model path is not a directory: {path}")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"no config.json in {path}: not a model directory")
    try:
        return json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{cfg_file} is not valid JSON ({exc.__class__.__name__}: {exc})") from None


def read_added_tokens(path: Path) -> dict[str, int]:
    """Token ids from ``added_tokens.json`` and ``tokenizer.json``'s added tokens, if present."""
    found: dict[str, int] = {}
    tok_file = path / "tokenizer.json"
    if tok_file.is_file():
        try:
            for tok in json.loads(tok_file.read_text()).get("added_tokens", []):
                found[tok["content"]] = int(tok["id"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            pass
    added = path / "added_tokens.json"
    if added.is_file():
        try:
            found.update({k: int(v) for k, v in json.loads(added.read_text()).items()})
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{added} is not a valid token map ({exc})") from None
    return found


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Load all weights of a directory from ``model.safetensors`` or a sharded index. Never unpickles."""
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as exc:
            raise ModelLoadError(f"{index} is not a valid safetensors index ({exc})") from None
        files = [path / s for s in shards]
    elif (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]
    else:
        files = sorted(path.glob("model*.safetensors"))
    if not files:
        pickled = list(path.glob("*.bin"))
        hint = " (only pickled .bin weights found; convert them to safetensors)" if pickled else ""
        raise ModelLoadError(f"no safetensors weights in {path}{hint}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        if not f.is_file():
            raise ModelLoadError(f"missing weight shard {f.name} in {path}")
        try:
            weights.update(load_file(str(f)))
        except Exception as exc:  # safetensors raises its own error types
            raise ModelLoadError(f"cannot read weights {f}: {str(exc).splitlines()[0]}") from None
    return weights


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``auto``/None -> float32 on CPU, bfloat16 on CUDA; else bf16/fp16/fp32 (or a torch dtype)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
        "fp32": torch.float32,
        "float32": torch.float32,
    }
    if dtype not in table:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose bf16, fp16 or fp32")
    return table[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``auto``/None -> ``$S2D2_DEVICE`` when set, else cuda if available, else cpu."""
    if device in (None, "auto"):
        device = os.environ.get("S2D2_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelLoadError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' requested but no CUDA GPU is available")
    return dev


def load_weights_into(model: torch.nn.Module, weights: dict[str, torch.Tensor], path: Path) -> None:
    """Strictly load ``weights`` into ``model`` with a one-line error for missing/unexpected/misshapen."""
    own = model.state_dict()
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} (e.g. {unexpected[0]})")
        raise ModelLoadError(f"weights in {path} do not match the config: {'; '.join(parts)}")
    for k, v in weights.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise ModelLoadError(
                f"weights in {path} do not match the config: {k} has shape {tuple(v.shape)}, "
                f"expected {tuple(own[k].shape)}"
            )
    model.load_state_dict(weights, strict=True)


# ------------------------------------------------------------------------------------------ family helpers
def matches_family(
    config: dict[str, Any],
    model_types: tuple[str, ...],
    architectures: tuple[str, ...],
    auto_map_names: tuple[str, ...] = (),
) -> bool:
    """Whether ``config`` names this family by model_type, architectures or (lower-cased) auto_map names."""
    if str(config.get("model_type", "")).lower() in model_types:
        return True
    if any(a in architectures for a in config.get("architectures") or []):
        return True
    auto_map = config.get("auto_map")
    if isinstance(auto_map, dict) and auto_map_names:
        return any(n in str(v).lower() for v in auto_map.values() for n in auto_map_names)
    return False


def find_mask_token(config: dict[str, Any], added: dict[str, int], names: tuple[str, ...]) -> int | None:
    """``mask_token_id`` from config.json, else the first of ``names`` among the tokenizer's added tokens."""
    if config.get("mask_token_id") is not None:
        return int(config["mask_token_id"])
    return next((added[n] for n in names if n in added), None)


def require_mask_token(
    path: Path, config: dict[str, Any], added: dict[str, int], names: tuple[str, ...], vocab_size: int
) -> int:
    """The mask token id, or a one-line :class:`ModelLoadError` (missing, or outside the vocabulary)."""
    mask_id = find_mask_token(config, added, names)
    if mask_id is None:
        raise ModelLoadError(
            f"{path}: no mask token: config.json has no mask_token_id and neither added_tokens.json nor "
            f"tokenizer.json defines {names[0]!r}"
        )
    if not 0 <= mask_id < vocab_size:
        raise ModelLoadError(f"mask token id {mask_id} is outside the vocabulary (size {vocab_size})")
    return mask_id
