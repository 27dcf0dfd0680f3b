"""Loading one tensor-parallel rank's shard of a checkpoint: only its slices are read from safetensors.

Rank ``r`` of ``N`` holds (``H`` attention heads, ``KV`` key/value heads of ``hd`` dims, vocabulary ``V``):

==========================================  ============================================================
q projection (rows), output projection      heads ``[r H/N, (r+1) H/N)`` (column- / row-parallel)
(columns)
k/v projections (rows)                      KV heads ``[r KV/N, ...)``; with fewer KV heads than ranks,
                                            the one its q heads read (replicated)
MLP gate/up (rows), down (columns)          intermediate columns ``[r I/N, ...)``
embedding, LM head (rows)                   vocabulary ``[r ceil(V/N), ...)``, zero rows past ``V``
routed experts (LLaDA2, SDAR-MoE)           experts ``[r E/N, ...)`` whole (expert parallel)
shared experts (LLaDA2)                     intermediate columns, as the MLP
norms, the router, biases of row-parallel   whole (replicated)
==========================================  ============================================================

A split is checked before any process starts (:func:`split_problem`). The model is then built at the
rank's sizes (:func:`local_config`): its heads, intermediate size and vocabulary are the rank's.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .checkpoint import load_safetensors, weight_files
from .expert_parallel import renumber_experts

#: ``(dim, [(start, stop), ...], rows)``: the slices of a tensor along ``dim``, concatenated, padded to
#: ``rows`` along it (None: no padding); None: the whole tensor; ``"skip"``: not on this rank
Cut = tuple[int, list[tuple[int, int]], int | None] | str | None

_EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.")
_ROW_PARALLEL = ("o_proj.weight", "down_proj.weight", "attention.dense.weight")


def split_problem(config: dict[str, Any], size: int) -> str | None:
    """Why ``config``'s model cannot be split over ``size`` ranks (None: it can)."""
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    if size < 1:
        return f"tensor_parallel_size must be >= 1, got {size}"
    if heads % size:
        return f"tensor_parallel_size {size} does not divide the model's {heads} attention heads"
    if kv % size and size % kv:
        return f"tensor_parallel_size {size} and the model's {kv} key/value heads: one must divide the other"
    sizes = {"intermediate_size": config.get("intermediate_size")}
    if config.get("num_experts"):
        sizes["num_experts"] = config["num_experts"]
        sizes["shared experts' intermediate size"] = int(config.get("moe_intermediate_size") or 0) * int(
            config.get("num_shared_experts") or 0
        )
    for what, n in sizes.items():
        if n and int(n) % size:
            return f"tensor_parallel_size {size} does not divide the model's {what} ({n})"
    return None


