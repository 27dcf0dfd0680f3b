"""The server's type of its model (:class:`s2d2.serving.served_model.ServedModel`): what ``s2d2.load``
returns has every member, with the same call signatures, and no serving function takes its model as
``Any``."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import s2d2
from s2d2.model import S2D2Model
from s2d2.serving import ServedModel

SERVING = Path(s2d2.__file__).resolve().parent / "serving"
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


def test_no_serving_function_takes_its_model_as_any():
    loose = []
    for path in SERVING.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            typed = isinstance(node, ast.arg) and node.annotation is not None
            if typed and node.arg == "model" and ast.unparse(node.annotation) == "Any":
                loose.append(f"{path.relative_to(SERVING)}:{node.lineno}")
    assert not loose
