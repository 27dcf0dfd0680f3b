"""tiny-gsm training batches and their loss: the block-diffusion objective.

Same-position prediction, blocks aligned to ABSOLUTE positions, exactly as the engine decodes:

* ``x = prompt + answer + <eos>``, padded with ``<eos>`` to the end of its last block (those padding
  positions are trained too, so the model learns ``<eos>`` after ``<eos>``).
* The model input is ``[clean x | noisy copy of the blocks that contain answer positions]``. The noisy copy
  reuses the clean positions' position ids. In every noisy block a fraction ``t ~ U(eps, 1)`` of its
  ANSWER positions is replaced by ``<mask>`` (at least one; prompt tokens inside a noisy block stay clean;
  a B=1 block is therefore always masked).
* Attention: the clean copy is block-causal (query i sees key j iff ``j // B <= i // B``) or, with
  probability :data:`P_TOKEN_CAUSAL` for B > 1, token-causal (the causal-cache variant); noisy block k sees
  itself bidirectionally and the clean blocks ``< k``; the clean copy never sees a noisy one.
* A token-causal sample (B > 1) also carries an AR-mode copy (B=1, every answer position masked) after
  its noisy copy: with a token-causal clean copy that is exactly the AR objective, at the cost of the
  answer's length only (the prompt and the clean copy are shared). Noisy copies never see each other.
* Loss: mean cross-entropy over all masked positions of the batch, logits at a masked position predicting
  the token at that same position (no shift).
* Block size drawn per batch from :data:`~s2d2.training.schedule.BLOCK_MIX` (or ``--block-mix``); the
  clean copy's kind per sample. With ``ar_first`` (``--ar-first``) the first part of the budget trains AR
  mode only (every batch B=1: the clean copy plus one all-masked copy), then the mix (see
  :func:`s2d2.training.schedule.mix_at`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from s2d2.training.schedule import BLOCK_MIX

__all__ = [
    "BATCH_SIZE",
    "MASK_EPS",
    "POOL_BATCHES",
    "P_TOKEN_CAUSAL",
    "attention_mask_from",
    "batch_loss",
    "build_batch",
    "pool_batches",
]

P_TOKEN_CAUSAL = 0.6
MASK_EPS = 1e-3
BATCH_SIZE = 64
#: Problems are drawn, encoded and bucketed by length POOL_BATCHES batches at a time (see pool_batches).
POOL_BATCHES = 16


def attention_mask_from(pos, bstart, copy, valid, token_causal) -> torch.Tensor:
    """Boolean [b, 1, T, T] mask (True = may attend) from per-token attributes (each [b, T]).

    ``pos``: position id; ``bstart``: first position of the token's block (under its own copy's block
    size); ``copy``: 0 for the clean copy, 1, 2, ... for noisy copies; ``valid``: not padding.
    ``token_causal`` [b] selects the token-causal clean copy for a sample (else block-causal).
    """
    pq, pk = pos[:, :, None], pos[:, None, :]
    sq, sk = bstart[:, :, None], bstart[:, None, :]
    cq, ck = copy[:, :, None], copy[:, None, :]
    clean_q, clean_k = cq == 0, ck == 0
    clean_clean = torch.where(token_causal[:, None, None], pk <= pq, sk <= sq) & clean_q & clean_k
    noisy_clean = ~clean_q & clean_k & (pk < sq)
    noisy_noisy = ~clean_q & (cq == ck) & (sk == sq)
    m = (clean_clean | noisy_clean | noisy_noisy) & valid[:, :, None] & valid[:, None, :]
    eye = torch.eye(pos.shape[1], dtype=torch.bool)[None]
    m = m | (eye & ~valid[:, :, None])  # padding rows see themselves only (no NaN)
    return m[:, None]


def _noisy_copy(x: np.ndarray, p: int, B: int, rng: np.random.Generator, mask_id: int):
    """A noisy copy (block size ``B``) of the blocks of ``x`` holding answer positions ``p..``.

    Returns ``(tokens, positions, masked answer positions)``. In every block a fraction
    ``t ~ U(eps, 1)`` of its answer positions is masked (at least one, so B=1 masks every position).
    """
    L = len(x)
    s = (p // B) * B
    noisy_tok = x[s:].copy()
    apos = np.arange(p, L)
    ablk = apos // B
    starts = np.flatnonzero(np.r_[True, ablk[1:] != ablk[:-1]])
    nblk = len(starts)
    t = rng.uniform(MASK_EPS, 1.0, size=nblk)
    blk_index = np.repeat(np.arange(nblk), np.diff(np.r_[starts, len(apos)]))
    u = rng.random(len(apos))
    masked = u < t[blk_index]
    any_masked = np.logical_or.reduceat(masked, starts)
    umin = np.minimum.reduceat(u, starts)
    masked |= (~any_masked[blk_index]) & (u == umin[blk_index])
    noisy_tok[apos[masked] - s] = mask_id
    return noisy_tok, np.arange(s, L), apos[masked]


def _sample_kinds(n: int, rng: np.random.Generator, block_sizes, token_causal, ar_copy, block_mix):
    """Per-sample ``(block_sizes, token_causal, ar_copy)``, drawing those not given (see build_batch)."""
    if block_sizes is None:
        sizes, probs = zip(*(block_mix or BLOCK_MIX).items(), strict=True)
        block_sizes = [int(rng.choice(np.array(sizes), p=np.array(probs) / sum(probs)))] * n
    if token_causal is None:
        token_causal = [(b > 1 and rng.random() < P_TOKEN_CAUSAL) for b in block_sizes]
    if ar_copy is None:
        ar_copy = [tc and b > 1 for tc, b in zip(token_causal, block_sizes, strict=True)]
    for tc, b, ac in zip(token_causal, block_sizes, ar_copy, strict=True):
        if ac and not (tc or b == 1):
            raise ValueError("an AR-mode copy needs a token-causal clean copy (or B=1)")
    return block_sizes, token_causal, ar_copy


def _sample_row(prompt, answer, B: int, ac: bool, rng: np.random.Generator, mask_id: int, eos_id: int):
    """One sample's flat arrays ``(tokens, positions, block starts, copy ids, loss positions, targets)``:
    the clean copy, its noisy copy with block size ``B`` and, with ``ac``, the AR-mode copy."""
    p = len(prompt)
    x = list(prompt) + list(answer)
    L = -(-len(x) // B) * B
    x = np.array(x + [eos_id] * (L - len(x)), dtype=np.int64)
    ar_pos = np.arange(L)
    toks, poss, bst, cps, loss_at, tgts = [x], [ar_pos], [(ar_pos // B) * B], [np.zeros(L, int)], [], []
    offset = L
    for c, Bc in enumerate([B] + ([1] if ac else []), start=1):
        ntok, npos, mpos = _noisy_copy(x, p, Bc, rng, mask_id)
        toks.append(ntok)
        poss.append(npos)
        bst.append((npos // Bc) * Bc)
        cps.append(np.full(len(npos), c))
        loss_at.append(offset + mpos - npos[0])
        tgts.append(x[mpos])
        offset += len(npos)
    return tuple(np.concatenate(a) for a in (toks, poss, bst, cps, loss_at, tgts))


def _collate(rows, pad_id: int, token_causal) -> dict:
    """Pad the samples' rows (from :func:`_sample_row`) into batch tensors and build the attention mask."""
    n = len(rows)
    T = max(len(r[0]) for r in rows)
    ids = torch.full((n, T), pad_id, dtype=torch.long)
    pos = torch.zeros((n, T), dtype=torch.long)
    bstart = torch.zeros((n, T), dtype=torch.long)
    copy = torch.zeros((n, T), dtype=torch.long)
    valid = torch.zeros((n, T), dtype=torch.bool)
    loss_index, targets = [], []
    for i, (tok, ps, bs, cp, li, tg) in enumerate(rows):
        k = len(tok)
        ids[i, :k] = torch.from_numpy(tok)
        pos[i, :k] = torch.from_numpy(ps)
        bstart[i, :k] = torch.from_numpy(bs)
        copy[i, :k] = torch.from_numpy(cp)
        valid[i, :k] = True
        loss_index.append(torch.from_numpy(li + i * T))
        targets.append(torch.from_numpy(tg))
    mask = attention_mask_from(pos, bstart, copy, valid, torch.tensor(token_causal, dtype=torch.bool))
    return {
        "input_ids": ids,
        "position_ids": pos,
        "attention_mask": mask,
        "loss_index": torch.cat(loss_index),
        "targets": torch.cat(targets),
    }


