"""A batch description's page tables and write slots, read off a hand-made batch: each row's table cut or
padded to the batch's width, the storage offset added to held pages only (padding stays the zero page),
padding rows all zero, and each new token's key written to its own page's slot."""

from __future__ import annotations

import numpy as np
import torch

from s2d2.forward.forward_batch import BatchShape, build_batch
from s2d2.layouts.mask_spec import spec_of


def test_page_tables_are_cut_padded_and_offset_as_held():
    ps, offset = 4, 3
    lengths = [2, 0, 5]  # cached keys a row
    sizes = [3, 1, 2]  # new tokens a row: the rows need 2, 1 and 2 pages
    tables = [[7, 9, 11], [4], [1, 2]]  # row 0 holds a page more than it needs
    ids = [list(range(10, 10 + n)) for n in sizes]
    pos = [list(range(length, length + n)) for length, n in zip(lengths, sizes, strict=True)]
    specs = [spec_of(torch.ones(n, n, dtype=torch.bool).tril()) for n in sizes]
    rows = [torch.arange(n) for n in sizes]
    own = build_batch(lengths, ids, pos, specs, tables, rows, ps, page_offset=offset)
    assert own.width == 2
    want = [[7 + offset, 9 + offset], [4 + offset, 0], [1 + offset, 2 + offset]]
    assert np.asarray(own.pages).reshape(3, 2).tolist() == want
    # a token at key k of a row writes to slot table[k // ps] * ps + k % ps (the offset table's)
    keys = [length + j for length, n in zip(lengths, sizes, strict=True) for j in range(n)]
    owner = [r for r, n in enumerate(sizes) for _ in range(n)]
    slots = [want[r][k // ps] * ps + k % ps for r, k in zip(owner, keys, strict=True)]
    assert np.asarray(own.slot).tolist() == slots

    pad = BatchShape(tokens=8, rows=5, n_q=4, width=4, logits=8)
    padded = build_batch(lengths, ids, pos, specs, tables, rows, ps, pad=pad, page_offset=offset)
    pages = np.asarray(padded.pages).reshape(5, 4).tolist()
    assert pages[:3] == [[7 + offset, 9 + offset, 11 + offset, 0], [4 + offset, 0, 0, 0],
                         [1 + offset, 2 + offset, 0, 0]]  # fmt: skip
    assert pages[3:] == [[0] * 4, [0] * 4]  # padding rows see the zero page
    assert np.asarray(padded.slot).tolist() == slots + [0, 0]  # padding tokens write to slot 0
