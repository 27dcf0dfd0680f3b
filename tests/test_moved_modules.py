"""Module paths moved by the package reorganisation still import, as the module at its new place."""

from __future__ import annotations

import importlib
import sys

import pytest

import s2d2  # noqa: F401 - installs the aliases
from s2d2.moved_modules import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_with_a_deprecation_warning(old):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=MOVED[old].replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])


def test_from_import_of_a_moved_module_and_its_names():
    sys.modules.pop("s2d2.cost_profile", None)
    with pytest.warns(DeprecationWarning):
        from s2d2.cost_profile import resolve_cost_profile
    from s2d2.cost.profile import resolve_cost_profile as new

    assert resolve_cost_profile is new


def test_no_module_of_s2d2_imports_an_old_path():
    from test_architecture import GRAPH

    assert not {m for targets in GRAPH.values() for m in targets} & set(MOVED)
