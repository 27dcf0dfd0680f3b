"""The stories' vocabulary: names, objects, containers, connectors and the sentence templates.

:mod:`.problems` fills the templates in; :mod:`.tokenizer` builds its vocabulary from every word here.
"""

from __future__ import annotations

__all__ = [
    "ADD_TEMPLATES",
    "BOX_TEMPLATES",
    "CONNECTORS",
    "CONTAINERS",
    "DIV_TEMPLATES",
    "GIVE_EACH_TEMPLATES",
    "GROUPS",
    "MUL_TEMPLATES",
    "MUL_WORDS",
    "NAMES_F",
    "NAMES_M",
    "OBJECTS",
    "PEOPLE",
    "QUESTION_TEMPLATES",
    "START_TEMPLATES",
    "SUB_TEMPLATES",
    "TEMPLATE_GROUPS",
    "capitalize_first",
]

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

#: Every template list (the words of the tokenizer's vocabulary, see :mod:`.tokenizer`).
TEMPLATE_GROUPS = [
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


def capitalize_first(s: str) -> str:
    """``s`` with its first character upper-cased (the start of a sentence); the rest unchanged."""
    return s[:1].upper() + s[1:]