def build_batch(
    examples,
    rng: np.random.Generator,
    mask_id: int,
    eos_id: int,
    pad_id: int,
    block_sizes=None,
    token_causal=None,
    ar_copy=None,
    block_mix: dict[int, float] | None = None,
):
    """Build one training batch.

    ``examples``: list of ``(prompt_ids, answer_ids)`` with ``answer_ids`` ending in ``<eos>``.
    ``block_sizes`` (per sample) default to ONE size for the whole batch drawn from
    :data:`~s2d2.training.schedule.BLOCK_MIX` (less padding than per-sample sizes), or from ``block_mix``
    when given; ``token_causal`` (per sample) is drawn with probability :data:`P_TOKEN_CAUSAL` for B > 1
    when not given. ``ar_copy`` (per sample; default: every token-causal sample with B > 1) appends a
    second noisy copy with block size 1 (AR mode, every answer position masked): with a token-causal clean
    copy it is exactly the AR-mode objective, so the clean copy's cost is shared by two objectives.
    Returns a dict with ``input_ids``, ``position_ids``, ``attention_mask`` ([b,1,T,T] bool),
    ``loss_index`` (flat indices into [b*T]) and ``targets``.
    """
    block_sizes, token_causal, ar_copy = _sample_kinds(
        len(examples), rng, block_sizes, token_causal, ar_copy, block_mix
    )
    rows = [
        _sample_row(prompt, answer, B, ac, rng, mask_id, eos_id)
        for (prompt, answer), B, ac in zip(examples, block_sizes, ar_copy, strict=True)
    ]
    batch = _collate(rows, pad_id, token_causal)
    batch.update(block_sizes=list(block_sizes), token_causal=list(token_causal), ar_copy=list(ar_copy))
    return batch


def batch_loss(model, batch, body=None) -> torch.Tensor:
    """Mean cross-entropy over the batch's masked positions; ``body`` (default ``model.model``) runs the
    transformer stack, e.g. a ``torch.compile``-d copy of it."""
    hidden = (model.model if body is None else body)(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    ).last_hidden_state
    h = hidden.reshape(-1, hidden.shape[-1])[batch["loss_index"]]
    logits = model.lm_head(h).float()
    return F.cross_entropy(logits, batch["targets"])


def pool_batches(stream, tok, n: int, rng: np.random.Generator):
    """``n`` problems from ``stream``, encoded, bucketed by length into batches (shuffled order)."""
    exs = []
    for _ in range(n):
        p = next(stream)
        exs.append(
            (
                tok.encode(p["question"], add_special_tokens=False),
                tok.encode(p["answer"], add_special_tokens=False) + [tok.eos_token_id],
            )
        )
    exs.sort(key=lambda e: len(e[0]) + len(e[1]))
    batches = [exs[i : i + BATCH_SIZE] for i in range(0, len(exs), BATCH_SIZE)]
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]
