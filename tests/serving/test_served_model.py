"""The server's type of its model (:class:`s2d2.serving.served_model.ServedModel`): what ``s2d2.load``
returns has every member, with the same call signatures."""

from __future__ import annotations

import inspect

from s2d2.model import S2D2Model
from s2d2.serving.served_model import ServedModel

METHODS = ["make_config", "compile_constraint", "encode", "decode_ids", "score"]


def _members() -> set[str]:
    return {n for n in vars(ServedModel) if not n.startswith("_")}


def test_a_loaded_model_is_a_served_model(random_sdar):
    assert isinstance(random_sdar, ServedModel)
    for name in _members():
        assert hasattr(random_sdar, name), name


def test_the_methods_take_what_the_model_takes():
    assert set(METHODS) <= _members()
    for name in METHODS:
        ours = inspect.signature(getattr(ServedModel, name))
        theirs = inspect.signature(getattr(S2D2Model, name))
        assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == [
            (p.name, p.kind, p.default) for p in theirs.parameters.values()
        ], name
