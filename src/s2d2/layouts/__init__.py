"""What each row feeds a forward, as integers: token ids, positions, kept keys, logit rows and visibility.

Family-independent: :mod:`.family` lays out each kind of segment from a family's traits (the one place
that reads them), :mod:`.layout` the same-position kinds (prefill, commit, draft, AR lead, 2L and fused
verification, scoring), :mod:`.shifted` a shifted family's (re-aligned by a logit-row index map),
:mod:`.specs` gives each kind's visibility as a :class:`~.mask_spec.MaskSpec` (a prefix, one window and
the query itself, per query: no ``n x n`` mask), :mod:`.mask_spec` holds that form and its conversions.
Nothing here imports the adapters: they wrap layouts into segments with a row's cache state.
"""

from .layout import Layout, last_rows
from .mask_spec import MaskDoesNotFit, MaskSpec

__all__ = ["Layout", "MaskDoesNotFit", "MaskSpec", "last_rows"]
