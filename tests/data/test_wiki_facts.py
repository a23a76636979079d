"""Fact questions from the embedded Wikipedia dump: clean, checkable, split by page, answerable by the search
service they are kept for; the unanswerable filter itself."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeline.config.search import SearchConfig
from pipeline.data import wiki_facts
from pipeline.data.answerable import drop_unanswerable, service_probe, shows_answer
from pipeline.data.wiki_facts import place_of, text_of, year_of
from pipeline.paths import embedded_wiki_dump
from pipeline.services.processes import free_port
from pipeline.types import Problem


@pytest.fixture(scope="module")
def facts() -> list[Problem]:
    return wiki_facts.generate(embedded_wiki_dump())


def test_the_dump_yields_clean_questions_that_do_not_give_their_answer_away(facts: list[Problem]) -> None:
    assert len(facts) >= 150 and len({p.meta["page"] for p in facts}) >= 50
    assert len({p.id for p in facts}) == len({p.question for p in facts}) == len(facts)
    for p in facts:
        assert p.type == "fact" and p.source == "wiki_facts" and p.answers, p
        for alias in p.answers:
            assert alias.strip() == alias and not re.search(r"[{}\[\]|=<>]", alias), p
            assert shows_answer(p.question, [alias]) is None, p
        assert p.meta["field"] == "opening" or len(p.answers[0].split()) <= wiki_facts.MAX_ANSWER_WORDS, p
    assert facts == wiki_facts.generate(embedded_wiki_dump())  # the same dump gives the same questions


@pytest.mark.parametrize(("value", "aliases"), [
    ("[[Algerian dinar|Dinar]]", ("Dinar", "Algerian dinar")),
    ("[[Telephone numbers in Algeria|+213]]", ("+213",)),  # a page about the value is not a name of it
    ("{{nowrap|[[Princeton, New Jersey]], U.S.}}", ("Princeton, New Jersey, U.S", "Princeton, New Jersey", "Princeton")),
    ("'''Animalia'''", ("Animalia",)),
    ("{{hlist |[[Arabic]]<ref name=\"c\">{{cite web|url=x}}</ref>|[[Berber languages|Berber]]}}", ("Arabic",)),
    ("<!-- none -->", ()),
    ("{{cite web|url=http://x}}", ()),
    ("a value with far too many words to be a short checkable answer", ()),
])
def test_field_values_are_read_as_plain_short_answers(value: str, aliases: tuple[str, ...]) -> None:
    reader = place_of if "Princeton" in value else text_of
    assert reader(value) == aliases


@pytest.mark.parametrize(("value", "year"), [
    ("{{birth date|1809|2|12}}", ("1809",)),
    ("{{Death date and age|df=yes|1981|12|28|1885|4|3}}", ("1981",)),
    ("384 BC {{longitem|padding-top:0|[[Stagira]]}}", ("384 BC",)),
    ("March 4, 1861", ("1861",)),
    ("unknown", ()),
])
def test_dates_are_read_as_their_year(value: str, year: tuple[str, ...]) -> None:
    assert year_of(value) == year


@settings(max_examples=60, deadline=None)
@given(fraction=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_no_page_is_asked_about_on_both_sides(facts: list[Problem], fraction: float, seed: int) -> None:
    train, test = wiki_facts.split_by_page(facts, fraction, seed)
    assert sorted(p.id for p in train + test) == sorted(p.id for p in facts)
    assert not {p.meta["page"] for p in train} & {p.meta["page"] for p in test}
    assert {p.split for p in train} <= {"train"} and {p.split for p in test} <= {"test"}


@given(alias=st.text(st.characters(categories=("L", "N")), min_size=1, max_size=6),
       left=st.text(st.characters(categories=("L", "N")), max_size=3),
       right=st.text(st.characters(categories=("L", "N")), max_size=3),
       sep=st.sampled_from([" ", ", ", "(", ". ", "\n"]))
@example(alias="ı", left="", right="", sep=" ")
def test_an_answer_counts_only_as_a_whole_phrase(alias: str, left: str, right: str, sep: str) -> None:
    # in another case where that is the same word when case is ignored ('ı' upper-cases to 'I', which is 'i')
    shown = alias.upper() if alias.upper().casefold() == alias.casefold() else alias
    assert shows_answer(f"x{sep}{shown}{sep}y", [alias]) == alias
    if left or right:  # glued into a longer word it is not shown (unless the longer word shows it elsewhere)
        glued = f"{left}{alias}{right}"
        assert shows_answer(glued, [alias]) is None or re.search(rf"(?<!\w){re.escape(alias.casefold())}(?!\w)",
                                                                 glued.casefold())


def test_the_filter_keeps_what_the_search_shows_and_checks_only_the_rows_it_is_asked_to() -> None:
    rows = [Problem(f"f{i}", f"question {i}?", (answer,), "fact", "wiki_facts", "train")
            for i, answer in enumerate(["Algiers", "dz", "Tirana"])]
    other = Problem("c", "What is 6 * 7?", ("42",), "calculator", "calculator", "train")
    shown = {"question 0?": "Doc 1 (Title: Algeria) The capital is Algiers.", "question 1?": "an adze",
             "question 2?": ""}
    asked: list[str] = []

    def probe(questions):
        asked.extend(questions)
        return [shown[q] for q in questions]

    kept, rejected = drop_unanswerable(rows + [other], lambda p: p.source == "wiki_facts", probe)
    assert [p.id for p in kept] == ["f0", "c"] and [r.id for r in rejected] == ["f1", "f2"]
    assert {r.filter for r in rejected} == {"unanswerable"} and "c" not in " ".join(asked)
    with pytest.raises(ValueError, match="no search service"):
        drop_unanswerable(rows, lambda p: True, None)


def test_a_search_outage_stops_curation_instead_of_rejecting_rows() -> None:
    probe = service_probe(SearchConfig(recover_s=0.2, provider_timeout_s=1.0), f"http://127.0.0.1:{free_port()}", 500)
    rows = [Problem("f0", "What is the capital of Algeria?", ("Algiers",), "fact", "wiki_facts", "train")]
    with pytest.raises(RuntimeError, match="no row was rejected"):
        drop_unanswerable(rows, lambda p: True, probe)


# Pieces of wikitext, broken or not: joined at random they make infoboxes, templates, links, references and
# comments that open without closing, close without opening, nest, and hold the answer.
MARKUP = st.sampled_from(list("{}|[]=<>'\n *#:!-&;/") + [
    "{{Infobox country", "{{Infobox book", "{{", "}}", "[[", "]]", "| name = ", "| capital = ", "| released = ",
    "| author = ", "<ref>", "</ref>", "<!--", "-->", "Paris", "1999", "Aardvark", " is a ", "The ",
    "[[Paris|the city]]", "{{lang|fr|Paris}}", "{{start date|1999|1|1}}", "<br/>", "'''", "''"])


@settings(max_examples=300, deadline=None)
@given(title=st.sampled_from(["Aardvark", "Paris", "The Beatles", "A (letter)", "Ω"]),
       wikitext=st.lists(MARKUP, max_size=40).map("".join))
def test_any_wikitext_gives_clean_questions_or_none_and_never_raises(title: str, wikitext: str) -> None:
    """Real dumps hold every kind of broken markup: an article yields questions that do not show their answer,
    or nothing, and reading it never raises."""
    article = wiki_facts.Article(title, wikitext)
    box = wiki_facts.infobox_of(article)
    problems = (wiki_facts.infobox_questions(box) if box is not None else []) + [wiki_facts.described(article)]
    for problem in problems:
        if problem is not None:
            assert problem.answers and all(a.strip() for a in problem.answers)
            assert not shows_answer(problem.question, problem.answers), problem


VALUES = st.lists(MARKUP | st.sampled_from(["Paris", "France", "euro", "+33", "Aardvark", "1999", "left", ".fr",
                                            "Paris, France", "[[Paris]]", "{{nowrap|Paris}}"]), min_size=1,
                  max_size=6).map("".join)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["country", "writer", "book", "u.s. state"]),
       title=st.sampled_from(["France", "Paris", "Aardvark", "Victor Hugo"]),
       fields=st.dictionaries(st.sampled_from([t.field for t in wiki_facts.TEMPLATES] + ["name"]), VALUES,
                              max_size=6),
       opening=VALUES)
def test_any_infobox_field_gives_a_clean_question_or_none(kind: str, title: str, fields: dict[str, str],
                                                         opening: str) -> None:
    """The same, with well-formed infoboxes whose values are anything, so questions are actually made."""
    box = "\n".join([f"{{{{Infobox {kind}"] + [f"| {k} = {v}" for k, v in fields.items()] + ["}}"])
    article = wiki_facts.Article(title, f"{box}\n'''{title}''' is a {opening}.\n")
    parsed = wiki_facts.infobox_of(article)  # None when a value leaves a template open: the box never closes
    assert parsed is None or parsed.kind == kind
    questions = wiki_facts.infobox_questions(parsed) if parsed is not None else []
    for problem in [*questions, wiki_facts.described(article)]:
        if problem is not None:
            assert problem.answers and all(a.strip() for a in problem.answers)
            assert not shows_answer(problem.question, problem.answers), problem
