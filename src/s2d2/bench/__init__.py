"""Accuracy and speed of many decoding configurations on the same problems (behind ``s2d2 bench``).

Pure-Python API (the ``s2d2 bench`` command of the command-line package is a thin layer over it), one
concept per module:

- :mod:`.grids`: :class:`~.grids.BenchConfig` and the named lists of them, :data:`~.grids.GRIDS`
  (``default``, ``headline``, ``paper``, ``quick``, ``ucb``).
- :mod:`.suites`: the benchmark suites, their problems and how an answer is scored.
- :mod:`.runner`: :func:`~.runner.run_bench`, which runs configurations over problems in one process and
  returns the results dict (the schema of ``results.json``); with ``out_dir`` it also writes every
  output file. Its module docstring says how runs are interleaved and batched.
- :mod:`.summary`: the totals of a run and the per-run figures computed from them (their definitions).
- :mod:`.report`: the table, the plots and :func:`~.report.write_results`; the Pareto frontier.
- :mod:`.outdir`: the files of an output directory and the checks before writing there.

The Wilson interval behind the accuracy column is :func:`s2d2.intervals.wilson_interval`.
"""
