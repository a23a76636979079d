"""Fact questions generated from the infoboxes of the embedded Wikipedia dump: the offline default's fact set.

The default search corpus is the real English Wikipedia excerpt shipped in the gensim wheel (106 articles,
`pipeline.paths.embedded_wiki_dump`). Its infoboxes hold short, checkable facts about exactly the entities the
search service can find: a country's capital and currency, a person's birth year and birthplace, a book's
author. Each `FactTemplate` turns one infobox field into a question ("What is the capital of Algeria?") with the
field's value, cleaned of wiki markup, as the gold answer (and a link's target as a second alias).

A second kind of question names the subject of an article from its opening definition: "Alabama is a state
located in the southeastern region of the United States." becomes 'Which subject is described as "a state located
in the southeastern region of the United States"?' with the page title as the gold answer (`described`). It is
asked only when the sentence opens with the title itself (not an image caption) and does not give the title away.

Only what reads cleanly is kept: a value that still holds markup after cleaning, or is longer than
`MAX_ANSWER_WORDS`, yields no question. Whether the search service can answer a question is decided later, by
curation, against the real service (`pipeline.data.curate`, filter `unanswerable`): the question is kept only
when searching it shows a gold alias within the part of the output the policy sees.

Output depends only on the dump: the same gensim version gives the same questions on every machine. Ids are
`wiki_facts-<sha1 of the question>[:12]`, and `meta` records the page, infobox kind and field, so train and
test can be split by page (`split_by_page`): no entity is asked about on both sides.
"""

from __future__ import annotations

import bz2
import hashlib
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.data.answerable import shows_answer
from pipeline.types import Problem, Split

SOURCE = "wiki_facts"
MAX_ANSWER_WORDS = 6
_LINK = re.compile(r"\[\[([^\[\]|]*)(?:\|([^\[\]]*))?\]\]")
_TAG_BLOCK = re.compile(r"<(ref|small|sup|sub)[^>]*?(?:/>|>.*?</\1\s*>)", re.S | re.I)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_BREAK = re.compile(r"<br\s*/?>", re.I)
_TAG = re.compile(r"<[^>]+>")
_PAREN = re.compile(r"\s*\([^()]*\)")
_YEAR = re.compile(r"\b(\d{3,4})\b")
_MARKUP = re.compile(r"[{}\[\]|=<>]")
_KEEP_LAST = frozenset({"nowrap", "nobold", "noitalic", "small", "lang", "nowiki"})
_KEEP_FIRST = frozenset({"flagu", "flag", "flagcountry", "flagicon", "hlist", "ubl", "unbulleted list", "plainlist",
                         "collapsible list", "ill"})


@dataclass(frozen=True)
class FactTemplate:
    """One infobox field as a question. `kinds`: infobox kinds it applies to (empty = any kind with the field)."""

    field: str
    question: str  # "{subject}" is the page's subject
    answer: Callable[[str], tuple[str, ...]]  # the raw field value -> gold aliases (empty: no question)
    kinds: tuple[str, ...] = ()


def year_of(value: str) -> tuple[str, ...]:
    """The first year a (date) field names, 'BC' kept: '{{birth date|1809|2|12}}' -> ('1809',)."""
    text = _strip_markup(value, templates_to_args=True)
    match = _YEAR.search(text)
    if match is None:
        return ()
    bc = text[match.end():].lstrip().upper().startswith("BC")
    return (f"{match.group(1)} BC",) if bc else (match.group(1),)


def text_of(value: str) -> tuple[str, ...]:
    """A short plain value: its first line, markup and parentheticals removed; a single link's target is a
    second alias ('[[Algerian dinar|Dinar]]' -> ('Dinar', 'Algerian dinar'))."""
    first = _first_line(value)
    links = _LINK.findall(first)
    answer = _PAREN.sub("", _strip_markup(first)).strip(" ,;:.'\"*#")
    if not answer or _MARKUP.search(answer) or len(answer.split()) > MAX_ANSWER_WORDS:
        return ()
    aliases = [answer]
    if len(links) == 1 and links[0][0]:
        target = _PAREN.sub("", links[0][0].split("#")[0]).strip()
        # a target that names the same thing ('Algerian dinar' for 'Dinar'), not a page about it
        # ('Telephone numbers in Algeria' for '+213')
        answer_words, target_words = (set(re.findall(r"\w+", t.lower())) for t in (answer, target))
        related = answer_words <= target_words or target_words <= answer_words
        if related and not _MARKUP.search(target) and len(target.split()) <= MAX_ANSWER_WORDS:
            aliases.append(target)
    return _unique(aliases)


