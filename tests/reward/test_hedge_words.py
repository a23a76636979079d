"""The hedge rule reads the joining words of every language the verifiers read, as one class: every word of the lists
in `hedge_words`, in every position, in every kind, and in every form a reader takes for it, earns nothing.

An audit found the complex kind paying 1.0 to `3 (maybe 1)`, `3 (possibly 1)`, `3 alternatively 1`, `3 otherwise 1`,
`3 but could be 1`, `3 unless 1`, `3 eller 1`, `3 ᴏʀ 1` and `3 \\\\ 1`: each a word or a sign the English-only lists
lacked. These properties run over the lists themselves, so a word added there is tested here.
"""

from __future__ import annotations

import itertools
import unicodedata

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeline.reward import VERIFIER_KINDS, verify
from pipeline.reward.hedge_words import AND, DOUBT, OR, OR_BETWEEN_NUMBERS, OTHERWISE, TO, is_unspaced
from pipeline.reward.hedging import NUMERIC_TEXT_KINDS, is_hedged


def listed(*tables: dict[str, tuple[str, ...]]) -> list[str]:
    return sorted({word for table in tables for group in table.values() for word in group})


BETWEEN_NUMBERS = listed(OR, OR_BETWEEN_NUMBERS, TO, OTHERWISE, DOUBT)  # join two numbers in every kind
NUMERIC_TEXT_ONLY = listed(AND)  # "3 and 5" names two numbers to a reader of one
SEPARATING = listed(OR, OTHERWISE)  # separate any two answers wherever they stand
AFTER_A_SEPARATOR = listed(DOUBT)  # ", maybe London", "(perhaps London)"

NUMBER_POSITIONS = ["{a} {w} {b}", "{a}, {w} {b}", "{a} ({w} {b})", "{a}; {w}: {b}", "{a} — {w} {b}",
                    "**{a}** {w} **{b}**", "{a} \\text{{ {w} }} {b}", "${a}$ {w} ${b}$", "{a}\n{w} {b}",
                    "{w} {a}, {w} {b}", "{a} ({w}) {b}", "{a}, but {w} {b}"]
UNSPACED_POSITIONS = ["{a}{w}{b}", "{a}（{w}{b}）"]
WORD_POSITIONS = ["{a} {w} {b}", "{a}, {w} {b}", "{a} ({w} {b})"]
DOUBT_WORD_POSITIONS = ["{a}, {w} {b}", "{a} ({w} {b})", "{a}; {w} {b}"]


def small_capitals(word: str) -> str:
    def one(ch: str) -> str:
        try:
            return unicodedata.lookup(f"LATIN LETTER SMALL CAPITAL {ch.upper()}")
        except KeyError:
            return ch
    return "".join(map(one, word))


def full_width(word: str) -> str:
    return "".join(chr(ord(ch) - 0x21 + 0xFF01) if "!" <= ch <= "~" else ch for ch in word)


LOOK_ALIKES = str.maketrans("aeopcxy", "аеорсху")  # Cyrillic letters that read as these Latin ones
FORMS = {"as listed": str, "capitals": str.upper, "small capitals": small_capitals, "full width": full_width,
         "look-alikes": lambda w: w.translate(LOOK_ALIKES), "underlined": lambda w: "".join(f"{ch}\u0332" for ch in w)}


def positions(word: str) -> list[str]:
    return NUMBER_POSITIONS + (UNSPACED_POSITIONS if is_unspaced(word) else [])


@pytest.mark.parametrize("kind", VERIFIER_KINDS)
def test_hedge_words_join_two_numbers_in_every_position(kind: str) -> None:
    """Every listed word (and "and" in every language, to the kinds that read one number) between two different
    numbers, in every position, is a hedge: exhaustive over the lists."""
    words = BETWEEN_NUMBERS + (NUMERIC_TEXT_ONLY if kind in NUMERIC_TEXT_KINDS else [])
    missed = [form.format(a=3, b=17, w=word) for word in words for form in positions(word)
              if not is_hedged(form.format(a=3, b=17, w=word), "3", kind)]
    assert missed == [], missed[:20]


@pytest.mark.parametrize("form_name", sorted(FORMS))
def test_hedge_words_in_any_form_a_reader_takes_for_them(form_name: str) -> None:
    """Capitals, small capitals (`ᴏʀ`), full-width letters (`ｏｒ`), underlined letters (`o̲r̲`) and Cyrillic look-alikes
    (`оr`) are the word."""
    latin = [w for w in BETWEEN_NUMBERS + SEPARATING if w.isascii() and w.isalpha()]
    missed = [f"3 {FORMS[form_name](w)} 17" for w in latin for kind in ("complex", "math", "f1")
              if not is_hedged(f"3 {FORMS[form_name](w)} 17", "3", kind)]
    assert missed == [], missed[:20]