def kv_heads(rank: int, size: int, heads: int, kv: int) -> tuple[int, int]:
    """The KV heads ``[start, stop)`` rank ``rank`` holds (one replicated head when ``kv < size``)."""
    if kv >= size:
        per = kv // size
        return rank * per, (rank + 1) * per
    first_q = rank * (heads // size)
    head = first_q // (heads // kv)
    return head, head + 1


def qkv_rows(rank: int, size: int, heads: int, kv: int, hd: int) -> dict[str, list[tuple[int, int]]]:
    """Row ranges of this rank's q, k and v projections (each projection's own rows)."""
    q = heads // size
    k0, k1 = kv_heads(rank, size, heads, kv)
    return {"q": [(rank * q * hd, (rank + 1) * q * hd)], "kv": [(k0 * hd, k1 * hd)]}


def make_cut(
    rank: int, size: int, *, heads: int, kv: int, hd: int, vocab: int, experts: int = 0
) -> Callable[[str, tuple[int, ...]], Cut]:
    """The slicing rule of one rank for the checkpoint names of every family here (Qwen2/Qwen3 names and
    LLaDA2's: ``attention.query_key_value`` rows Q|K|V, ``attention.dense``, ``word_embeddings``,
    ``mlp.experts.E``)."""
    rows = qkv_rows(rank, size, heads, kv, hd)
    per_vocab = math.ceil(vocab / size)

    def even(dim: int, n: int) -> Cut:
        per = n // size
        return dim, [(rank * per, (rank + 1) * per)], None

    def cut(name: str, shape: tuple[int, ...]) -> Cut:
        m = _EXPERT.search(name)
        if m:
            per = experts // size
            return None if rank * per <= int(m[1]) < (rank + 1) * per else "skip"
        if "embed_tokens." in name or "word_embeddings." in name or name.startswith("lm_head."):
            start = rank * per_vocab
            return 0, [(start, min(start + per_vocab, vocab))], per_vocab
        if ".query_key_value." in name:
            (q0, q1), (k0, k1) = rows["q"][0], rows["kv"][0]
            off = heads * hd
            return 0, [(q0, q1), (off + k0, off + k1), (off + kv * hd + k0, off + kv * hd + k1)], None
        if ".q_proj." in name:
            return 0, rows["q"], None
        if ".k_proj." in name or ".v_proj." in name:
            return 0, rows["kv"], None
        if name.endswith(_ROW_PARALLEL):
            return even(len(shape) - 1, shape[-1])
        if name.endswith(("gate_proj.weight", "up_proj.weight")) and ".mlp." in name:
            return even(0, shape[0])
        return None

    return cut


def read_shard(path: Path, cut: Callable[[str, tuple[int, ...]], Cut]) -> dict[str, torch.Tensor]:
    """This rank's tensors of the checkpoint ``path`` (``model.safetensors`` or an index's shards): each
    cut by ``cut`` as it is read (only the slices are read: no full copy of a split tensor)."""
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                sl = f.get_slice(key)
                out_t = _read(sl, cut(key, tuple(sl.get_shape())))
                if out_t is not None:
                    out[key] = out_t
    return out


def _read(sl: Any, c: Cut) -> torch.Tensor | None:
    if c == "skip":
        return None
    if c is None:
        return sl[:]
    dim, ranges, rows = c
    lead = (slice(None),) * dim
    parts = [sl[(*lead, slice(a, b))] for a, b in ranges]
    t = parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)
    if rows is not None and t.shape[dim] < rows:
        pad = list(t.shape)
        pad[dim] = rows - t.shape[dim]
        t = torch.cat([t, t.new_zeros(pad)], dim=dim)
    return t


def local_config(cfg: Any, size: int, *, experts: bool = False) -> Any:
    """A copy of the native config ``cfg`` at one rank's sizes (heads, KV heads, intermediate size,
    vocabulary, local experts); ``head_dim`` stays the model's."""
    local = copy.deepcopy(cfg)
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    local.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    local.num_attention_heads = heads // size
    local.num_key_value_heads = max(kv // size, 1)
    if getattr(cfg, "intermediate_size", 0):
        local.intermediate_size = cfg.intermediate_size // size
    local.vocab_size = math.ceil(cfg.vocab_size / size)
    local.pad_token_id = None  # the embedding's padding row matters to training only; it may be elsewhere
    if experts:  # Glm4Moe names the routed experts n_routed_experts, Qwen3-MoE num_experts
        name = "n_routed_experts" if hasattr(cfg, "n_routed_experts") else "num_experts"
        setattr(local, name, getattr(cfg, name) // size)
    return local


def rank_weights(path: Path, cfg: Any, rank: int, size: int, *, experts: int = 0) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s tensors of the checkpoint ``path`` of the model of native config ``cfg`` (full
    sizes), under their checkpoint names; of ``experts`` routed experts (0: none), its ``experts / size``,
    numbered from 0."""
    heads = cfg.num_attention_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    cut = make_cut(rank, size, heads=heads, kv=cfg.num_key_value_heads, hd=hd, vocab=cfg.vocab_size,
                   experts=experts)  # fmt: skip
    weights = read_shard(path, cut)
    return renumber_experts(weights, rank * (experts // size)) if experts else weights


def dense_checkpoint(
    path: Path, config: dict[str, Any], cfg: Any, tp: Any = None
) -> tuple[dict[str, torch.Tensor], Any, None]:
    """A dense model's weights and the native config to build it at: the whole checkpoint at ``cfg``
    (``tp`` None), or rank ``tp.rank``'s slices of ``tp.size`` at the rank's sizes (a family spec's
    ``weights``: nothing to prepare)."""
    if tp is None:
        return load_safetensors(path), cfg, None
    return rank_weights(path, cfg, tp.rank, tp.size), local_config(cfg, tp.size), None