def _unique(aliases: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a for a in aliases if a))


def side_of(value: str) -> tuple[str, ...]:
    """The side traffic drives on: ('right',) or ('left',)."""
    words = _strip_markup(value).lower().split()
    return (words[0],) if words and words[0] in ("right", "left") else ()


def domain_of(value: str) -> tuple[str, ...]:
    """A country-code top-level domain, with and without its dot: ('.dz', 'dz')."""
    match = re.search(r"\.?\b([a-z]{2})\b", _strip_markup(value).lower())
    return (f".{match.group(1)}", match.group(1)) if match else ()


def place_of(value: str) -> tuple[str, ...]:
    """A place: the whole cleaned value and its first part ('[[Ulm]], [[Kingdom of Württemberg]]' -> ('Ulm, ...',
    'Ulm')), so an answer naming only the town counts."""
    whole = text_of(value)
    if not whole:
        return ()
    return _unique([*whole, whole[0].split(",")[0].strip()])


PERSON = ("writer", "philosopher", "scientist", "person", "officeholder", "tennis biography", "military person",
          "artist", "musical artist", "royalty", "president", "economist", "architect", "chess player")
TEMPLATES: tuple[FactTemplate, ...] = (
    FactTemplate("capital", "What is the capital of {subject}?", place_of, ("country", "u.s. state", "province")),
    FactTemplate("currency", "What is the currency of {subject}?", text_of, ("country",)),
    FactTemplate("calling_code", "What is the international calling code of {subject}?", text_of, ("country",)),
    FactTemplate("demonym", "What is the demonym for the people of {subject}?", text_of, ("country", "continent")),
    FactTemplate("currency_code", "What is the ISO 4217 currency code of {subject}?", text_of, ("country",)),
    FactTemplate("cctld", "What is the internet country code top-level domain of {subject}?", domain_of, ("country",)),
    FactTemplate("largest_city", "What is the largest city of {subject}?", place_of, ("country", "u.s. state")),
    FactTemplate("official_languages", "What is an official language of {subject}?", text_of, ("country",)),
    FactTemplate("national_anthem", "What is the national anthem of {subject}?", text_of, ("country",)),
    FactTemplate("drives_on", "On which side of the road does traffic drive in {subject}?", side_of, ("country",)),
    FactTemplate("legislature", "What is the legislature of {subject} called?", text_of, ("country",)),
    FactTemplate("birth_date", "In what year was {subject} born?", year_of, PERSON),
    FactTemplate("death_date", "In what year did {subject} die?", year_of, PERSON),
    FactTemplate("birth_place", "Where was {subject} born?", place_of, PERSON),
    FactTemplate("death_place", "Where did {subject} die?", place_of, PERSON),
    FactTemplate("nationality", "What was the nationality of {subject}?", text_of, PERSON),
    FactTemplate("alma_mater", "Which university did {subject} attend?", text_of, PERSON),
    FactTemplate("spouse", "Who was the spouse of {subject}?", text_of, PERSON),
    FactTemplate("occupation", "What was the occupation of {subject}?", text_of, PERSON),
    FactTemplate("field", "In which field did {subject} work?", text_of, PERSON),
    FactTemplate("doctoral_advisor", "Who was the doctoral advisor of {subject}?", text_of, PERSON),
    FactTemplate("party", "Which political party did {subject} belong to?", text_of, PERSON),
    FactTemplate("office", "Which office did {subject} hold?", text_of, PERSON),
    FactTemplate("author", "Who wrote {subject}?", text_of, ("book",)),
    FactTemplate("release_date", "In what year was {subject} first published?", year_of, ("book",)),
    FactTemplate("pub_date", "In what year was {subject} first published?", year_of, ("book",)),
    FactTemplate("publisher", "Who published {subject}?", text_of, ("book", "journal")),
    FactTemplate("language", "In which language was {subject} written?", text_of, ("book",)),
    FactTemplate("genre", "What is the genre of {subject}?", text_of, ("book",)),
    FactTemplate("director", "Who directed the film {subject}?", text_of, ("film",)),
    FactTemplate("producer", "Who produced the film {subject}?", text_of, ("film",)),
    FactTemplate("music", "Who composed the music of the film {subject}?", text_of, ("film",)),
    FactTemplate("presenter", "Who presents the {subject}?", text_of, ("award",)),
    FactTemplate("headquarters", "Where are the headquarters of {subject}?", place_of, ("organization",)),
    FactTemplate("launch_rocket", "Which rocket launched {subject}?", text_of, ("spaceflight",)),
    FactTemplate("launch_date", "In what year was {subject} launched?", year_of, ("spaceflight",)),
    FactTemplate("creator", "Who created {subject}?", text_of, ("martial art",)),
    FactTemplate("namedafter", "Who is the {subject} named after?", text_of, ("unit",)),
    FactTemplate("quantity", "What physical quantity does the {subject} measure?", text_of, ("unit",)),
)


