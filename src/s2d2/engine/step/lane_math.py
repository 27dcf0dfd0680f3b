"""The lanes' device work: every lane row's drafts, or strict checks, in one registration a part.

:class:`GreedyDrafts` registers the greedy token and its probability at every drafting row's candidates
(what :func:`~.draft_math.draft_group` registers for such rows: the same functions on the same values),
:class:`StrictCheck` the AR-mode argmax of every verifying row's span (what
:func:`~.verify_math.verify_strict` registers where no row traces or asks for log-probabilities). Both are
:class:`~.device_math.BatchedCheck`: :func:`~.device_math.run_queries` registers them with the step's
other queries and reads them from its one transfer. Their host results are plain per-row lists, in the
order of the rows given.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...decoding.logits_readers import WHOLE_ROWS, Key, Reader, chunk_rows, storage_rows, tiling, transforms
from ..request import Request
from .device import DeviceOps, Fetch
from .row_queries import rows_at


class GreedyDrafts:
    """The greedy drafts of rows ``(request, logits, zero_rows)`` at each request's candidates (its
    cursor's; candidate slot ``c`` is row ``c - zero_rows`` of ``logits``, the runner's raw rows): per
    sampling transforms and part of rows the float32 math takes at once (:func:`chunk_rows`), one
    registration; the rows are read by ``reader``."""

    def __init__(
        self, dev: DeviceOps, rows: Sequence[tuple[Request, torch.Tensor, int]], reader: Reader = WHOLE_ROWS
    ) -> None:
        self.reader = reader
        self.mask_id = rows[0][0].info.mask_token_id
        limit = chunk_rows(rows[0][1].shape[-1])
        #: per part: its transforms, the indices of its rows, their (logits, candidates), total candidates
        self.parts: list[list] = []
        self.limit = limit
        cfg = rows[0][0].config
        cands = [req.cursor.candidates for req, _, _ in rows]
        sizes = [len(cand) for cand in cands]
        self.sizes = sizes
        if all(req.config is cfg for req, _, _ in rows) and sum(sizes) <= limit:  # the usual: one part
            taken = [(lg, cand, zero) for (_, lg, zero), cand in zip(rows, cands, strict=True)]
            key = transforms(cfg)
            self.parts.append([key, list(range(len(rows))), taken, sum(sizes)])
        else:
            self._split(rows, limit)
        self.keys: list[tuple[int, int]] = []
        #: per part: None (its results are its rows' candidates, in order), else per row the number of
        #: rows computed and its candidates' indices among them (:func:`_candidate_rows`)
        self.picks: list[list[tuple[int, range | list[int]]] | None] = []
        #: each row's drafted tokens and their probabilities (filled by :meth:`read`)
        self.drafts: list[list[int]] = [[] for _ in rows]
        self.conf: list[list[float]] = [[] for _ in rows]

    def _split(self, rows: Sequence[tuple[Request, torch.Tensor, int]], limit: int) -> None:
        """The rows' parts where they are not one: per sampling transforms, at most ``limit`` candidates
        a part (a row's candidates are never split)."""
        open_: dict[Key, list] = {}
        sizes = self.sizes
        last_cfg, key = None, None
        for i, (req, logits, zero) in enumerate(rows):
            c, cand = req.config, req.cursor.candidates
            if c is not last_cfg:  # rows of one request config make its key once
                last_cfg, key = c, transforms(c)
            n = sizes[i]
            part = open_.get(key)
            if part is None or part[3] + n > limit:
                part = open_[key] = [key, [], [], 0]
                self.parts.append(part)
            part[1].append(i)
            part[2].append((logits, cand, zero))
            part[3] += n

    def register(self, dev: DeviceOps, fetch: Fetch, in_place: bool) -> None:
        self.keys, self.picks = [], []
        for key, _, rows, _ in self.parts:
            tensors, picks = _candidate_rows(dev, rows, self.limit)
            self.picks.append(picks)
            masked = self.reader.prepare(tensors, self.mask_id, False, in_place)[1]
            drafts, conf = self.reader.read(masked, key).greedy()
            self.keys.append((fetch.add(drafts), fetch.add(conf)))

    def read(self, fetch: Fetch) -> None:
        sizes, out_d, out_c = self.sizes, self.drafts, self.conf
        for (_, members, _, _), (kd, kc), picks in zip(self.parts, self.keys, self.picks, strict=True):
            drafts, at = fetch.ints(kd), 0  # the part's tokens as ints at once, then each row's slice
            conf = fetch.get(kc)
            if picks is not None:  # every row's rows were computed: its candidates' among them
                for i, (n, idx) in zip(members, picks, strict=True):
                    if type(idx) is range:  # consecutive rows (the usual): one slice each
                        out_d[i] = drafts[at + idx.start : at + idx.stop]
                        out_c[i] = conf[at + idx.start : at + idx.stop]
                    else:
                        out_d[i] = [drafts[at + j] for j in idx]
                        out_c[i] = [conf[at + j] for j in idx]
                    at += n
                continue
            for i in members:
                n = sizes[i]
                out_d[i] = drafts[at : at + n]
                out_c[i] = conf[at : at + n]
                at += n


class GreedyTokens:
    """The AR lane's greedy tokens: rows ``logits`` (``[1, vocab]`` each, the runner's raw rows) of
    requests ``reqs`` (greedy, block size 1), one token a row: for each request config's sampling
    transforms, one registration, the same functions on the same values as :class:`GreedyDrafts` (the
    distribution's argmax, so ties fall alike), read by ``reader``. :attr:`tokens` (a list of ints, in
    row order) is filled by :meth:`read`."""

    def __init__(
        self, reqs: Sequence[Request], logits: list[torch.Tensor], reader: Reader = WHOLE_ROWS
    ) -> None:
        self.reader = reader
        self.mask_id = reqs[0].info.mask_token_id
        self.logits = logits
        #: per part of rows with one key: (key, row indices or None for every row); one config: one part
        self.parts: list[tuple[Key, list[int] | None]] = []
        first = reqs[0].config
        if all(r.config is first for r in reqs):
            self.parts.append((transforms(first), None))
        else:
            by_key: dict[Key, list[int]] = {}
            for i, r in enumerate(reqs):
                by_key.setdefault(transforms(r.config), []).append(i)
            self.parts = list(by_key.items()) if len(by_key) > 1 else [(next(iter(by_key)), None)]
        self.keys: list[int] = []
        self.tokens: list[int] = []

    def register(self, dev: DeviceOps, fetch: Fetch, in_place: bool) -> None:
        reader = self.reader
        whole = reader.prepare(self.logits, self.mask_id, False, in_place)[1]
        self.keys = []
        for key, members in self.parts:
            part = whole if members is None else whole.index_select(0, dev.tensor(members))
            self.keys.append(fetch.add(reader.tokens(part, key)))

    def read(self, fetch: Fetch) -> None:
        if len(self.parts) == 1:
            self.tokens = fetch.ints(self.keys[0])
            return
        tokens = [0] * len(self.logits)
        for (_, members), k in zip(self.parts, self.keys, strict=True):
            for i, t in zip(members, fetch.ints(k), strict=True):
                tokens[i] = t
        self.tokens = tokens


class StrictCheck:
    """The strict rule for verifying rows at once: ``argmax q`` of every span position (``logits``, a
    tensor per row, ``sizes[i]`` positions each) in one registration; each row's accepted length (the
    drafts that equal it, from the first) and correction (``argmax q`` at the first that does not, -1
    where every draft was accepted) are read off it on the host."""

    def __init__(
        self,
        mask_id: int,
        logits: list[torch.Tensor],
        drafts: list[int],
        sizes: list[int],
        reader: Reader = WHOLE_ROWS,
    ):
        self.mask_id, self.logits, self.drafts, self.sizes = mask_id, logits, drafts, sizes
        self.reader = reader
        self.key = -1
        self.n_accepted: list[int] = []
        self.corrections: list[int] = []

    def register(self, dev: DeviceOps, fetch: Fetch, in_place: bool) -> None:
        reader = self.reader
        self.key = fetch.add(reader.tokens(reader.prepare(self.logits, self.mask_id, False, in_place)[1]))

    def read(self, fetch: Fetch) -> None:
        # a plain loop: on the CPU after a forward, numpy's calls on a few hundred values cost several
        # times more (measured: about 110 us against 8 at 14 rows of 8 positions)
        q_arg, drafts = fetch.get(self.key), self.drafts
        acc, corr, p = [], [], 0
        for n in self.sizes:
            k = 0
            while k < n and drafts[p + k] == q_arg[p + k]:
                k += 1
            acc.append(k)
            corr.append(int(q_arg[p + k]) if k < n else -1)
            p += n
        self.n_accepted, self.corrections = acc, corr


def _candidate_rows(
    dev: DeviceOps, rows: list[tuple[torch.Tensor, list[int], int]], limit: int
) -> tuple[list[torch.Tensor], list[tuple[int, range | list[int]]] | None]:
    """The logits the drafts of rows ``(logits, candidates, zero_rows)`` are computed on (slot ``c`` at
    row ``c - zero_rows``), as tensors to stack (the one tensor the rows tile, where they do:
    :func:`tiling`), and the picks (None: the computed rows are the candidates, in order; else per row
    its computed rows and its candidates' indices among them, a range where they are consecutive):

    - the rows' own logits where every row's candidates are all of its rows (a row's candidates are
      masked slots of its fed part, so as many of them as rows are all of them);
    - the rows whole where they tile the forward's output and fit the float32 math (``limit`` rows):
      a row's few committed rows besides its candidates cost less than gathering (each row's values
      depend on that row alone, so the candidates' are the same);
    - else ONE gather where the rows lie in one storage (the forward's output), else a view or gather
      a row."""
    logits = [lg for lg, _, _ in rows]
    tiles = tiling(logits) if len(logits) > 1 else None
    if tiles is None:
        if all(len(cand) == lg.shape[0] for lg, cand, _ in rows):
            return logits, None
    else:
        whole, counts = tiles
        counted = list(zip(rows, counts, strict=True))
        if all(len(cand) == n for (_, cand, _), n in counted):
            return [whole], None
        if whole.shape[0] <= limit:
            return [whole], [(n, _indices(cand, z)) for (_, cand, z), n in counted]
    base = storage_rows(logits)
    if base is None:
        return [rows_at(dev, lg, [c - z for c in cand] if z else cand) for lg, cand, z in rows], None
    vocab, index = base.shape[-1], []
    for lg, cand, z in rows:
        at = lg.storage_offset() // vocab - z
        index += [at + c for c in cand]
    return [base.index_select(0, dev.tensor(index))], None


def _indices(cand: list[int], zero: int) -> range | list[int]:
    """The rows of candidates ``cand`` among their row's raw rows (``zero`` rows not returned before
    them): a range where they are consecutive."""
    first, n = cand[0], len(cand)
    if cand[-1] - first == n - 1:
        return range(first - zero, first - zero + n)
    return [c - zero for c in cand]