numbers = st.one_of(st.integers(0, 10**6).map(str), st.decimals(0, 10**4, places=2).map(str))


@settings(max_examples=500, deadline=None)
@given(a=numbers, b=numbers, word=st.sampled_from(BETWEEN_NUMBERS), data=st.data(), kind=st.sampled_from(VERIFIER_KINDS),
       form_name=st.sampled_from(sorted(FORMS)))
def test_hedge_words_between_numbers_earn_nothing_in_any_kind(a: str, b: str, word: str, data: st.DataObject,
                                                               kind: str, form_name: str) -> None:
    """Scored as the verifiers score (each kind's reading first): neither candidate is paid."""
    assume(float(a) != float(b))
    form = data.draw(st.sampled_from(positions(word)))
    hedge = form.format(a=a, b=b, w=FORMS[form_name](word) if word.isascii() else word)
    assert verify(kind, hedge, a) == 0.0, hedge
    assert verify(kind, hedge, b) == 0.0, hedge


answers = st.sampled_from(["Paris", "London", "Canberra", "Sydney", "Marie Curie", "Pierre Curie", "Jupiter"])


@settings(max_examples=400, deadline=None)
@given(a=answers, b=answers, data=st.data(), kind=st.sampled_from(VERIFIER_KINDS))
def test_hedge_words_between_two_answers_earn_nothing_in_any_kind(a: str, b: str, data: st.DataObject,
                                                                   kind: str) -> None:
    """"or" in any language and the words that introduce another answer separate answers wherever they stand;
    words of doubt do after a separator ("Paris, maybe London")."""
    assume(a != b)
    word, form = data.draw(st.one_of(st.tuples(st.sampled_from(SEPARATING), st.sampled_from(WORD_POSITIONS)),
                                     st.tuples(st.sampled_from(AFTER_A_SEPARATOR), st.sampled_from(DOUBT_WORD_POSITIONS))))
    hedge = form.format(a=a, b=b, w=word)
    assert verify(kind, hedge, a) == 0.0, hedge
    assert verify(kind, hedge, b) == 0.0, hedge


@pytest.mark.parametrize(("word", "kind"), list(itertools.product(listed(DOUBT, OTHERWISE), ["complex", "math", "fact"])))
def test_hedge_words_beside_one_answer_name_no_second(word: str, kind: str) -> None:
    """A word of doubt next to a single answer names no other candidate: the kind judges the answer."""
    for one in (f"3 ({word})", f"{word} 3", f"3, {word}", f"3 {word}"):
        assert not is_hedged(one, "3", kind), one


@pytest.mark.parametrize(("kind", "predicted", "gold"), [
    ("complex", "3 May 2020", "3"), ("complex", "3.5 million (2020)", "3500000"),
    ("complex", "98 million people in 2020", "98000000"), ("math", "x^2 - 1", "x^2-1"),
    ("calculator", "3 \\times 10^{4}", "30000"), ("fact", "Mount Tai", "Mount Tai"), ("fact", "Oder", "Oder"),
    ("complex", "about 3 \\text{ million}", "3000000"), ("complex", "3 of 5 people", "3")])
def test_hedge_words_leave_one_value_alone(kind: str, predicted: str, gold: str) -> None:
    """Glue alone ("may") joins nothing, and a word listed only between numbers ("tai") splits no answer."""
    assert not is_hedged(predicted, gold, kind)


@pytest.mark.parametrize(("predicted", "kind", "gold"), [
    ("3 (maybe 1)", "complex", "3"), ("3 (possibly 1)", "complex", "3"), ("3 (perhaps 1)", "complex", "3"),
    ("3 alternatively 1", "complex", "3"), ("3 otherwise 1", "complex", "3"), ("3 but could be 1", "complex", "3"),
    ("3 unless 1", "complex", "3"), ("3 eller 1", "complex", "3"), ("3 ᴏʀ 1", "complex", "3"),
    ("3 \\\\ 1", "complex", "3"), ("3 \\newline 1", "calculator", "3"), ("Paris \\\\ London", "f1", "Paris"),
    ("3or1", "complex", "3"), ("3或1", "math", "3"), ("entre 3 et 5", "math", "3"), ("3 und 5", "complex", "3")])
def test_hedge_words_the_audit_found(predicted: str, kind: str, gold: str) -> None:
    assert verify(kind, predicted, gold) == 0.0, predicted
