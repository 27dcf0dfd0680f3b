"""``tiny-gsm``: deterministic GSM8K-style arithmetic word problems for the built-in tiny model.

Every problem is a short story about one person and one kind of object, with 2-4 arithmetic steps
(``+ - * /``). All numbers (operands, intermediate results and the answer) lie in ``[0, 999]`` and a
division is only used when it divides exactly. For ``+`` and ``*`` the operand order is random, so one
question has several valid answer texts (the answers are multimodal on purpose).

The answer text has one equation per step, then the final answer::

    3 * 8 = 24. 47 - 24 = 23. #### 23

(written with normal spacing, so that the tiny-gsm tokenizer's ``decode(encode(answer)) == answer``;
token-wise this is ``3 * 8 = 2 @@4 . 4 @@7 - 2 @@4 = 2 @@3 . #### 2 @@3``).

Splits: ``test`` and ``dev`` (1000 problems each) are committed as JSONL files next to this package
(``s2d2/data/tiny_gsm/{test,dev}.jsonl``, found next to this package, see :func:`data_dir`); ``train`` is
generated on the fly. The dev split excludes test questions and the train split excludes both.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

__all__ = [
    "SPLIT_SEEDS",
    "SPLIT_SIZES",
    "TOKENIZER_FILES",
    "borrows",
    "build_tokenizer",
    "carries",
    "check_hard_focus",
    "data_dir",
    "extract_answer",
    "generate_problem",
    "hard_columns",
    "heldout_questions",
    "is_correct",
    "iter_train_problems",
    "keep_probability",
    "load_split",
    "make_split",
    "question_hash",
    "tokenizer_dir",
    "write_split_files",
]

SPLIT_SEEDS = {"test": 20260001, "dev": 20260002, "train": 20260003}
SPLIT_SIZES = {"test": 500, "dev": 1000}
#: Questions reserved for testing: the first RESERVED_TEST problems of the test seed. The committed test
#: split is their first SPLIT_SIZES["test"]; dev and train exclude all of them, so the test split can grow
#: up to this size without touching dev or train.
RESERVED_TEST = 1000
MAX_VALUE = 999
MAX_QUESTION_TOKENS = 56
#: The tiny-gsm tokenizer's files in :func:`tokenizer_dir` (what ``build_tokenizer(directory)`` writes).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# --------------------------------------------------------------------------------------------------
# Vocabulary of the stories
# --------------------------------------------------------------------------------------------------

NAMES_F = [
    "Ava",
    "Mia",
    "Emma",
    "Zoe",
    "Lily",
    "Sara",
    "Nina",
    "Maya",
    "Ruby",
    "Anna",
    "Priya",
    "Hana",
    "Yuki",
    "Elena",
    "Grace",
    "Chloe",
    "Olivia",
    "Amara",
]
NAMES_M = [
    "Liam",
    "Noah",
    "Ethan",
    "Lucas",
    "Omar",
    "Ben",
    "Leo",
    "Jack",
    "Tom",
    "Ivan",
    "Carlos",
    "Mateo",
    "Felix",
    "Ravi",
    "Kenji",
    "Samuel",
    "Hugo",
    "David",
]
OBJECTS = [
    "apples",
    "pencils",
    "marbles",
    "stickers",
    "cookies",
    "books",
    "coins",
    "stamps",
    "shells",
    "cards",
    "toys",
    "flowers",
    "candies",
    "balloons",
    "crayons",
    "beads",
    "eggs",
    "oranges",
    "cupcakes",
    "rocks",
]
CONTAINERS = ["boxes", "bags", "packs", "jars", "baskets", "crates"]
GROUPS = ["piles", "groups", "parts", "stacks"]
PEOPLE = ["friends", "classmates", "neighbors", "cousins", "kids"]
CONNECTORS = ["", "Then", "Next,", "After that,", "Later,"]

START_TEMPLATES = [
    "{name} has {n} {obj}.",
    "{name} starts with {n} {obj}.",
    "{name} collected {n} {obj}.",
    "{name} had {n} {obj} in a box.",
    "There are {n} {obj} on the table of {name}.",
]
ADD_TEMPLATES = [
    "{p} buys {x} more {obj}.",
    "{p} finds {x} more {obj}.",
    "{p} gets {x} more {obj} from a friend.",
    "{p} wins {x} {obj} at a fair.",
    "a friend gives {po} {x} more {obj}.",
]
SUB_TEMPLATES = [
    "{p} gives away {x} {obj}.",
    "{p} loses {x} {obj}.",
    "{p} sells {x} {obj}.",
    "{p} uses {x} of the {obj}.",
    "{p} gives {x} {obj} to {name2}.",
]
MUL_TEMPLATES = [
    "{p} ends up with {k} times as many {obj}.",
    "the number of {obj} becomes {k} times as large.",
    "{p} multiplies the {obj} by {k}.",
]
MUL_WORDS = {2: "{p} doubles the number of {obj}.", 3: "{p} triples the number of {obj}."}
DIV_TEMPLATES = [
    "{p} splits the {obj} exactly into {k} equal {group} and keeps one of them.",
    "{p} divides the {obj} into {k} equal {group} and keeps one.",
    "{p} shares the {obj} equally with {km1} {people} and keeps one share.",
]
BOX_TEMPLATES = [
    "{p} buys {k} {cont} with {m} {obj} each.",
    "{p} gets {k} {cont} of {m} {obj}.",
]
GIVE_EACH_TEMPLATES = [
    "{p} gives {k} {people} {m} {obj} each.",
    "{p} sells {k} {cont} of {m} {obj}.",
]
QUESTION_TEMPLATES = [
    "How many {obj} does {name} have now?",
    "How many {obj} does {name} have in the end?",
    "How many {obj} does {pl} have at the end?",
]

_TEMPLATE_GROUPS = [
    START_TEMPLATES,
    ADD_TEMPLATES,
    SUB_TEMPLATES,
    MUL_TEMPLATES,
    list(MUL_WORDS.values()),
    DIV_TEMPLATES,
    BOX_TEMPLATES,
    GIVE_EACH_TEMPLATES,
    QUESTION_TEMPLATES,
    CONNECTORS,
]


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _eq(a: int, op: str, b: int, c: int) -> str:
    return f"{a} {op} {b} = {c}."


def _commutative(rng: random.Random, a: int, op: str, b: int, c: int) -> str:
    if rng.random() < 0.5:
        a, b = b, a
    return _eq(a, op, b, c)


def _try_problem(rng: random.Random) -> dict | None:
    female = rng.random() < 0.5
    name = rng.choice(NAMES_F if female else NAMES_M)
    others = [n for n in NAMES_F + NAMES_M if n != name]
    p, po = ("she", "her") if female else ("he", "him")
    obj = rng.choice(OBJECTS)
    n_eq = rng.choice([2, 3, 4])

    start = rng.randint(2, 120) if rng.random() < 0.8 else rng.randint(2, 400)
    cur = start
    sentences = [rng.choice(START_TEMPLATES).format(name=name, n=start, obj=obj)]
    eqs: list[str] = []
    while len(eqs) < n_eq:
        left = n_eq - len(eqs)
        kinds = ["add", "sub", "mul", "div"] + (["box", "give_each"] if left >= 2 else [])
        kind = rng.choice(kinds)
        fmt = {"p": p, "po": po, "obj": obj}
        if kind == "add":
            hi = min(99 if rng.random() < 0.8 else 300, MAX_VALUE - cur)
            if hi < 2:
                continue
            x = rng.randint(2, hi)
            text = rng.choice(ADD_TEMPLATES).format(x=x, **fmt)
            eqs.append(_commutative(rng, cur, "+", x, cur + x))
            cur += x
        elif kind == "sub":
            if cur < 3:
                continue
            x = rng.randint(2, cur - 1)
            text = rng.choice(SUB_TEMPLATES).format(x=x, name2=rng.choice(others), **fmt)
            eqs.append(_eq(cur, "-", x, cur - x))
            cur -= x
        elif kind == "mul":
            ks = [k for k in range(2, 6) if cur * k <= MAX_VALUE]
            if not ks or cur < 2:
                continue
            k = rng.choice(ks)
            if k in MUL_WORDS and rng.random() < 0.4:
                text = MUL_WORDS[k].format(**fmt)
            else:
                text = rng.choice(MUL_TEMPLATES).format(k=k, **fmt)
            eqs.append(_commutative(rng, cur, "*", k, cur * k))
            cur *= k
        elif kind == "div":
            ks = [k for k in range(2, 10) if cur % k == 0 and cur // k >= 1]
            if not ks:
                continue
            k = rng.choice(ks)
            templates = DIV_TEMPLATES if k >= 3 else DIV_TEMPLATES[:2]  # no "with 1 friends"
            text = rng.choice(templates).format(
                k=k, km1=k - 1, group=rng.choice(GROUPS), people=rng.choice(PEOPLE), **fmt
            )
            eqs.append(_eq(cur, "/", k, cur // k))
            cur //= k
        elif kind == "box":
            k, m = rng.randint(2, 9), rng.randint(2, 25)
            total = k * m
            if cur + total > MAX_VALUE:
                continue
            text = rng.choice(BOX_TEMPLATES).format(k=k, m=m, cont=rng.choice(CONTAINERS), **fmt)
            eqs.append(_commutative(rng, k, "*", m, total))
            eqs.append(_commutative(rng, cur, "+", total, cur + total))
            cur += total
        else:  # give_each
            pairs = [(k, m) for k in range(2, 10) for m in range(2, 26) if k * m < cur]
            if not pairs:
                continue
            k, m = rng.choice(pairs)
            total = k * m
            text = rng.choice(GIVE_EACH_TEMPLATES).format(
                k=k, m=m, cont=rng.choice(CONTAINERS), people=rng.choice(PEOPLE), **fmt
            )
            eqs.append(_commutative(rng, k, "*", m, total))
            eqs.append(_eq(cur, "-", total, cur - total))
            cur -= total
        conn = rng.choice(CONNECTORS) if len(sentences) > 1 else rng.choice(["", "", "Then"])
        sentences.append(_cap(f"{conn} {text}".strip()) if conn else _cap(text))
    if not 0 <= cur <= MAX_VALUE:
        return None
    sentences.append(rng.choice(QUESTION_TEMPLATES).format(obj=obj, name=name, pl=p))
    question = " ".join(sentences)
    if _approx_tokens(question) > MAX_QUESTION_TOKENS:
        return None
    answer = " ".join(eqs) + f" #### {cur}"
    return {"question": question, "answer": answer, "final": str(cur)}


def _approx_tokens(text: str) -> int:
    """Token count under the tiny-gsm tokenizer (one token per word, digit and punctuation mark)."""
    return len(re.findall(r"[A-Za-z]+|\d|[^\w\s]+", text))


def generate_problem(rng: random.Random) -> dict:
    """Draw one problem from ``rng`` (a :class:`random.Random`): ``dict(question, answer, final)``."""
    while True:
        prob = _try_problem(rng)
        if prob is not None:
            return prob


def question_hash(question: str) -> str:
    return hashlib.sha1(question.encode("utf-8")).hexdigest()[:16]


def _generate_unique(n: int, seed: int, exclude: set[str], prefix: str) -> list[dict]:
    rng = random.Random(seed)
    seen = set(exclude)
    out: list[dict] = []
    while len(out) < n:
        prob = generate_problem(rng)
        h = question_hash(prob["question"])
        if h in seen:
            continue
        seen.add(h)
        out.append({"id": f"{prefix}-{len(out):05d}", **prob})
    return out


def make_split(name: str, n: int, seed: int | None = None) -> list[dict]:
    """Generate split ``name`` ("train" | "dev" | "test") with ``n`` unique problems from ``seed``.

    The default seeds (:data:`SPLIT_SEEDS`) reproduce the committed files. Dev excludes the (generated)
    1000 test questions; train excludes the test and dev questions.
    """
    if name not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {name!r}; expected train, dev or test")
    seed = SPLIT_SEEDS[name] if seed is None else seed
    exclude: set[str] = set()
    if name in ("dev", "train"):
        exclude |= _reserved_test_hashes()
    if name == "train":
        exclude |= {question_hash(p["question"]) for p in _default_split("dev")}
    return _generate_unique(n, seed, exclude, name)


_CACHE: dict[str, list[dict]] = {}


def _default_split(name: str) -> list[dict]:
    """The committed split (from its file if present, else regenerated identically)."""
    if name not in _CACHE:
        path = data_dir() / f"{name}.jsonl"
        if path.is_file():
            _CACHE[name] = _read_jsonl(path)
        else:
            exclude: set[str] = set()
            if name == "dev":
                exclude = _reserved_test_hashes()
            _CACHE[name] = _generate_unique(SPLIT_SIZES[name], SPLIT_SEEDS[name], exclude, name)
    return _CACHE[name]


def heldout_questions() -> set[str]:
    """Hashes of every test and dev question (the train stream never yields these)."""
    return _reserved_test_hashes() | {question_hash(p["question"]) for p in _default_split("dev")}


_RESERVED: set[str] = set()


def _reserved_test_hashes() -> set[str]:
    """Hashes of the reserved test questions (a superset of the committed test split)."""
    if not _RESERVED:
        pool = _generate_unique(RESERVED_TEST, SPLIT_SEEDS["test"], set(), "test")
        _RESERVED.update(question_hash(p["question"]) for p in pool)
    return _RESERVED


_EQUATION = re.compile(r"(\d+) ([-+]) (\d+) = \d+")


def carries(a: int, b: int) -> int:
    """How many digit columns of ``a + b`` carry into the next one."""
    n = carry = 0
    while a or b:
        carry = int(a % 10 + b % 10 + carry >= 10)
        n += carry
        a, b = a // 10, b // 10
    return n


def borrows(a: int, b: int) -> int:
    """How many digit columns of ``a - b`` (``a >= b >= 0``) borrow from the next one."""
    if b > a or b < 0:
        raise ValueError(f"borrows needs a >= b >= 0, got {a} - {b}")
    n = borrow = 0
    while a:
        borrow = int(a % 10 - b % 10 - borrow < 0)
        n += borrow
        a, b = a // 10, b // 10
    return n


def hard_columns(answer: str) -> int:
    """Carrying and borrowing digit columns over the additions and subtractions of a worked answer.

    The tiny model's AR errors concentrate on these steps (27 of 33 test errors before --hard-focus).
    """
    n = 0
    for a, op, b in _EQUATION.findall(answer):
        n += carries(int(a), int(b)) if op == "+" else borrows(int(a), int(b))
    return n


def check_hard_focus(focus: float) -> float:
    if not 0.0 <= focus < 1.0:
        raise ValueError(f"hard focus must be in [0, 1), got {focus}")
    return float(focus)


def keep_probability(hard: int, focus: float) -> float:
    """Probability that the training stream keeps a problem with ``hard`` carrying/borrowing columns.

    ``focus`` 0 keeps every problem (the natural distribution); otherwise problems with no such column
    are kept with probability ``1 - focus``, with one ``1 - focus / 2``, and with two or more always.
    """
    return 1.0 - check_hard_focus(focus) * max(0.0, 1.0 - hard / 2)


def iter_train_problems(seed: int, start: int = 0, hard_focus: float = 0.0) -> Iterator[dict]:
    """An endless stream of training problems for ``seed``, skipping held-out questions.

    Problem ``i`` of the stream depends only on ``(seed, hard_focus, i // 4096)`` so a resumed run can
    restart at ``start`` cheaply. ``hard_focus`` > 0 thins out problems with few carrying or borrowing
    columns (:func:`keep_probability`); 0 gives the natural distribution, as the test split has it.
    """
    check_hard_focus(hard_focus)
    held = heldout_questions()
    chunk = start // 4096
    skip = start % 4096
    while True:
        rng = random.Random(f"tiny-gsm-train-{seed}-{chunk}")
        thin = random.Random(f"tiny-gsm-thin-{seed}-{chunk}")
        i = -1
        while i < 4095:
            prob = generate_problem(rng)
            if hard_focus > 0 and thin.random() >= keep_probability(hard_columns(prob["answer"]), hard_focus):
                continue
            i += 1
            if i < skip:
                continue
            if question_hash(prob["question"]) in held:
                continue
            yield prob
        skip = 0
        chunk += 1


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def data_dir() -> Path:
    """Directory of the committed tiny-gsm files: ``s2d2/data/tiny_gsm``, found relative to this package
    (``importlib.resources`` on the regular package ``s2d2.tasks``, then its parent directory)."""
    return Path(str(resources.files("s2d2.tasks"))).parent / "data" / "tiny_gsm"


def tokenizer_dir() -> Path:
    """Directory of the committed tiny-gsm tokenizer: the built-in model's own, ``s2d2/models/tiny-gsm``
    (its files: :data:`TOKENIZER_FILES`; the directory also holds the model's weights and config)."""
    return Path(str(resources.files("s2d2.tasks"))).parent / "models" / "tiny-gsm"


def load_split(name: str, n: int | None = None) -> list[dict]:
    """Load split ``name``: test/dev from the committed JSONL files, train generated on the fly.

    ``n`` limits the number of problems (the first ``n``); for train it is required.
    """
    if name in ("test", "dev"):
        path = data_dir() / f"{name}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"tiny-gsm {name} split not found at {path}")
        probs = _read_jsonl(path)
        return probs if n is None else probs[:n]
    if name == "train":
        if n is None:
            raise ValueError("load_split('train') needs n (the train split is generated on the fly)")
        return make_split("train", n)
    raise ValueError(f"unknown split {name!r}; expected train, dev or test")


def write_split_files(directory: Path | None = None) -> None:
    """(Re)write ``test.jsonl`` and ``dev.jsonl`` from the default seeds."""
    directory = data_dir() if directory is None else Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _CACHE.clear()
    test = _generate_unique(SPLIT_SIZES["test"], SPLIT_SEEDS["test"], set(), "test")
    dev = _generate_unique(SPLIT_SIZES["dev"], SPLIT_SEEDS["dev"], _reserved_test_hashes(), "dev")
    for name, probs in (("test", test), ("dev", dev)):
        with open(directory / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for p in probs:
                f.write(json.dumps({k: p[k] for k in ("id", "question", "answer", "final")}) + "\n")
    _CACHE.clear()


# --------------------------------------------------------------------------------------------------
# Answers
# --------------------------------------------------------------------------------------------------

_NUM = re.compile(r"-?\d+")


def extract_answer(text: str) -> str | None:
    """The final answer in ``text``: the first number after ``####``, else the last number, else None."""
    if text is None:
        return None
    if "####" in text:
        tail = text.split("####", 1)[1]
        m = _NUM.search(tail.replace(",", ""))
        if m:
            return str(int(m.group()))
        return None
    nums = _NUM.findall(text.replace(",", ""))
    return str(int(nums[-1])) if nums else None


def is_correct(pred_text: str, gold_final: str) -> bool:
    """Whether the answer extracted from ``pred_text`` equals ``gold_final`` as an integer."""
    pred = extract_answer(pred_text)
    if pred is None:
        return False
    try:
        return int(pred) == int(str(gold_final).strip())
    except ValueError:
        return pred == str(gold_final).strip()


# --------------------------------------------------------------------------------------------------
# Tokenizer: whole words + single digits
# --------------------------------------------------------------------------------------------------

SPECIAL_TOKENS = ["<pad>", "<eos>", "<mask>", "<unk>", "<bos>"]
# Continuation prefix of digits inside a number ("24" -> "2 @@4"); not "##", which would eat "####".
CONT = "@@"
PUNCT = [".", ",", "?", "!", "*", "/", "+", "-", "=", "####", ":", "'"]


def _template_words() -> set[str]:
    words: set[str] = set()
    texts = [t for group in _TEMPLATE_GROUPS for t in group]
    texts += NAMES_F + NAMES_M + OBJECTS + CONTAINERS + GROUPS + PEOPLE + ["she", "he", "her", "him"]
    for t in texts:
        t = re.sub(r"\{[a-z0-9]+\}", " ", t)
        for w in re.findall(r"[A-Za-z]+", t):
            words.add(w)
            words.add(_cap(w))
            words.add(w.lower())
    return words


def build_tokenizer(directory: Path | None = None):
    """Build the tiny-gsm tokenizer (a ``tokenizers`` WordPiece) and, if ``directory``, save it there.

    Returns a ``transformers.PreTrainedTokenizerFast``. Saved files load with ``AutoTokenizer``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab_list = list(SPECIAL_TOKENS)
    vocab_list += [str(d) for d in range(10)] + [f"{CONT}{d}" for d in range(10)]
    vocab_list += PUNCT
    vocab_list += sorted(_template_words())
    vocab = {tok: i for i, tok in enumerate(vocab_list)}
    tok = Tokenizer(
        models.WordPiece(
            vocab=vocab, unk_token="<unk>", continuing_subword_prefix=CONT, max_input_chars_per_word=100
        )
    )
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix=CONT, cleanup=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        mask_token="<mask>",
        unk_token="<unk>",
        bos_token="<bos>",
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
    if directory is not None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        fast.save_pretrained(str(directory))
    return fast
