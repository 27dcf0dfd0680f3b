"""Train the built-in ``tiny-gsm`` block-diffusion model on CPU (a Qwen3 network saved in SDAR format).

Objective (same-position prediction, blocks aligned to ABSOLUTE positions, exactly as the engine decodes):

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
* Block size drawn per batch from :data:`BLOCK_MIX` (or ``--block-mix``); the clean copy's kind per
  sample. With ``ar_first`` (``--ar-first``) the first part of the budget trains AR mode only (every batch
  B=1: the clean copy plus one all-masked copy), then the mix (see :func:`mix_at`).
* Data: the endless ``tiny_gsm`` training stream, thinned by ``hard_focus`` (``--hard-focus``, default
  :data:`HARD_FOCUS`) towards problems whose additions and subtractions carry or borrow in two or more
  digit columns, the steps the model gets wrong most (:func:`s2d2.tasks.tiny_gsm.keep_probability`).

Model selection: every evaluation decodes the first ``dev_size`` dev problems greedily, batched, in AR mode
(B=1, :func:`decode_ar_cached`, KV cache) and with the dynamic-threshold decoder (B=8, tau=0.9,
:func:`decode_batch`, full recompute). The
checkpoint with the highest SUM ``acc_ar + acc_dyn8`` is kept (ties: higher AR accuracy, then the earlier
one) and written as an SDAR-format directory ``out/best/``.

Files in ``out/``: ``ckpt.pt`` (model + optimiser + step + elapsed time + RNG states; a killed run
resumes from it), ``best/`` (config.json, model.safetensors, tokenizer files), ``best.json``,
``train_log.jsonl``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from s2d2.tasks import tiny_gsm

__all__ = [
    "AR_FIRST",
    "BLOCK_MIX",
    "EMA_DECAY",
    "HARD_FOCUS",
    "MODEL_SIZE",
    "build_batch",
    "build_model",
    "check_ar_first",
    "check_lr",
    "decode_batch",
    "evaluate",
    "load_sdar_dir",
    "mix_at",
    "parse_block_mix",
    "qwen3_config",
    "save_sdar_dir",
    "sdar_config",
    "train_tiny",
]

MODEL_SIZE = dict(
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=32,
    intermediate_size=384,
)
BLOCK_MIX = {2: 0.1, 4: 0.3, 8: 0.35, 16: 0.25}
P_TOKEN_CAUSAL = 0.6
#: Fraction of the budget trained in AR mode only before the block mix starts (new runs; see mix_at).
AR_FIRST = 0.5
MASK_EPS = 1e-3
BATCH_SIZE = 64
POOL_BATCHES = 16
LR, BETAS, WEIGHT_DECAY, WARMUP_STEPS, LR_FLOOR, CLIP = 2e-3, (0.9, 0.98), 0.1, 200, 0.1, 1.0
#: Decay of the weight average that is evaluated and shipped (0 = evaluate the live weights). A horizon
#: of about 200 steps: +0.8 dev AR points over the live weights at the end of a paired 60-minute run.
EMA_DECAY = 0.995
#: Training problems without carrying or borrowing columns are kept with probability 1 - HARD_FOCUS, with
#: one 1 - HARD_FOCUS / 2 (new runs; see tiny_gsm.keep_probability): dev AR .972 against .948.
HARD_FOCUS = 0.6
MAX_NEW_TOKENS = 56
DEFAULT_BLOCK_SIZE = 4


# --------------------------------------------------------------------------------------------------
# Model and on-disk format
# --------------------------------------------------------------------------------------------------


def sdar_config(tok, size: dict | None = None) -> dict:
    """The SDAR ``config.json`` for a tiny-gsm model with tokenizer ``tok``."""
    size = dict(MODEL_SIZE if size is None else size)
    vocab = int(math.ceil(len(tok) / 8) * 8)
    import transformers

    return {
        "architectures": ["SDARForCausalLM"],
        "model_type": "sdar",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "mask_token_id": tok.mask_token_id,
        "block_size": DEFAULT_BLOCK_SIZE,
        "head_dim": size["head_dim"],
        "hidden_act": "silu",
        "hidden_size": size["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": size["intermediate_size"],
        "max_position_embeddings": 512,
        "max_window_layers": size["num_hidden_layers"],
        "num_attention_heads": size["num_attention_heads"],
        "num_hidden_layers": size["num_hidden_layers"],
        "num_key_value_heads": size["num_key_value_heads"],
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": transformers.__version__,
        "use_cache": False,
        "vocab_size": vocab,
        "s2d2_task": "tiny-gsm",
    }


def qwen3_config(cfg: dict):
    """Map an SDAR config dict onto ``transformers.Qwen3Config`` (sdpa attention)."""
    from transformers import Qwen3Config

    qc = Qwen3Config(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"],
        hidden_act=cfg["hidden_act"],
        max_position_embeddings=cfg["max_position_embeddings"],
        rms_norm_eps=cfg["rms_norm_eps"],
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        attention_bias=False,
        use_sliding_window=False,
        sliding_window=None,
        pad_token_id=cfg["pad_token_id"],
        bos_token_id=cfg["bos_token_id"],
        eos_token_id=cfg["eos_token_id"],
        use_cache=False,
    )
    qc._attn_implementation = "sdpa"
    return qc


def build_model(cfg: dict, seed: int = 0):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config(cfg))
    return model.float()


def save_sdar_dir(model, cfg: dict, directory: Path, tokenizer_dir: Path | None = None) -> Path:
    """Write ``config.json``, ``model.safetensors`` (float32, Qwen3 names) and the tokenizer files."""
    from safetensors.torch import save_file

    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    state = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    src = tiny_gsm.tokenizer_dir() if tokenizer_dir is None else Path(tokenizer_dir)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy(f, tmp / f.name)
    if directory.exists():
        shutil.rmtree(directory)
    tmp.rename(directory)
    return directory


def load_sdar_dir(directory: Path):
    """Load an SDAR-format directory written by :func:`save_sdar_dir` into ``Qwen3ForCausalLM``."""
    from safetensors.torch import load_file
    from transformers import Qwen3ForCausalLM

    cfg = json.loads((Path(directory) / "config.json").read_text())
    model = Qwen3ForCausalLM(qwen3_config(cfg))
    missing, unexpected = model.load_state_dict(
        load_file(str(Path(directory) / "model.safetensors")), strict=False
    )
    if [k for k in missing if "rotary" not in k] or unexpected:
        raise RuntimeError(f"bad checkpoint: missing={missing} unexpected={unexpected}")
    return model.float().eval(), cfg


# --------------------------------------------------------------------------------------------------
# Training batches
# --------------------------------------------------------------------------------------------------


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


def parse_block_mix(text: str) -> dict[int, float]:
    """Parse ``"B=weight,B=weight,..."`` (e.g. ``"1=1"`` or ``"2=.1,4=.3,8=.35,16=.25"``) into a mix.

    Block sizes are integers >= 1, weights positive numbers (normalised when drawing); a size may appear
    once. Raises ``ValueError`` with a one-line message otherwise.
    """
    mix: dict[int, float] = {}
    for part in text.split(","):
        size, sep, weight = part.strip().partition("=")
        try:
            b, w = int(size), float(weight)
        except ValueError:
            b, w = 0, 0.0
        if not sep or b < 1 or not (w > 0 and math.isfinite(w)):
            raise ValueError(
                f"bad block mix entry {part.strip()!r}: expected B=WEIGHT with B >= 1, WEIGHT > 0"
            )
        if b in mix:
            raise ValueError(f"block size {b} appears twice in the block mix")
        mix[b] = w
    return mix


AR_ONLY_MIX: dict[int, float] = {1: 1.0}


def check_ar_first(ar_first: float) -> float:
    """``ar_first`` as a float in [0, 1); ``ValueError`` with a one-line message otherwise."""
    if not 0.0 <= ar_first < 1.0:
        raise ValueError(f"ar_first must be in [0, 1), got {ar_first}")
    return float(ar_first)


def check_ema(decay: float) -> float:
    """An EMA decay in [0, 1) (0 = no averaging); ``ValueError`` with a one-line message otherwise."""
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
    return float(decay)


class WeightEMA:
    """Exponential moving average of a model's parameters (the weights that get evaluated and saved).

    ``update()`` after each optimiser step moves the average towards the live weights with decay
    ``min(decay, (1 + n) / (10 + n))`` (n = updates so far: early averages are not dominated by the random
    initialisation). ``swapped_in()`` is a context manager that puts the averaged weights into the
    model and restores the live ones afterwards. ``load_state_dict`` restores the average and its update
    count but keeps this instance's decay (a resumed run may be given a new one).
    """

    def __init__(self, model, decay: float):
        self.decay = check_ema(decay)
        self.params = list(model.parameters())
        self.shadow = [p.detach().clone() for p in self.params]
        self.updates = 0

    @torch.no_grad()
    def update(self) -> None:
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(self.shadow, [p.detach() for p in self.params], 1.0 - d)
        self.updates += 1

    def state_dict(self) -> dict:
        return {"decay": self.decay, "updates": self.updates, "shadow": [t.clone() for t in self.shadow]}

    def load_state_dict(self, st: dict) -> None:
        self.updates = int(st["updates"])
        for t, v in zip(self.shadow, st["shadow"], strict=True):
            t.copy_(v)

    @contextlib.contextmanager
    def swapped_in(self):
        live = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, e in zip(self.params, self.shadow, strict=True):
                p.copy_(e)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, v in zip(self.params, live, strict=True):
                    p.copy_(v)


def check_lr(lr: float) -> float:
    """A peak learning rate in (0, 1); ``ValueError`` with a one-line message otherwise."""
    if not 0.0 < lr < 1.0:
        raise ValueError(f"learning rate must be in (0, 1), got {lr}")
    return float(lr)


def mix_at(progress: float, ar_first: float, block_mix: dict[int, float] | None) -> dict[int, float]:
    """The block mix to train at ``progress`` (fraction of the budget done): AR mode only
    (:data:`AR_ONLY_MIX`) while ``progress < ar_first``, then ``block_mix`` (default :data:`BLOCK_MIX`).

    Diffusion samples teach AR mode almost nothing on this task (measured: AR-only training reaches a
    given AR accuracy in less than half the time of the mixed objective), so an AR phase first buys
    the verifier's accuracy cheaply and the drafter is then trained on top of it.
    """
    return AR_ONLY_MIX if progress < check_ar_first(ar_first) else (block_mix or BLOCK_MIX)


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
    ``block_sizes`` (per sample) default to ONE size for the whole batch drawn from :data:`BLOCK_MIX`
    (less padding than per-sample sizes), or from ``block_mix`` when given; ``token_causal`` (per
    sample) is drawn with probability :data:`P_TOKEN_CAUSAL` for B > 1 when not given. ``ar_copy``
    (per sample; default: every token-causal sample with B > 1) appends a second noisy copy with block
    size 1 (AR mode, every answer position masked): with a token-causal clean copy it is exactly the
    AR-mode objective, so the clean copy's cost is shared by two objectives. Returns a dict with
    ``input_ids``, ``position_ids``, ``attention_mask`` ([b,1,T,T] bool), ``loss_index`` (flat indices
    into [b*T]) and ``targets``.
    """
    n = len(examples)
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
    rows = []
    for (prompt, answer), B, ac in zip(examples, block_sizes, ar_copy, strict=True):
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
        rows.append(tuple(np.concatenate(a) for a in (toks, poss, bst, cps, loss_at, tgts)))
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
        "block_sizes": list(block_sizes),
        "token_causal": list(token_causal),
        "ar_copy": list(ar_copy),
    }


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


