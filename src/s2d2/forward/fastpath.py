"""A lean batched forward for Qwen2/Qwen3/Qwen3-MoE/Glm4-MoE-style decoders (every family here).

Decoding calls the model many times on a handful of tokens per row, where transformers' generic forward
spends more time in Python (mask preparation, cache concatenation, output objects) than in arithmetic,
and cannot give each row of a batch its own cached length. This path reuses the native module's own
weights and sub-modules (norms, MLP or mixture of experts, rotary embedding) and only replaces the
attention plumbing:

* keys/values live in the pages of a :class:`~s2d2.forward.kv_pool.KVPool`; each row writes its new
  keys at its own length through its page table and attention gathers each row's pages;
* the tokens of all rows are packed into one sequence for the projections and MLPs; attention pads them
  to the longest segment, and the float mask ``[rows, 1, queries, keys]`` carries each row's own
  visibility (its cache, its segment's mask, nothing of the padding).

A mixture-of-experts model routes tokens by data. Qwen3-MoE's routed experts (:mod:`.routed_experts`)
run as two grouped products over the slots sorted by expert where ``torch._grouped_mm`` runs on the
model's device and dtype (bf16 on recent GPUs, checked at load): nothing is read on the host and every
shape follows the token count, so the forward is captured like a dense one, per bucket, and batches above
the largest bucket run eagerly. Elsewhere (float32 on CUDA, an older GPU), and for Glm4-MoE's module
(LLaDA2), the experts' products follow the routing's counts, which a CUDA graph cannot hold: such a
model's forward is never captured and every batch runs eagerly (as with ``enforce_eager``).

It computes the same function as the native forward (the golden tests run both paths).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .attention_groups import AttentionGroup, build_groups
from .describe import Geometry, describe
from .forward_batch import BatchShape, ForwardBatch, field_sizes
from .graph_runner import StaticRunner, load_shapes
from .host_lists import long_tensor
from .kv_pool import DEFAULT_PAGE_SIZE, KVPool, KVState, check_pages
from .paged_forward import (
    LayerWeights,
    layer_forward,
    layer_weights,
    rotate_half_matrix,
    rotations,
    span_mask,
)
from .segment import Segment, packed
from .small_ops import SmallOps, small_ops_for
from .span_attention import self_check, triton_available
from .tensor_parallel import OneRank, TensorParallel, collectives


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the first ``cos.shape[-1]`` dims of each head (partial rotary passes the rest)."""
    rd = cos.shape[-1]
    if rd == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rot, rest = x[..., :rd], x[..., rd:]
    return torch.cat([rot * cos + _rotate_half(rot) * sin, rest], dim=-1)


def _eager(shape: BatchShape) -> None:
    """No bucket: every batch runs eagerly at its own shape."""
    return None


