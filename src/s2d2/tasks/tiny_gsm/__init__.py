"""``tiny-gsm``: deterministic GSM8K-style arithmetic word problems for the built-in tiny model.

Every problem is a short story about one person and one kind of object, with 2-4 arithmetic steps
(``+ - * /``) on numbers in ``[0, 999]``; its answer is one equation per step, then the final answer::

    3 * 8 = 24. 47 - 24 = 23. #### 23

One concept per module (import each name from the module that defines it):

- :mod:`.templates`: the stories' vocabulary and sentence templates.
- :mod:`.problems`: :func:`~.problems.generate_problem`, one problem from a :class:`random.Random`
  (the problem and answer format are described there).
- :mod:`.splits`: the ``test``, ``dev`` and ``train`` splits: seeds, sizes, held-out questions and
  question hashes, :func:`~.splits.make_split`, :func:`~.splits.load_split` and the committed JSONL
  files (``s2d2/data/tiny_gsm/{test,dev}.jsonl``, :func:`~.splits.data_dir`,
  :func:`~.splits.write_split_files`).
- :mod:`.curriculum`: the endless training stream :func:`~.curriculum.iter_train_problems` and its
  ``hard_focus`` thinning (carrying and borrowing columns, :func:`~.curriculum.keep_probability`).
- :mod:`.scoring`: :func:`~.scoring.extract_answer` and :func:`~.scoring.is_correct`.
- :mod:`.tokenizer`: :func:`~.tokenizer.build_tokenizer` (whole words + single digits) and the
  committed tokenizer, :func:`~.tokenizer.tokenizer_dir` (the built-in model's directory).
"""