MAX_DESCRIPTION_WORDS = 24
_DEFINITION = re.compile(r"(.{1,160}?)\s+(?:is|was|are|were)\s+((?:a|an|the|one)\b.{10,400}?)\.(?:\s|$)")


@dataclass(frozen=True)
class Article:
    page: str  # the page title
    wikitext: str


@dataclass(frozen=True)
class Infobox:
    page: str  # the page title
    kind: str  # lower-cased infobox kind ("country", "book")
    fields: dict[str, str]  # raw values, markup included


def articles(dump: Path) -> Iterator[Article]:
    """Every article of a MediaWiki XML dump (`.xml` or `.xml.bz2`), with the reader the search index uses;
    redirects skipped."""
    from gensim.corpora.wikicorpus import extract_pages

    opener = bz2.open if dump.suffix == ".bz2" else open
    with opener(dump, "rb") as handle:
        for title, wikitext, _ in extract_pages(handle):
            if wikitext and not wikitext.lstrip().lower().startswith("#redirect"):
                yield Article(title, wikitext)


def infobox_of(article: Article) -> Infobox | None:
    """The article's first infobox, or None."""
    box = _infobox_text(article.wikitext)
    if box is None:
        return None
    kind, fields = _parse_infobox(box)
    return Infobox(article.page, kind, fields)


def described(article: Article) -> Problem | None:
    """'Which subject is described as "<the opening definition>"?', answered by the page title; None when the
    article does not open with a definition of its title."""
    from gensim.corpora.wikicorpus import filter_wiki  # the markup filter the search index uses

    text = " ".join(re.sub(r"'{2,}", "", filter_wiki(article.wikitext)).split())
    match = _DEFINITION.match(text)
    title = _PAREN.sub("", article.page).strip()
    if match is None or not title:
        return None
    subject, definition = _PAREN.sub("", match.group(1)).strip(" ,"), match.group(2)
    if not subject.lower().removeprefix("the ").endswith(title.lower().removeprefix("the ")):
        return None  # the sentence opens with a caption or another name, not the title
    words = definition.split()
    if len(words) > MAX_DESCRIPTION_WORDS:
        definition = " ".join(words[:MAX_DESCRIPTION_WORDS]).rstrip(",;:") + " ..."
    if shows_answer(definition, [title]) or _MARKUP.search(definition):
        return None
    question = f'Which subject is described as "{definition}"?'
    short_name = subject.removeprefix("The ").removeprefix("the ")  # 'The aardwolf' -> 'aardwolf'
    plain = len(short_name.split()) <= 4 and re.fullmatch(r"[\w' -]+", short_name) is not None
    aliases = _unique([title, short_name] if plain else [title])
    return _problem(question, aliases, article.page, "definition", "opening")


def generate(dump: Path) -> list[Problem]:
    """Every question the dump yields, in dump order: each article's infobox facts, then its description
    (type fact, split unset)."""
    problems, seen = [], set()
    for article in articles(dump):
        box = infobox_of(article)
        candidates = (infobox_questions(box) if box is not None else []) + [described(article)]
        for problem in candidates:
            if problem is not None and problem.question not in seen:
                seen.add(problem.question)
                problems.append(problem)
    return problems


def infobox_questions(box: Infobox) -> list[Problem]:
    """The template questions of one infobox whose field reads cleanly and does not give the answer away."""
    subject, problems = _subject(box), []
    for template in TEMPLATES:
        if template.kinds and not any(box.kind.startswith(k) for k in template.kinds):
            continue
        value = _field(box, template.field)
        aliases = template.answer(value) if value.strip() else ()
        question = template.question.format(subject=subject)
        if aliases and not any(shows_answer(question, [alias]) for alias in aliases):
            problems.append(_problem(question, aliases, box.page, box.kind, template.field))
    return problems


def _problem(question: str, aliases: tuple[str, ...], page: str, kind: str, field: str) -> Problem:
    digest = hashlib.sha1(question.encode()).hexdigest()[:12]
    return Problem(f"{SOURCE}-{digest}", question, aliases, "fact", SOURCE, "train",
                   {"page": page, "infobox": kind, "field": field})