class FastDecoder:
    """Batched forward of a native ``Qwen2/Qwen3/Qwen3Moe/Glm4Moe ForCausalLM`` against a :class:`KVPool`."""

    SUPPORTED = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Glm4MoeForCausalLM")

    def __init__(
        self, model: torch.nn.Module, *, enforce_eager: bool = False, tp: TensorParallel | None = None
    ):
        self.model = model
        #: this rank's group: a :class:`~s2d2.forward.tensor_parallel.TensorParallel` (the model then holds
        #: this rank's shard: its heads, columns, vocabulary slice, experts), else the whole model here and
        #: a :class:`~s2d2.forward.tensor_parallel.OneRank`, whose collectives are no-ops
        self.tp: TensorParallel | OneRank = tp or OneRank(model.lm_head.out_features)
        cfg = model.config
        self.layers = list(model.model.layers)
        self.embed = model.model.embed_tokens
        self.norm = model.model.norm
        self.lm_head = model.lm_head
        self.rotary = model.model.rotary_emb
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        attn = self.layers[0].self_attn
        self.qk_norm = hasattr(attn, "q_norm") and getattr(attn, "use_qk_norm", True)
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device
        #: on the CPU, explicit attention and fused RMSNorm beat the generic kernels at these sizes
        self.cpu_kernels = self.device.type == "cpu" and self.dtype == torch.float32
        #: the paged forward's attention: "triton" (the span kernel, CUDA), "sdpa" or "cpu" (explicit)
        self.attention = "cpu" if self.cpu_kernels else "sdpa"
        if self.device.type == "cuda" and triton_available() and self.head_dim & (self.head_dim - 1) == 0:
            problem = self_check(self.n_heads, self.n_kv, self.head_dim, self.dtype, self.device)
            if problem is None:
                self.attention = "triton"
            else:
                warnings.warn(f"s2d2: the Triton span-attention kernel is not used ({problem}); SDPA instead",
                              stacklevel=2)  # fmt: skip
        with torch.no_grad():  # not inference tensors: the modules' own weights become views of these
            #: each layer's fused weights (:func:`~s2d2.forward.paged_forward.layer_weights`)
            self.weights: list[LayerWeights] = [
                layer_weights(la, self.n_heads, self.n_kv, self.qk_norm) for la in self.layers
            ]
        with torch.no_grad():  # the rotary dims the model's own rotary embedding gives
            probe = torch.zeros(1, 1, 1, dtype=self.dtype, device=self.device)
            at = torch.zeros(1, 1, dtype=torch.long, device=self.device)
            rotary_dim = self.rotary(probe, at)[0].shape[-1]
        self.signs = rotate_half_matrix(self.head_dim, rotary_dim, self.dtype, self.device)
        #: a mixture-of-experts MLP routes tokens by data: its forward is captured only where its experts
        #: run as grouped products (no host read, shapes from the token count alone)
        self.capturable = all(w.gate_up is not None or (w.moe is not None and w.moe.grouped)
                              for w in self.weights)  # fmt: skip
        self._pool: KVPool | None = None
        self.static: StaticRunner | None = None
        #: the small element-wise ops compiled (CUDA unless ``enforce_eager``), else None (eager ops)
        self.small: SmallOps | None = None
        self.enforce_eager = enforce_eager

    @property
    def enforce_eager(self) -> bool:
        """Run every forward eagerly (no CUDA graphs; vLLM's ``enforce_eager``). CUDA graphs are used
        only on CUDA, for capturable models, unless this is set."""
        return self.static is None

    @enforce_eager.setter
    def enforce_eager(self, value: bool) -> None:
        # several ranks run eagerly: a graph cannot hold their collectives
        graphs = self.device.type == "cuda" and self.capturable and not value and self.tp.size == 1
        self.static = self.static_runner(graphs=True) if graphs else None
        self.small = small_ops_for(self.device, value, triton_available())

    def static_runner(self, *, graphs: bool, **kwargs) -> StaticRunner:
        """A :class:`StaticRunner` over this decoder's forward body and the pool the last forward used
        (``graphs=False``: the replay emulation, on any device)."""

        def pool_ptr() -> int:
            pool = self._pool
            return 0 if pool is None else hash((id(pool), pool.k[0].data_ptr(), pool.v[-1].data_ptr()))

        return StaticRunner(lambda b: self.run_batch(self._pool, b), self.device, graphs=graphs,
                            pool_ptr=pool_ptr, **kwargs)  # fmt: skip

    def _norm(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The native RMSNorm (``weight * x / rms(x)``): fused on the CPU in float32, compiled where the
        small ops are (:mod:`~s2d2.forward.small_ops`), else the module itself."""
        if self.cpu_kernels:
            return F.rms_norm(x, module.weight.shape, module.weight, module.variance_epsilon)
        if self.small is not None:
            return self.small.rms_norm(x, module.weight, module.variance_epsilon)
        return module(x)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """Attention ``[heads, rows, n_q, hd]`` over ``[kv_heads, rows, n_k, hd]`` with a float mask
        ``[1, rows, n_q, n_k]`` (head-major, as the pool holds keys)."""
        if not self.cpu_kernels:
            gqa = self.n_kv != self.n_heads
            q, k, v, mask = (t.transpose(0, 1) for t in (q, k, v, mask))
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
            return o.transpose(0, 1)
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(mask)
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    @classmethod
    def supports(cls, model: torch.nn.Module) -> bool:
        cfg = model.config
        sliding = any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or []))
        return type(model).__name__ in cls.SUPPORTED and not sliding

    def new_pool(
        self, *, page_size: int = DEFAULT_PAGE_SIZE, max_pages: int | None = None,
        reserve_tokens: int | None = None,
    ) -> KVPool:  # fmt: skip
        """A key/value pool for this model (an engine then captures its graphs: :meth:`capture`)."""
        sizes = dict(page_size=page_size, max_pages=max_pages, reserve_tokens=reserve_tokens)
        dims = (len(self.layers), self.n_kv, self.head_dim)
        pool = KVPool(*dims, dtype=self.dtype, device=self.device, **sizes)
        if self.tp.driver:  # every rank makes the same pool of its own heads
            self.tp.announce(pool, sizes)
        return pool

    @torch.inference_mode()
    def capture(self, pool: KVPool, shapes: list[BatchShape] | None = None) -> int:
        """Capture the forward's graphs of ``shapes`` (default: the common ones,
        :func:`~s2d2.forward.graph_runner.load_shapes`) against ``pool`` now, with one progress line,
        rather than at each shape's first batch; the replay emulation (a static runner without graphs)
        prepares its buffers the same way. Returns how many shapes were prepared (0 without a static
        runner: the CPU, ``enforce_eager``, a mixture of experts)."""
        if self.static is None:
            return 0
        self._pool = pool
        wanted = load_shapes(self.static.max_tokens) if shapes is None else shapes
        return self.static.prepare(wanted, lambda s: field_sizes(s, self.n_heads), pool.page_size)

    def geometry(self) -> Geometry:
        """What describing a forward needs of this model (:func:`~.describe.describe`): its heads and the
        bucket a batch runs at (a captured graph's shape; None: eagerly)."""
        bucket = self.static.shape_for if self.static is not None else _eager
        return Geometry(self.n_heads, self.n_kv, bucket)

    @torch.inference_mode()
    def forward(self, pool: KVPool, segments: Sequence[Segment]) -> list[torch.Tensor]:
        """Run every segment in one forward; return each one's raw logits ``[len(logit_rows), vocab]`` in
        the model's dtype.

        Segments whose visibility is a :mod:`~s2d2.layouts.mask_spec` (every layout's; a boolean mask
        that fits one; not the LLaDA2 official prefill's float bias) run as one :class:`ForwardBatch`
        (:func:`~.describe.describe`) through :meth:`forward_batch`; the rest run the grouped path
        (:meth:`grouped_forward`). The rows must hold pages for ``[0, length + n)``
        (:class:`~.kv_pool.PagesNotHeld` before anything runs); no page is taken and no length advanced.
        """
        batch = describe(segments, pool, self.geometry())
        if batch is None:
            return self.grouped_forward(pool, segments)
        return list(self.forward_batch(pool, batch).split(batch.logit_sizes))

    @torch.inference_mode()
    def forward_batch(self, pool: KVPool, batch: ForwardBatch, summary: int | None = None) -> torch.Tensor:
        """The forward of a host batch described by :func:`~.describe.describe` with :meth:`geometry`:
        packed logits ``[L, vocab]`` in the model's dtype (a replayed graph at a bucket's shape, else
        eagerly). Touches no request. Tensor-parallel: rank 0 sends the batch to every rank first (one
        message) and the ranks run it together; with ``summary`` (the token to exclude) rank 0 gets the
        rows' summaries ``[L, WIDTH]`` instead (:mod:`.vocab_summary`; :meth:`full_logits` then)."""
        message = ("batch", pool.tp_id, pool.pages.num_pages, batch, summary)
        sizes = (len(batch.ids), len(batch.logit_index))
        plan = lambda: collectives(self, *sizes, summary)  # noqa: E731
        return self.tp.forward(message, lambda: self._run_here(pool, batch, summary), plan)

    def _run_here(self, pool: KVPool, batch: ForwardBatch, summary: int | None) -> torch.Tensor:
        """This rank's part of :meth:`forward_batch`: a replayed graph at a bucket's shape, else eagerly."""
        if self.static is None or self.static.shape_for(batch.shape) != batch.shape:
            return self.run_batch(pool, batch.to(self.device), summary)
        self._pool = pool
        return self.static.run(batch)

    def run_batch(self, pool: KVPool, b: ForwardBatch, summary: int | None = None) -> torch.Tensor:
        """The forward of a batch on the device: packed logits ``[L, vocab]`` of ``b.logit_index``, in the
        model's dtype. Touches no request and no host data beyond ``b``'s sizes."""
        weights = self.weights
        x = self._embed(b.ids)  # [T, hidden]
        cos, sin = self.rotary(x[None], b.pos[None])
        if self.small is None:  # each token's rotation matrix, applied by one batched matmul a layer
            rot: torch.Tensor | tuple[torch.Tensor, torch.Tensor] = rotations(cos[0], sin[0], self.signs)
        else:  # cos/sin [T, 1, rd] for the compiled q/k-norm with RoPE
            rot = (cos[0][:, None], sin[0][:, None])
        rep = self.n_heads // self.n_kv
        mask = None if self.attention == "triton" else span_mask(b, self.n_kv, rep, self.dtype)
        for i, layer in enumerate(self.layers):
            x = layer_forward(self, i, layer, weights[i], x, rot, b, mask, pool)
        chosen = x.index_select(0, b.logit_index)
        return self._logits(self._norm(self.norm, chosen), summary)

    def full_logits(self) -> torch.Tensor:
        """Rank 0: the full logits ``[L, vocab]`` of the last forward of summaries."""
        return self.tp.forward(("logits",), self.tp.gather_kept)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``[T, hidden]`` (vocab-parallel over the ranks where tensor-parallel)."""
        return self.tp.embed(self.embed.weight, ids)

    def _logits(self, h: torch.Tensor, summary: int | None = None) -> torch.Tensor:
        """LM head logits of the normed hidden states ``h`` ``[L, hidden]``: ``[L, vocab]`` (tensor-parallel:
        each rank's vocabulary slice, gathered on rank 0, or with ``summary`` their summaries; the other
        ranks get None)."""
        return self.tp.logits(self.lm_head(h), summary)

    def grouped_forward(
        self, pool: KVPool, segments: Sequence[Segment], tables: list[list[int]] | None = None
    ) -> list[torch.Tensor]:
        """The grouped path: rows padded per group of similar lengths, float masks with biases.

        Tokens of all rows are packed into one ``[T, hidden]`` sequence for the projections and MLPs (no
        padding work); only attention pads them, per group of similar lengths
        (:mod:`~s2d2.forward.attention_groups`). Each segment's new keys/values are written at its row's
        cached length, through its page table (the rows hold pages for ``[0, length + n)``; none is taken
        here and no length advanced). ``tables``: the rows' page tables (default: the pool's).
        Tensor-parallel: rank 0 sends the segments (without their pool) and tables to every rank first.
        """
        if self.tp.driver:
            check_pages(segments)  # before the message: a row without its pages fails alone
            tables = [pool.table(s.state) for s in segments]
            message = ("segments", pool.tp_id, pool.pages.num_pages, [_bare(s) for s in segments], tables)
            rows = sum(s.logit_rows.numel() for s in segments)
            plan = lambda: collectives(self, sum(s.n for s in segments), rows, None, rows > 0)  # noqa: E731
            return self.tp.forward(message, lambda: self._grouped(pool, segments, tables), plan)
        return self._grouped(pool, segments, tables)

    def _grouped(
        self, pool: KVPool, segments: Sequence[Segment], tables: list[list[int]] | None
    ) -> list[torch.Tensor]:
        dev, ps = self.device, pool.page_size
        check_pages(segments)
        page_lists = tables if tables is not None else [pool.table(s.state) for s in segments]
        width = max(map(len, page_lists))
        flat_tables = [page for p in page_lists for page in (p + [0] * (width - len(p)))]
        tables = long_tensor(flat_tables).view(len(segments), width)
        tables_dev = tables.to(dev)
        sizes = long_tensor([s.n for s in segments])
        ids = packed([s.ids for s in segments]).to(dev)
        pos = packed([s.pos for s in segments]).to(dev)
        r_idx = torch.repeat_interleave(torch.arange(len(segments)), sizes)
        j_idx = torch.arange(int(sizes.sum())) - (sizes.cumsum(0) - sizes)[r_idx]
        lengths = long_tensor([s.state.length for s in segments])
        col = lengths[r_idx] + j_idx
        write_page = tables[r_idx, col // ps].to(dev)
        write_off = (col % ps).to(dev)
        groups = build_groups(segments, page_lists, tables_dev, ps, self.dtype, dev)
        x = self._embed(ids)[None]  # [1, T, hidden]
        cos, sin = self.rotary(x, pos[None])
        cos, sin = cos[0, :, None], sin[0, :, None]  # [T, 1, rot]
        T, hd, H = ids.numel(), self.head_dim, self.n_heads
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = self._norm(layer.input_layernorm, x)
            q = attn.q_proj(h).view(T, H, hd)
            k = attn.k_proj(h).view(T, self.n_kv, hd)
            v = attn.v_proj(h).view(T, self.n_kv, hd)
            if self.qk_norm:
                q, k = self._norm(attn.q_norm, q), self._norm(attn.k_norm, k)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            pool.k[i][:, write_page, write_off] = k.transpose(0, 1)
            pool.v[i][:, write_page, write_off] = v.transpose(0, 1)
            o = self._grouped_attention(pool, i, q, groups, attn.scaling)
            out = o.reshape(1, T, H * hd)
            x = x + self.tp.row_parallel(out, attn.o_proj)  # several ranks: the bias once, after the sum
            x = x + self.tp.reduce(layer.mlp(self._norm(layer.post_attention_layernorm, x)))
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        flat = torch.cat([offsets[r] + s.logit_rows for r, s in enumerate(segments)])
        if flat.numel() == 0:
            empty = x.new_zeros(0, self.tp.vocab_size)
            return [empty for _ in segments]
        chosen = x[0].index_select(0, flat.to(dev))
        logits = self._logits(self._norm(self.norm, chosen))
        if logits is None:  # a rank but 0: the logits went to rank 0
            return []
        return list(logits.split([s.logit_rows.numel() for s in segments]))

    def _grouped_attention(
        self, pool: KVPool, layer: int, q: torch.Tensor, groups: list[AttentionGroup], scale: float
    ) -> torch.Tensor:
        """Attention output ``[T, heads, hd]`` of the packed queries ``q`` ``[T, heads, hd]``."""
        pk, pv = pool.k[layer], pool.v[layer]
        out = None if groups[0].tokens is None else q.new_empty(q.shape)
        for g in groups:
            keys, values = self._gather(pk, g), self._gather(pv, g)
            q_g = q if g.tokens is None else q[g.tokens]
            if g.row is None:
                q_pad = q_g[None]
            else:
                q_pad = q.new_zeros(g.n_rows, g.n_q, self.n_heads, self.head_dim)
                q_pad[g.row, g.col] = q_g
            o = self._attend(q_pad.permute(2, 0, 1, 3), keys, values, g.mask, scale).permute(1, 2, 0, 3)
            o = o[0] if g.row is None else o[g.row, g.col]  # [t, heads, hd]
            if g.tokens is None:
                return o
            out[g.tokens] = o
        return out

    @staticmethod
    def _gather(pages: torch.Tensor, g: AttentionGroup) -> torch.Tensor:
        """The group's keys (or values) ``[kv_heads, n_rows, n_k, hd]`` from the head-major paged layer
        buffer ``[kv_heads, num_pages + 1, page_size, hd]``: a view of one row's consecutive pages, else
        one gather of whole pages, in position order."""
        kv, _, ps, hd = pages.shape
        if g.pages is None:
            return pages[:, g.first_page : g.first_page + g.n_k // ps].view(kv, 1, g.n_k, hd)
        return pages.index_select(1, g.pages).view(kv, g.n_rows, g.n_k, hd)


def _bare(seg: Segment) -> Segment:
    """``seg`` without its pool and ``finish`` (what another rank's forward needs of it: sizes, ids,
    positions, visibility, logit rows, the row's cached length)."""
    st = seg.state
    state = KVState(cache=None, length=st.length, slot=st.slot, capacity=st.capacity)
    return dataclasses.replace(seg, state=state, finish=None, saves=None)
