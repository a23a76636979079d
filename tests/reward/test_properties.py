"""Properties: every score is in [0, 1], alias order never matters, equal values in any form match."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeline.protocols import protocol_for
from pipeline.reward import check_format, fast_math_equal, overlong_penalty, verify

TEXT_KINDS = ("fact", "em", "f1", "calculator", "complex")
answers = st.text(max_size=40)
aliases = st.lists(answers, min_size=1, max_size=5)
settings.register_profile("reward", max_examples=150, deadline=None)
settings.load_profile("reward")


@given(st.sampled_from(TEXT_KINDS), answers, aliases)
def test_scores_are_in_range(kind: str, predicted: str, golds: list[str]) -> None:
    assert 0.0 <= verify(kind, predicted, golds) <= 1.0


@given(st.sampled_from(TEXT_KINDS), answers, aliases, st.randoms())
def test_alias_order_is_irrelevant(kind: str, predicted: str, golds: list[str], rng) -> None:  # noqa: ANN001
    shuffled = list(golds)
    rng.shuffle(shuffled)
    assert verify(kind, predicted, golds) == verify(kind, predicted, shuffled)


@given(answers, aliases)
def test_adding_an_alias_never_lowers_the_score(predicted: str, golds: list[str]) -> None:
    assert verify("fact", predicted, [*golds, predicted]) >= verify("fact", predicted, golds)


@given(st.fractions(max_denominator=50).filter(lambda f: abs(f) < 10**6))
def test_a_fraction_equals_itself_written_as_latex_and_slash(value: Fraction) -> None:
    latex = f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    slash = f"{value.numerator}/{value.denominator}"
    assert fast_math_equal(latex, slash) is True
    assert verify("math", slash, latex) == 1.0


@settings(max_examples=40)
@given(st.integers(1, 99), st.integers(2, 20), st.data(), st.booleans())
def test_a_mixed_number_is_its_whole_plus_its_fraction(whole: int, denominator: int, data, negative: bool) -> None:  # noqa: ANN001
    """`w\\frac{n}{d}` is w + n/d (as competition answers write it), never the product w * n/d."""
    numerator = data.draw(st.integers(1, denominator - 1))
    sign = -1 if negative else 1
    mixed = f"{'-' if negative else ''}{whole}\\frac{{{numerator}}}{{{denominator}}}"
    value, product = sign * (whole + Fraction(numerator, denominator)), sign * whole * Fraction(numerator, denominator)
    assert verify("math", mixed, f"{value.numerator}/{value.denominator}") == 1.0
    assert verify("math", f"{product.numerator}/{product.denominator}", mixed) == 0.0


AFFIRMING = ("The answer is {}", "Final answer: {}", "{} apples", "So the result is {}.", "The answer is \\boxed{{{}}}",
             "So the result is {}", "I think it is {}, in all", "Thus we get {} (in total).")
DENYING = ("the answer is not {}", "{} is not the answer", "{} is wrong", "it can't be {}", "never {}",
           # a bound is not the number: "less than 5" is not 5
           "less than {}", "at least {}", "more than {}", "nearly {}", "{} at least", "no more than {}", "over {}")
NAMING_TWO = ("{} or {}", "answer: {}, {}", "{} is wrong, the answer is {}", "the answer is {}. the answer is {}",
              "between {} and {}")


@settings(max_examples=60)
@given(st.integers(-(10**6), 10**6), st.integers(1, 10**6), st.data())
def test_a_sentence_scores_its_one_number_and_never_a_denied_or_second_one(n: int, offset: int, data) -> None:  # noqa: ANN001
    """A math answer written as a sentence earns what its one number earns; a sentence that denies or bounds its
    number, or names two, earns nothing against either (else a policy could hedge in prose)."""
    other = n + offset
    affirming = data.draw(st.sampled_from(AFFIRMING))
    assert verify("math", affirming.format(n), str(n)) == 1.0
    assert verify("math", affirming.format(other), str(n)) == 0.0
    if n != 0:  # 0x is 0
        assert verify("math", affirming.format(f"{n}x"), str(n)) == 0.0  # a number times a variable is no number
    assert verify("math", data.draw(st.sampled_from(DENYING)).format(n), str(n)) == 0.0
    two = data.draw(st.sampled_from(NAMING_TWO))
    for first, second in ((n, other), (other, n)):
        assert verify("math", two.format(first, second), str(n)) == 0.0


INVISIBLE = "\u200b\u200c\u200d\u2060\u00ad\ufeff\u200e\u200f\u202a\u202c\u2066\u2069"
SCORED_PAIRS = [("math", "\\frac{1}{2}", "0.5"), ("math", "98", "98"), ("math", "97", "98"), ("calculator", "3.14", "3.14"),
                ("fact", "Paris", "Paris"), ("fact", "Pari", "Paris"), ("em", "The Eiffel Tower", "eiffel tower"),
                ("f1", "quick brown fox", "quick fox"), ("complex", "3.5 million", "3500000")]


@given(st.sampled_from(SCORED_PAIRS), st.lists(st.tuples(st.integers(0, 40), st.sampled_from(INVISIBLE)), max_size=4),
       st.booleans())
def test_invisible_characters_change_no_score(pair: tuple[str, str, str], inserts: list[tuple[int, str]],
                                              in_gold: bool) -> None:
    """Zero-width spaces, joiners, soft hyphens and direction marks, anywhere in an answer or a gold, change no
    score (a policy must not lose, nor a gold file gain, credit by what no reader can see)."""
    kind, predicted, gold = pair
    text = gold if in_gold else predicted
    for position, char in inserts:
        position %= len(text) + 1
        text = text[:position] + char + text[position:]
    marked = (predicted, text) if in_gold else (text, gold)
    assert verify(kind, *marked) == verify(kind, predicted, gold)


@given(st.integers(1, 10**12), st.integers(1, 99), st.sampled_from(["em", "fact", "f1"]))
def test_text_kinds_keep_what_a_number_means(n: int, decimals: int, kind: str) -> None:
    """Digit groups are presentation; a sign and a decimal point are not."""
    assert verify(kind, f"{n:,}", str(n)) == 1.0
    assert verify(kind, f"about {n:,} people", f"about {n} people") == 1.0
    assert verify(kind, f"-{n}", str(n)) < 1.0
    assert verify(kind, f"{n}.{decimals}", f"{n}{decimals}") < 1.0


@given(st.integers(-(10**9), 10**9), st.integers(1, 10**6))
def test_distinct_integers_never_match(a: int, offset: int) -> None:
    assert fast_math_equal(str(a), str(a + offset)) is False
    assert fast_math_equal(f"{a:,}", str(a)) is True


@given(st.decimals(min_value=-(10**6), max_value=10**6, places=3, allow_nan=False))
def test_decimal_and_percent_forms_match(value) -> None:  # noqa: ANN001
    assert verify("math", f"{value}", str(Fraction(value))) == 1.0
    assert verify("math", f"{value * 100}\\%", f"{value}") == 1.0


@given(st.integers(0, 500), st.integers(1, 300), st.integers(0, 400))
def test_overlong_penalty_in_range_and_monotone(tokens: int, max_tokens: int, buffer: int) -> None:
    here, longer = overlong_penalty(tokens, max_tokens, buffer), overlong_penalty(tokens + 1, max_tokens, buffer)
    assert -1.0 <= longer <= here <= 0.0


@given(st.text(max_size=200), st.sampled_from(("tapo", "search-r1", "torl")), st.booleans())
def test_format_check_and_extraction_never_crash(text: str, protocol: str, strict: bool) -> None:
    result = check_format(text, protocol_for(protocol), [], strict=strict)
    assert result.ok == (result.reason is None)
    answer = protocol_for(protocol).extract_answer(text)
    assert answer is None or isinstance(answer, str)


@given(st.text(alphabet=st.characters(blacklist_characters="<>\x00"), min_size=1, max_size=30).filter(str.strip))
def test_well_formed_tapo_answer_round_trips(answer: str) -> None:
    text = f"<think>t</think><answer>{answer}</answer>"
    assert check_format(text, protocol_for("tapo"), []).ok
    assert protocol_for("tapo").extract_answer(text) in (answer.strip(), None) or "\\boxed" in answer or "\\fbox" in answer


number_strings = st.from_regex(r"[-+]?\d{0,600}(\.\d{0,5})?([eE][-+]?\d{1,4})?%?", fullmatch=True)


@given(number_strings, number_strings)
@example("0", ".1E\u1949" "10")  # a Limbu digit 3: exponent 310, past a float
def test_any_number_string_is_scored_without_error(predicted: str, gold: str) -> None:
    """Huge, tiny and long numbers never overflow a float or Python's int-string limit."""
    for kind in ("calculator", "complex"):
        assert 0.0 <= verify(kind, predicted, gold) <= 1.0
    assert fast_math_equal(predicted, gold) in (True, False, None)


TAG_PIECES = ["<think>", "</think>", "<answer>", "</answer>", "<code>", "</code>", "<search>", "</search>",
              "<response>", "</response>", "x", " ", "\n", "42", "<python>", "</python>"]  # fmt: skip


@given(st.lists(st.sampled_from(TAG_PIECES), max_size=14).map("".join))
def test_grammar_invariants_on_tag_soup(text: str) -> None:
    strict = check_format(text, protocol_for("tapo"), [], strict=True)
    lenient = check_format(text, protocol_for("tapo"), [], strict=False)
    if strict.ok:
        assert lenient.ok  # strict accepts a subset of what lenient accepts
    if lenient.ok:
        assert text.count("<answer>") == text.count("</answer>") == 1
        assert "<response>" not in text and "</response>" not in text  # no tool ran, so no output is legal
        assert text.rsplit("</answer>", 1)[1].strip() == ""
        assert protocol_for("tapo").extract_answer(text)