def split_by_page(problems: list[Problem], test_fraction: float, seed: int) -> tuple[list[Problem], list[Problem]]:
    """Train and test problems with no page on both sides (a seeded draw of whole pages)."""
    pages = sorted({p.meta["page"] for p in problems})
    random.Random(seed).shuffle(pages)
    test_pages = set(pages[:round(len(pages) * test_fraction)])
    train = [_with_split(p, "train") for p in problems if p.meta["page"] not in test_pages]
    test = [_with_split(p, "test") for p in problems if p.meta["page"] in test_pages]
    return train, test


def _field(box: Infobox, name: str) -> str:
    """A field's raw value; a largest city given as "capital" is the capital's."""
    value = box.fields.get(name, "")
    return box.fields.get("capital", "") if name == "largest_city" and value.strip().lower() == "capital" else value


def _with_split(problem: Problem, split: Split) -> Problem:
    return Problem(problem.id, problem.question, problem.answers, problem.type, problem.source, split, problem.meta)


def _subject(box: Infobox) -> str:
    for key in ("common_name", "name", "title", "conflict", "document_name"):
        aliases = text_of(box.fields.get(key, ""))
        if aliases:
            return aliases[0]
    return _PAREN.sub("", box.page).strip()


def _infobox_text(wikitext: str) -> str | None:
    """The body of the first `{{Infobox ...}}` (balanced braces), or None."""
    start = wikitext.find("{{Infobox")
    if start < 0:
        return None
    depth, i = 0, start
    while i < len(wikitext) - 1:
        pair = wikitext[i:i + 2]
        if pair == "{{":
            depth, i = depth + 1, i + 2
        elif pair == "}}":
            depth, i = depth - 1, i + 2
            if depth == 0:
                return wikitext[start + 2:i - 2]
        else:
            i += 1
    return None


def _split_top_level(text: str) -> list[str]:
    """`text` split at the pipes that are not inside a template or a link."""
    parts, depth, current, i = [], 0, [], 0
    while i < len(text):
        pair = text[i:i + 2]
        if pair in ("{{", "[["):
            depth, i = depth + 1, i + 2
            current.append(pair)
        elif pair in ("}}", "]]"):
            depth, i = max(depth - 1, 0), i + 2
            current.append(pair)
        elif text[i] == "|" and depth == 0:
            parts.append("".join(current))
            current, i = [], i + 1
        else:
            current.append(text[i])
            i += 1
    parts.append("".join(current))
    return parts


def _parse_infobox(body: str) -> tuple[str, dict[str, str]]:
    head, *rest = _split_top_level(_COMMENT.sub("", body))
    kind = head.removeprefix("Infobox").strip().lower()
    fields: dict[str, str] = {}
    for part in rest:
        key, sep, value = part.partition("=")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    return kind, fields


def _first_line(value: str) -> str:
    value = _COMMENT.sub("", value)
    value = _expand_templates(value, templates_to_args=False)
    return _BREAK.split(value)[0].split("\n")[0]


def _strip_markup(value: str, templates_to_args: bool = False) -> str:
    value = _expand_templates(_COMMENT.sub("", value), templates_to_args)
    value = _TAG.sub("", _TAG_BLOCK.sub("", _BREAK.sub(" ", value)))
    value = _LINK.sub(lambda m: m.group(2) if m.group(2) is not None else m.group(1), value)
    return re.sub(r"'{2,}", "", value).replace("&nbsp;", " ").strip()


def _expand_templates(value: str, templates_to_args: bool) -> str:
    """Innermost templates first: formatting ones keep their text (`{{nowrap|x}}` -> x), list and flag ones their
    first item; with `templates_to_args` every other template becomes its arguments (dates keep their numbers),
    else it is removed."""
    inner = re.compile(r"\{\{([^{}]*)\}\}")
    for _ in range(20):  # nesting depth bound
        expanded = inner.sub(lambda m: _template_text(m.group(1), templates_to_args), value)
        if expanded == value:
            break
        value = expanded
    return value


def _template_text(body: str, templates_to_args: bool) -> str:
    name, *args = (a.strip() for a in _split_top_level(body))
    positional = [a for a in args if "=" not in a.split("[[")[0]]
    name = name.lower()
    if name in _KEEP_LAST and positional:
        return positional[-1]
    if name in _KEEP_FIRST and positional:
        return positional[0]
    return " ".join(args) if templates_to_args else ""
