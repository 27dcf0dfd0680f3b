"""Dev evaluation of tiny-gsm during training: batched greedy decoding (AR mode with a KV cache, and the
dynamic-threshold block decoder with full recompute) and the dev accuracies that select the checkpoint."""

from __future__ import annotations

import torch

from s2d2.tasks import tiny_gsm

__all__ = ["MAX_NEW_TOKENS", "decode_ar_cached", "decode_batch", "evaluate"]

MAX_NEW_TOKENS = 56


def _cut_at_eos(gen: list[int], eos_id: int) -> list[int]:
    """``gen`` up to (not including) its first ``<eos>``."""
    return gen[: gen.index(eos_id)] if eos_id in gen else gen


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
    outs = [[t for t in _cut_at_eos(tokens[i, plen[i] :].tolist(), eos_id) if t != mask_id] for i in range(n)]
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
    return [_cut_at_eos(tokens[i, P:cur].tolist(), eos_id) for i in range(n)], forwards


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
