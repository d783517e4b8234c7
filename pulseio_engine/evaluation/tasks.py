"""RULER-style long-context tasks, generated in code (no torch, no data files).

Each sample is a context (RULER's noise haystack, or a word list), a question and the strings a
correct answer contains. Scoring is RULER's `string_match_all`: the fraction of the answer strings
found, case-insensitively, in the output. Words are pseudo-words built from syllables by a seeded
`random.Random`, so every (task, context length, seed) gives the same samples everywhere.

- NEEDLE_SINGLE: one "special magic number" for a key, hidden at a random depth of the haystack.
- NEEDLE_MULTIKEY: four such needles with different keys; the question names one.
- VARIABLE_TRACKING: VAR A = 12345, then a chain of VAR B = VAR A ...; name every variable of the chain.
- COMMON_WORDS: a numbered word list in which a few words recur often; name the most common ones.
- PERPLEXITY is not generated here: it scores a long public-domain text (see `evaluation.run`).

Sizes are in tokens of the model's tokenizer, through `count_tokens`; a context comes out at or just
under the asked length.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

HAYSTACK = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
_ONSETS = "b c d f g h j k l m n p r s t v w z br cr dr fl gr pl st tr".split()
_VOWELS = "a e i o u ai ea io".split()


class Task(Enum):
    NEEDLE_SINGLE = "niah-single"
    NEEDLE_MULTIKEY = "niah-multikey"
    VARIABLE_TRACKING = "variable-tracking"
    COMMON_WORDS = "common-words"
    PERPLEXITY = "perplexity"


@dataclass(frozen=True)
class Sample:
    context: str
    question: str                 # decoded token by token after the context is prefilled
    answers: tuple[str, ...]
    max_new_tokens: int


def string_match_all(output: str, answers: tuple[str, ...]) -> float:
    """Fraction of `answers` found in `output`, case-insensitively."""
    low = output.lower()
    return sum(a.lower() in low for a in answers) / len(answers)


def make_sample(task: Task, *, context_len: int, seed: int, count_tokens: Callable[[str], int]) -> Sample:
    """One sample of `task` whose context + question take at most about `context_len` tokens."""
    rng = random.Random(f"{task.value}/{context_len}/{seed}")
    make = {Task.NEEDLE_SINGLE: _needles, Task.NEEDLE_MULTIKEY: _needles,
            Task.VARIABLE_TRACKING: _variables, Task.COMMON_WORDS: _common_words}.get(task)
    if make is None:
        raise ValueError(f"task {task.value!r} is not generated from words; see evaluation.run for perplexity")
    return make(task, rng, context_len, count_tokens)


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(2, 3)))


def _words(rng: random.Random, n: int) -> list[str]:
    seen: dict[str, None] = {}
    while len(seen) < n:
        seen[_word(rng)] = None
    return list(seen)


def _haystack(rng: random.Random, inserts: list[str], budget: int, count_tokens: Callable[[str], int]) -> str:
    """The noise haystack filling `budget` tokens, with `inserts` at random sentence boundaries."""
    units = max(1, (budget - sum(count_tokens(s) for s in inserts)) // count_tokens(HAYSTACK))
    pieces = [HAYSTACK] * units
    for text in inserts:
        pieces.insert(rng.randint(0, len(pieces)), text + " ")
    return "".join(pieces)


def _needles(task: Task, rng: random.Random, context_len: int, count_tokens: Callable[[str], int]) -> Sample:
    keys = _words(rng, 1 if task is Task.NEEDLE_SINGLE else 4)
    values = [str(rng.randint(1_000_000, 9_999_999)) for _ in keys]
    needles = [f"One of the special magic numbers for {k} is: {v}." for k, v in zip(keys, values, strict=True)]
    key = rng.randrange(len(keys))
    question = (f" What is the special magic number for {keys[key]} mentioned in the provided text? "
                f"The special magic number for {keys[key]} mentioned in the provided text is")
    budget = context_len - count_tokens(question) - 16
    return Sample(_haystack(rng, needles, budget, count_tokens), question, (values[key],), 12)


def _variables(task: Task, rng: random.Random, context_len: int, count_tokens: Callable[[str], int]) -> Sample:
    names = [w.upper()[:5] for w in _words(rng, 5)]
    value = str(rng.randint(10_000, 99_999))
    chain = [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:], strict=False)]
    question = (f" Find all variables that are assigned the value {value} in the text above. Answer: According "
                f"to the chain(s) of variable assignment in the text above, {len(names)} variables are "
                f"assigned the value {value}, they are:")
    budget = context_len - count_tokens(question) - 32
    context = _haystack(rng, [], budget, count_tokens)
    sentences = context.split(". ")
    at = sorted(rng.sample(range(len(sentences) + 1), len(chain)))
    for offset, (i, line) in enumerate(zip(at, chain, strict=True)):      # the chain in order, spread out
        sentences.insert(i + offset, line.rstrip("."))
    return Sample(". ".join(sentences), question, tuple(names), 30)


def _common_words(task: Task, rng: random.Random, context_len: int, count_tokens: Callable[[str], int]) -> Sample:
    """A list where 5 words recur `repeats` times and 40 rare ones once or so. Words and numbers differ in
    tokens, so `repeats` is scaled from what a first list measured, then lowered until the whole prompt
    fits with room for the 30-token answer."""
    common, rare, answer = 5, 40, 30
    question = (f" What are the {common} most common words in the above list? Answer: The top {common} words "
                "that appear most often in the list are:")
    header = "Below is a numbered list of words."
    words = _words(rng, common + rare)
    limit, fixed = context_len - answer - 2, count_tokens(header + question)
    per_word = count_tokens(" 100. " + words[0])
    slots = max(common * 4 + rare, (limit - fixed) // per_word)
    repeats = max(3, (slots - rare) // common)
    extra = [words[common + i % rare] for i in range(max(rare, slots - common * repeats))]
    order = rng.random()

    def render(repeats: int) -> tuple[str, int]:
        listed = words[:common] * repeats + extra
        random.Random(order).shuffle(listed)
        context = header + " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed))
        return context, count_tokens(context + question)

    for _ in range(2):                  # rescale from the measured cost of a listed word
        _, used = render(repeats)
        per_item = (used - fixed) / (common * repeats + len(extra))
        repeats = max(3, int(((limit - fixed) / per_item - len(extra)) / common))
    context, used = render(repeats)
    while used > limit and repeats > 3:
        repeats = max(3, repeats - max(1, math.ceil((used - limit) / (per_item * common))))
        context, used = render(repeats)
    return Sample(context, question, tuple(words[:common]), answer)