# --------------------------------------------------------------------------------------------------
# Batched greedy decoding (full recompute) for dev evaluation
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def decode_batch(
    model,
    prompts: list[list[int]],
    block_size: int,
    tau: float,
    mask_id: int,
    eos_id: int,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> tuple[list[list[int]], int]:
    """Greedy dynamic-threshold block decoding of many prompts at once, no KV cache.

    Blocks are aligned to absolute positions; the prompt's remainder sits at the start of its first
    block. Each step commits every masked position of the current block with confidence > ``tau`` (at
    least the most confident one). ``block_size=1`` is AR greedy decoding. Returns the generated token
    lists (cut before the first ``<eos>``) and the number of forwards.
    """
    B = block_size
    n = len(prompts)
    plen = torch.tensor([len(p) for p in prompts])
    cap = (-(-(plen + max_new_tokens) // B)) * B
    T = int(cap.max())
    tokens = torch.full((n, T), mask_id, dtype=torch.long)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    cur = plen // B
    done = torch.zeros(n, dtype=torch.bool)
    ar = torch.arange(T)
    full_mask = ((ar[None, :] // B) <= (ar[:, None] // B))[None, None]
    forwards = 0
    while not bool(done.all()):
        act = torch.nonzero(~done).squeeze(1)
        t_need = int(((cur[act] + 1) * B).max())
        hidden = model.model(
            input_ids=tokens[act, :t_need],
            attention_mask=full_mask[:, :, :t_need, :t_need],
            position_ids=ar[:t_need][None].expand(len(act), -1),
            use_cache=False,
        ).last_hidden_state
        forwards += 1
        idx = cur[act, None] * B + torch.arange(B)[None]  # [a, B]
        h = hidden.gather(1, idx[:, :, None].expand(-1, -1, hidden.shape[-1]))
        probs = model.lm_head(h).float().softmax(-1)
        conf, pred = probs.max(-1)
        blk_tok = tokens[act[:, None], idx]
        masked = (blk_tok == mask_id) & (idx >= plen[act, None])
        commit = masked & (conf > tau)
        none = ~commit.any(1) & masked.any(1)
        if bool(none.any()):
            best = torch.where(masked, conf, torch.full_like(conf, -1.0)).argmax(1)
            commit[none, best[none]] = True
        new_blk = torch.where(commit, pred, blk_tok)
        tokens[act[:, None], idx] = new_blk
        finished = ~((new_blk == mask_id) & (idx >= plen[act, None])).any(1)
        has_eos = ((new_blk == eos_id) & (idx >= plen[act, None])).any(1)
        cur[act] = cur[act] + finished.long()
        stop = finished & (has_eos | (cur[act] * B >= cap[act]))
        done[act[stop]] = True
    outs = []
    for i in range(n):
        gen = tokens[i, plen[i] :].tolist()
        if eos_id in gen:
            gen = gen[: gen.index(eos_id)]
        gen = [t for t in gen if t != mask_id]
        outs.append(gen)
    return outs, forwards


@torch.no_grad()
def decode_ar_cached(
    model, prompts: list[list[int]], mask_id: int, eos_id: int, max_new_tokens: int = MAX_NEW_TOKENS
) -> tuple[list[list[int]], int]:
    """Greedy AR-mode (B=1) decoding of many prompts at once with a KV cache (same result as
    ``decode_batch(..., block_size=1)``, much cheaper). Prompts are left-padded; each step feeds
    ``[last committed token, <mask>]``, reads the prediction at the mask and drops the mask's cache entry.
    """
    from transformers import DynamicCache

    n = len(prompts)
    plen = torch.tensor([len(p) for p in prompts])
    P = int(plen.max())
    pad = P - plen
    K = P + max_new_tokens + 1
    tokens = torch.full((n, K), mask_id, dtype=torch.long)
    for i, p in enumerate(prompts):
        tokens[i, pad[i] : P] = torch.tensor(p, dtype=torch.long)
    valid = torch.zeros((n, K), dtype=torch.bool)
    valid[:, P:] = True
    valid[:, :P] = torch.arange(P)[None] >= pad[:, None]
    pos_all = (torch.arange(K)[None] - pad[:, None]).clamp(min=0)
    ar = torch.arange(K)
    cache = DynamicCache()

    def run(lo, hi):
        m = (ar[None, :hi] <= ar[lo:hi, None])[None, None] & valid[:, None, None, :hi]
        m = m | (torch.eye(hi, dtype=torch.bool)[lo:hi][None, None] & ~valid[:, None, lo:hi, None])
        return model.model(
            input_ids=tokens[:, lo:hi],
            attention_mask=m,
            position_ids=pos_all[:, lo:hi],
            cache=cache,
            use_cache=True,
        ).last_hidden_state

    forwards = 0
    if P > 1:
        run(0, P - 1)
        forwards += 1
    done = torch.zeros(n, dtype=torch.bool)
    cur = P  # position being predicted
    for _ in range(max_new_tokens):
        hidden = run(cur - 1, cur + 1)  # [committed token at cur-1, mask at cur]
        forwards += 1
        cache.crop(-1)
        pred = model.lm_head(hidden[:, -1]).float().argmax(-1)
        pred = torch.where(done, torch.full_like(pred, eos_id), pred)
        tokens[:, cur] = pred
        done |= pred == eos_id
        cur += 1
        if bool(done.all()):
            break
    outs = []
    for i in range(n):
        gen = tokens[i, P:cur].tolist()
        if eos_id in gen:
            gen = gen[: gen.index(eos_id)]
        outs.append(gen)
    return outs, forwards


@torch.no_grad()
def evaluate(model, tok, problems: list[dict], chunk: int = 250) -> dict:
    """Dev accuracy in AR mode (B=1, KV-cached) and with dynamic B=8, tau=0.9 (greedy, full recompute)."""
    model.eval()
    prompts = [tok.encode(p["question"], add_special_tokens=False) for p in problems]
    res = {}
    for name, B, tau in (("acc_ar", 1, 1.0), ("acc_dyn8", 8, 0.9)):
        correct, fwd, ntok = 0, 0, 0
        mask_id, eos_id = tok.mask_token_id, tok.eos_token_id
        for c in range(0, len(problems), chunk):
            if B == 1:
                outs, f = decode_ar_cached(model, prompts[c : c + chunk], mask_id, eos_id)
            else:
                outs, f = decode_batch(model, prompts[c : c + chunk], B, tau, mask_id, eos_id)
            fwd += f
            for o, p in zip(outs, problems[c : c + chunk], strict=True):
                ntok += len(o) + 1
                correct += tiny_gsm.is_correct(tok.decode(o), p["final"])
        res[name] = correct / max(1, len(problems))
        res[name.replace("acc", "forwards")] = fwd
    res["score"] = res["acc_ar"] + res["acc_dyn8"]
    model.train()
    return res


# --------------------------------------------------------------------------------------------------
# Training loop
# --------------------------------------------------------------------------------------------------


def _lr_factor(step: int, frac: float) -> float:
    warm = min(1.0, (step + 1) / WARMUP_STEPS)
    frac = min(max(frac, 0.0), 1.0)
    return warm * (LR_FLOOR + (1 - LR_FLOOR) * 0.5 * (1 + math.cos(math.pi * frac)))


def _pool(stream, tok, n: int, rng: np.random.Generator):
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


class _ThreadChooser:
    """Use 1 or 2 intra-op threads, whichever is faster right now (never more than 2).

    Measured on the 2-core machine: with another process busy on one core, two OpenMP threads are ~5x
    SLOWER than one (6-7 s vs 1.3 s per step); alone, two are faster. Starts with one thread; at its 8th
    and 30th step and every ``probe_every`` steps the other setting is tried for up to ``probe_len``
    steps (abandoned after one step if that step is clearly slower) and kept if its time per position is
    lower. It also probes at once when the last 5 steps are 1.4x slower than the setting's settled speed.
    """

    def __init__(self, probe_every: int = 150, probe_len: int = 3):
        self.n = 1
        self.probe_every, self.probe_len = probe_every, probe_len
        self.recent: list[float] = []
        self.trial: list[float] | None = None
        self.settled = float("inf")
        self.after_degraded = False
        self.count = 0  # steps seen by this process (a resumed run probes early too)
        torch.set_num_threads(self.n)

    @staticmethod
    def _median(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    def record(self, sec_per_pos: float, step: int) -> None:
        self.count += 1
        if self.trial is not None:
            self.trial.append(sec_per_pos)
            base = self._median(self.recent[-20:])
            mine = self._median(self.trial)
            if sec_per_pos > 1.3 * base or (len(self.trial) >= self.probe_len and mine >= base):
                self.n = 3 - self.n  # revert
                torch.set_num_threads(self.n)
                self.trial = None
                if self.after_degraded:  # both settings slow now: re-learn this one's speed
                    self.recent, self.settled = [], float("inf")
            elif len(self.trial) >= self.probe_len:
                self.recent = []  # keep the new setting
                self.trial = None
            return
        self.recent.append(sec_per_pos)
        self.recent = self.recent[-40:]
        if len(self.recent) == 10:
            self.settled = self._median(self.recent)
        degraded = len(self.recent) >= 15 and self._median(self.recent[-5:]) > 1.4 * self.settled
        if (step % self.probe_every == 0 or self.count in (8, 30) or degraded) and len(self.recent) >= 4:
            self.n = 3 - self.n
            torch.set_num_threads(self.n)
            self.trial = []
            self.after_degraded = degraded
            if degraded:  # the old speed is stale: compare against the recent one
                self.recent = self.recent[-5:]


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train_tiny(
    minutes: float,
    out: Path,
    seed: int = 0,
    steps: int | None = None,
    resume: bool = True,
    eval_every_minutes: float = 7.0,
    dev_size: int = 500,
    progress: bool = True,
    eval_start_fraction: float = 0.4,
    ckpt_every_minutes: float = 2.0,
    block_mix: dict[int, float] | None = None,
    ar_first: float | None = None,
    compile: bool = False,
    lr: float | None = None,
    ema: float | None = None,
    hard_focus: float | None = None,
) -> Path:
    """Train tiny-gsm for ``steps`` optimiser steps or ``minutes`` of wall-clock time (evaluations
    included), whichever ends first; return ``out/best``. The learning-rate schedule follows whichever
    budget is closer to its end, so it completes its decay either way.

    Evaluates on the first ``dev_size`` dev problems every ``eval_every_minutes`` once
    ``eval_start_fraction`` of the budget has passed, and at the end; keeps the best by
    ``acc_ar + acc_dyn8`` (see module docstring). With ``resume`` a run restarts from ``out/ckpt.pt``.
    ``block_mix`` replaces :data:`BLOCK_MIX` (e.g. ``{1: 1.0}``: AR mode only); a resumed run keeps the
    mix it was started with unless one is given. ``ar_first`` (default :data:`AR_FIRST` for a new run;
    a resumed run keeps its own): the fraction of the budget trained in AR mode only before the mix
    starts (:func:`mix_at`). ``compile``: run the training forward/backward through ``torch.compile``
    (measured on 2 CPU cores: 1.2-1.4x faster steps in isolation but only 3-6% more steps per minute in
    a 60-minute run, after a warm-up of about 2 minutes that counts against the budget; falls back to
    eager with a warning if compilation fails). Evaluation always runs eager.
    ``lr``: peak learning rate (default :data:`LR` for a new run; a resumed run keeps its own).
    ``ema``: decay of an exponential moving average of the weights (default :data:`EMA_DECAY` for a new
    run; 0 = off; a resumed run keeps its own); when on, evaluation and ``best/`` use the averaged
    weights (:class:`WeightEMA`).
    ``hard_focus``: thin out training problems with few carrying or borrowing digit columns
    (:func:`s2d2.tasks.tiny_gsm.keep_probability`; default :data:`HARD_FOCUS` for a new run, 0 = the
    natural distribution; a resumed run keeps its own).
    """
    from tqdm import tqdm

    threads = _ThreadChooser()
    torch.set_flush_denormal(True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = tiny_gsm.build_tokenizer(None)
    tok_dir = tiny_gsm.tokenizer_dir()
    cfg = sdar_config(tok)
    model = build_model(cfg, seed)
    model.train()
    decay = [p for n_, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n_, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR,
        betas=BETAS,
    )
    total_s = minutes * 60.0
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    state = {"step": 0, "elapsed": 0.0, "stream_index": 0, "best": None, "last_eval": 0.0, "evals": []}
    rng = np.random.default_rng(seed)
    random.seed(seed)
    torch.manual_seed(seed)
    ckpt_path = out / "ckpt.pt"
    log_path = out / "train_log.jsonl"
    ck = None
    if resume and ckpt_path.is_file():
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        rng.bit_generator.state = ck["np_rng"]
        random.setstate(ck["py_rng"])
        torch.set_rng_state(ck["torch_rng"])
        total_s = ck.get("total_s", total_s) if minutes <= 0 else total_s
        steps = ck.get("steps", steps) if steps is None else steps
        block_mix = ck.get("block_mix") if block_mix is None else block_mix
        ar_first = ck.get("ar_first", 0.0) if ar_first is None else ar_first  # older runs: no AR phase
        lr = ck.get("lr", LR) if lr is None else lr
        ema = ck.get("ema_decay", 0.0) if ema is None else ema
        hard_focus = ck.get("hard_focus", 0.0) if hard_focus is None else hard_focus
    elif not resume and log_path.exists():
        log_path.unlink()
    ar_first = check_ar_first(AR_FIRST if ar_first is None else ar_first)
    peak_lr = check_lr(LR if lr is None else lr)
    ema_decay = check_ema(EMA_DECAY if ema is None else ema)
    hard_focus = tiny_gsm.check_hard_focus(HARD_FOCUS if hard_focus is None else hard_focus)
    averager = WeightEMA(model, ema_decay) if ema_decay > 0 else None
    if averager is not None and ck is not None and ck.get("ema") is not None:
        averager.load_state_dict(ck["ema"])
    dev = tiny_gsm.load_split("dev", dev_size)
    stream = tiny_gsm.iter_train_problems(seed, start=state["stream_index"], hard_focus=hard_focus)
    # dynamic shapes: batches differ in length and (in the mix) in block size; one compilation serves all
    body = torch.compile(model.model, dynamic=True) if compile else model.model
    log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 (closed at the end of the run)

    def write_log(rec):
        log.write(json.dumps(rec) + "\n")
        log.flush()

    def save_ckpt():
        _atomic_save(
            {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "state": state,
                "np_rng": rng.bit_generator.state,
                "py_rng": random.getstate(),
                "torch_rng": torch.get_rng_state(),
                "total_s": total_s,
                "steps": steps,
                "block_mix": block_mix,
                "ar_first": ar_first,
                "lr": peak_lr,
                "ema_decay": averager.decay if averager is not None else 0.0,
                "hard_focus": hard_focus,
                "ema": averager.state_dict() if averager is not None else None,
                "config": cfg,
            },
            ckpt_path,
        )

    def do_eval():
        t0 = time.time()
        # evaluate, and keep as best/, the averaged weights when --ema is on
        with averager.swapped_in() if averager is not None else contextlib.nullcontext():
            res = evaluate(model, tok, dev)
            res.update(
                step=state["step"],
                elapsed_min=round(state["elapsed"] / 60, 2),
                eval_s=round(time.time() - t0, 1),
                kind="eval",
            )
            key = (res["score"], res["acc_ar"])
            best = state["best"]
            if best is None or key > (best["score"], best["acc_ar"]):
                state["best"] = {k: res[k] for k in ("score", "acc_ar", "acc_dyn8", "step", "elapsed_min")}
                save_sdar_dir(model, cfg, out / "best", tok_dir)
                (out / "best.json").write_text(json.dumps(state["best"], indent=2) + "\n")
                res["new_best"] = True
        state["evals"].append(res)
        write_log(res)
        return res

    def progress_frac() -> float:
        frac = state["elapsed"] / total_s
        return max(frac, state["step"] / steps) if steps else frac

    def finished() -> bool:
        return state["elapsed"] >= total_s or (steps is not None and state["step"] >= steps)

    bar = tqdm(
        total=1000,
        disable=not progress,
        initial=int(1000 * progress_frac()),
        bar_format="{l_bar}{bar}| [{elapsed}<{remaining}{postfix}]",
    )
    batches: list = []
    last_ckpt = state["elapsed"]
    loss_ema = None
    t_prev = time.time()
    step_times: list[float] = []
    while not finished():
        if not batches:
            batches = _pool(stream, tok, BATCH_SIZE * POOL_BATCHES, rng)
            state["stream_index"] += BATCH_SIZE * POOL_BATCHES
        t0 = time.time()
        frac = progress_frac()
        mix = mix_at(frac, ar_first, block_mix)
        batch = build_batch(
            batches.pop(), rng, tok.mask_token_id, tok.eos_token_id, tok.pad_token_id, block_mix=mix
        )
        lr = peak_lr * _lr_factor(state["step"], frac)
        for g in opt.param_groups:
            g["lr"] = lr
        try:
            loss = batch_loss(model, batch, body)
        except Exception as exc:  # a compiler problem (no C++ toolchain, unsupported op): go eager
            if body is model.model:
                raise
            msg = f"torch.compile failed ({type(exc).__name__}: {exc}); training eagerly"
            warnings.warn(msg, stacklevel=1)
            body = model.model
            loss = batch_loss(model, batch, body)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        if averager is not None:
            averager.update()
        state["step"] += 1
        step_times.append(time.time() - t0)
        threads.record(step_times[-1] / batch["input_ids"].numel(), state["step"])
        lv = float(loss.detach())
        loss_ema = lv if loss_ema is None else 0.98 * loss_ema + 0.02 * lv
        now = time.time()
        state["elapsed"] += now - t_prev
        t_prev = now
        if state["step"] % 50 == 0 or state["step"] in (1, 10, 20):
            spst = sum(step_times[-50:]) / len(step_times[-50:])
            write_log(
                {
                    "kind": "train",
                    "step": state["step"],
                    "elapsed_min": round(state["elapsed"] / 60, 3),
                    "loss": round(lv, 4),
                    "loss_ema": round(loss_ema, 4),
                    "lr": lr,
                    "grad_norm": round(float(gnorm), 3),
                    "s_per_step": round(spst, 3),
                    "threads": threads.n,
                    "positions": int(batch["input_ids"].numel()),
                    "block_size": batch["block_sizes"][0],
                }
            )
        if progress:
            bar.n = min(int(1000 * progress_frac()), 1000)
            best = state["best"]
            bar.set_postfix_str(
                f"step {state['step']}"
                + (f"/{steps}" if steps else "")
                + (" AR phase" if mix is AR_ONLY_MIX else "")
                + f" loss {loss_ema:.3f} lr {lr:.1e}"
                + (f" best ar {best['acc_ar']:.3f} dyn8 {best['acc_dyn8']:.3f}" if best else ""),
                refresh=False,
            )
            bar.refresh()
        eval_due = (
            progress_frac() >= eval_start_fraction
            and state["elapsed"] - state["last_eval"] >= eval_every_minutes * 60
        )
        if eval_due and not finished():
            state["last_eval"] = state["elapsed"]
            res = do_eval()
            if progress:
                bar.write(
                    f"eval step {res['step']} @ {res['elapsed_min']:.1f} min: AR {res['acc_ar']:.3f} "
                    f"dyn8 {res['acc_dyn8']:.3f} ({res['eval_s']:.0f}s)"
                )
            now = time.time()
            state["elapsed"] += now - t_prev
            t_prev = now
            save_ckpt()
            last_ckpt = state["elapsed"]
        elif state["elapsed"] - last_ckpt >= ckpt_every_minutes * 60:
            save_ckpt()
            last_ckpt = state["elapsed"]
    # final evaluation (unless the last one was at this very step)
    if not state["evals"] or state["evals"][-1]["step"] != state["step"]:
        res = do_eval()
        if progress:
            bar.write(f"final eval step {res['step']}: AR {res['acc_ar']:.3f} dyn8 {res['acc_dyn8']:.3f}")
    save_ckpt()
    bar.close()
    write_log(
        {
            "kind": "done",
            "step": state["step"],
            "elapsed_min": round(state["elapsed"] / 60, 3),
            "best": state["best"],
        }
    )
    log.close()
    return out / "best"


def _checked(check, convert=float):
    """An argparse ``type``: ``convert(text)`` passed through ``check``; a ValueError from either becomes
    the usage error (one line, no traceback)."""

    def parse(text: str):
        try:
            return check(convert(text))
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Train the built-in tiny-gsm block-diffusion model (CPU).")
    ap.add_argument("--minutes", type=float, required=True, help="wall-clock budget, evaluations included")
    ap.add_argument("--steps", type=int, default=None, help="optimiser-step budget (first to end wins)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-resume", action="store_true")
    ap.add_argument("--eval-every", type=float, default=7.0, help="minutes between dev evaluations")
    ap.add_argument("--eval-start", type=float, default=0.4, help="fraction of the budget before evaluating")
    ap.add_argument("--dev-size", type=int, default=500)
    ap.add_argument(
        "--block-mix", type=_checked(parse_block_mix, str), default=None, help="B=WEIGHT,... (see BLOCK_MIX)"
    )
    ap.add_argument(
        "--ar-first",
        type=_checked(check_ar_first),
        default=None,
        help="fraction of the budget in AR mode only",
    )
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--compile", action="store_true", help="train through torch.compile")
    ap.add_argument("--lr", type=_checked(check_lr), default=None, help=f"peak learning rate (default {LR})")
    ap.add_argument(
        "--ema", type=_checked(check_ema), default=None, help=f"weight-average decay (default {EMA_DECAY})"
    )
    ap.add_argument(
        "--hard-focus",
        type=_checked(tiny_gsm.check_hard_focus),
        default=None,
        help=f"thin out problems without carries/borrows, in [0, 1) (default {HARD_FOCUS}; 0 = natural)",
    )
    a = ap.parse_args(argv)
    best = train_tiny(
        a.minutes,
        a.out,
        seed=a.seed,
        steps=a.steps,
        resume=not a.no_resume,
        eval_every_minutes=a.eval_every,
        dev_size=a.dev_size,
        progress=not a.no_progress,
        eval_start_fraction=a.eval_start,
        block_mix=a.block_mix,
        ar_first=a.ar_first,
        compile=a.compile,
        lr=a.lr,
        ema=a.ema,
        hard_focus=a.hard_focus,
    )
    print(f"best model: {best}")


if __name__ == "__main__":
    main()
