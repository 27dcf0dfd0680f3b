"""The forward's machinery, shared by every model family: the batch description (``ForwardBatch``,
``describe``), paged KV (``kv_pages``, ``kv_pool``), attention (``span_attention`` and its Triton kernel,
``attention_groups``, ``masks``), the segments a row feeds a forward (``segment``), the fast batched decoder
(``fastpath``, ``paged_forward``, ``small_ops``) and CUDA-graph capture (``graph_runner``).

Nothing here knows a family; the families (:mod:`s2d2.families`) build on it.
"""
