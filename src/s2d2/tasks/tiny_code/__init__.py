"""``tiny-code``: small Python functions for the built-in code model, judged by executed asserts.

Every problem is a function header with a docstring stating the task (the prompt) and its body (the
answer): arithmetic, conditionals, ``for``/``while`` loops, list and string transforms, with 2-4 asserts.

- :mod:`.kinds`: the task kinds (docstring and canonical body from a random generator).
- :mod:`.problems`: :func:`~.problems.generate_problem` and :func:`~.problems.program_text`.
- :mod:`.splits`: the committed ``test`` and ``dev`` splits and the training stream.
- :mod:`.tokenizer`: the layout-aware word-level tokenizer (decoded text is the exact Python).
- :mod:`.scoring`: exact match against the canonical body (dev selection during training).
"""
