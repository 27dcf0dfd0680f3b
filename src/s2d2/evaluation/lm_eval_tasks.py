"""lm-eval tasks over the built-in tiny-gsm problems, from local files (no hub): one of each output type.

:func:`write_tiny_gsm_tasks` writes, into one directory, the data file and three task YAMLs that
``s2d2 lm-eval --include_path DIR`` (or lm-eval's ``TaskManager(include_path=DIR)``) runs:

* ``tiny_gsm_mc`` (``multiple_choice``, metric ``acc``): the question, then its worked answer ending in
  the right final number or in one of three wrong ones (drawn near it, per problem from a fixed seed);
* ``tiny_gsm_gen`` (``generate_until``, metric ``exact_match``): the question; the number after ``####``
  in the generated answer against the right one;
* ``tiny_gsm_ppl`` (``loglikelihood_rolling``, perplexities): the question and its worked answer.

From the command line: ``python -m s2d2.evaluation.lm_eval_tasks DIR [N]`` (N: the test split's first N
problems; default all 500).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from ..errors import S2D2Error

TASKS = ("tiny_gsm_mc", "tiny_gsm_gen", "tiny_gsm_ppl")
N_CHOICES = 4

_COMMON = """dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
"""
_YAML = {
    "tiny_gsm_mc": """output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
""",
    "tiny_gsm_gen": """output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{final}}}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: {max_gen_toks}
  do_sample: false
filter_list:
  - name: final
    filter:
      - function: regex
        regex_pattern: "#### (\\\\-?[0-9]+)"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
""",
    "tiny_gsm_ppl": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{question}}}} {{{{answer}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
""",
}


def wrong_numbers(final: int, rng: random.Random, k: int = N_CHOICES - 1) -> list[int]:
    """``k`` distinct non-negative numbers near ``final`` (within 20), none equal to it."""
    near = [final + d for d in range(-20, 21) if d and final + d >= 0]
    return rng.sample(near, k)


def with_final(answer: str, number: int) -> str:
    """``answer`` (a worked answer ending in ``#### N``) ending in ``number`` instead."""
    head, sep, _ = answer.rpartition("#### ")
    if not sep:
        raise S2D2Error(f"not a tiny-gsm answer (no '#### '): {answer[:60]!r}")
    return f"{head}#### {number}"


def mc_record(problem: dict, index: int, seed: int = 0) -> dict:
    """``problem`` with ``choices`` (its answer with the right and three wrong final numbers) and the
    right one's index ``label``."""
    rng = random.Random(seed * 1_000_003 + index)
    final = int(problem["final"])
    numbers = wrong_numbers(final, rng)
    label = rng.randrange(N_CHOICES)
    numbers.insert(label, final)
    return {**problem, "choices": [with_final(problem["answer"], n) for n in numbers], "label": label}


def write_tiny_gsm_tasks(
    directory: Path, n: int | None = None, *, seed: int = 0, max_gen_toks: int = 64
) -> dict[str, Path]:
    """Write ``tiny_gsm.jsonl`` (the test split's first ``n`` problems, with choices) and the three task
    YAMLs into ``directory``; return each task's YAML path by name."""
    from ..tasks.tiny_gsm.splits import load_split

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    problems = load_split("test", n)
    data = directory / "tiny_gsm.jsonl"
    lines = [json.dumps(mc_record(p, i, seed)) for i, p in enumerate(problems)]
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    paths = {}
    for name in TASKS:
        text = f"task: {name}\n" + _COMMON.format(data=data) + _YAML[name].format(max_gen_toks=max_gen_toks)
        paths[name] = directory / f"{name}.yaml"
        paths[name].write_text(text, encoding="utf-8")
    return paths


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m s2d2.evaluation.lm_eval_tasks DIR [N]")
    written = write_tiny_gsm_tasks(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) == 3 else None)
    print("\n".join(str(p) for p in written.values()))
