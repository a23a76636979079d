"""Corpus loaders: every format becomes a stream of `Passage(id, title, text)`.

Formats (`search.corpus_format`):
- `jsonl`: one `{"id", "title", "text"}` object a line (our own format; also the HotpotQA
  distractor paragraphs file);
- `kilt`: KILT knowledge-source pages, `{"wikipedia_id"?, "wikipedia_title", "text": [paragraphs]}`;
  the first paragraph repeats the title and is skipped, "Section::::" headings are dropped;
- `wiki18`: Search-R1 / DPR wiki-18 JSONL, `{"id", "contents": "\"Title\"\\ntext"}`;
- `wikidump`: a MediaWiki XML dump (`.xml` or `.xml.bz2`), articles only, markup stripped with
  gensim's `filter_wiki`, redirects skipped. With an empty path this reads the default corpus: the
  real dump excerpt shipped in the gensim wheel's test data (106 articles), pinned by the gensim
  version in pyproject.toml.

Long texts are cut into passages of about `passage_words` words at paragraph boundaries (wiki-18
uses 100-word passages). Bad rows raise ValueError naming the file and line.
"""

from __future__ import annotations

import bz2
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, TypeVar

from pipeline.jsonl import iter_json_lines
from pipeline.paths import embedded_wiki_dump
from sandbox.search.results import Passage

CorpusFormat = Literal["jsonl", "kilt", "wiki18", "wikidump"]

_WIKI_EMPHASIS = re.compile(r"'{2,}")
_WIKI_HEADING = re.compile(r"^=+\s*(.*?)\s*=+$", re.MULTILINE)


class CorpusError(ValueError):
    """A corpus file that is not what its format says (the message names the file)."""


def split_passages(text: str, passage_words: int) -> list[str]:
    """Greedy packing of paragraphs into ~passage_words-word passages; long paragraphs are cut by words."""
    passages: list[str] = []
    current: list[str] = []
    for paragraph in (p.strip() for p in text.split("\n")):
        words = paragraph.split()
        while words:
            room = passage_words - len(current)
            current.extend(words[:room])
            words = words[room:]
            if len(current) >= passage_words:
                passages.append(" ".join(current))
                current = []
    if current:
        passages.append(" ".join(current))
    return passages


_T = TypeVar("_T")


def _require(row: dict, key: str, kind: type[_T], where: str) -> _T:
    if key not in row:
        raise ValueError(f"{where}: missing key {key!r}")
    if not isinstance(row[key], kind):
        raise ValueError(f"{where}: {key!r} must be {kind.__name__}")
    return row[key]


def load_jsonl(path: Path, passage_words: int) -> Iterator[Passage]:
    for line_no, row in iter_json_lines(path):
        where = f"{path}:{line_no}"
        title = str(_require(row, "title", str, where))
        text = str(_require(row, "text", str, where))
        base = str(row.get("id", line_no))
        for i, chunk in enumerate(split_passages(text, passage_words)):
            yield Passage(id=base if i == 0 else f"{base}-{i}", title=title, text=chunk)


def load_kilt(path: Path, passage_words: int) -> Iterator[Passage]:
    for line_no, row in iter_json_lines(path):
        where = f"{path}:{line_no}"
        title = str(_require(row, "wikipedia_title", str, where))
        paragraphs = _require(row, "text", list, where)
        page_id = str(row.get("wikipedia_id", line_no))
        n = 0
        for paragraph in paragraphs[1:]:  # paragraph 0 is the title
            if not isinstance(paragraph, str) or paragraph.startswith("Section::::") or not paragraph.strip():
                continue
            for chunk in split_passages(paragraph, passage_words):
                yield Passage(id=f"{page_id}-{n}", title=title, text=chunk)
                n += 1


def load_wiki18(path: Path, passage_words: int) -> Iterator[Passage]:
    for line_no, row in iter_json_lines(path):
        where = f"{path}:{line_no}"
        contents = str(_require(row, "contents", str, where))
        first, _, text = contents.partition("\n")
        title = first.strip().strip('"')
        yield Passage(id=str(row.get("id", line_no)), title=title, text=" ".join(text.split()))


def _clean_wikitext(text: str) -> str:
    from gensim.corpora.wikicorpus import filter_wiki  # heavy import (scipy); only the dump format needs it

    text = _WIKI_HEADING.sub(r"\1", filter_wiki(text))
    return _WIKI_EMPHASIS.sub("", text)


def load_wikidump(path: Path, passage_words: int) -> Iterator[Passage]:
    from gensim.corpora.wikicorpus import extract_pages

    opener = bz2.open if path.suffix == ".bz2" else open
    with opener(path, "rb") as handle:
        for title, wikitext, page_id in extract_pages(handle):
            if not wikitext or wikitext.lstrip().lower().startswith("#redirect"):
                continue
            for i, chunk in enumerate(split_passages(_clean_wikitext(wikitext), passage_words)):
                yield Passage(id=f"{page_id}-{i}", title=title, text=chunk)


LOADERS = {"jsonl": load_jsonl, "kilt": load_kilt, "wiki18": load_wiki18, "wikidump": load_wikidump}


def load_corpus(path: str | Path, corpus_format: CorpusFormat, passage_words: int = 100) -> list[Passage]:
    """All passages of a corpus; an empty path means the default gensim Wikipedia excerpt."""
    if not str(path):
        if corpus_format != "wikidump":
            raise ValueError(f"an empty corpus path means the default Wikipedia dump; corpus_format must be "
                             f"'wikidump', got {corpus_format!r}")
        path = embedded_wiki_dump()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: corpus file not found")
    if path.suffix == ".bz2" and corpus_format == "wikidump":
        with path.open("rb") as fh:
            magic = fh.read(3)
        if magic != b"BZh":
            raise CorpusError(f"{path}: not a bz2 file (starts with {magic!r}, bz2 starts with b'BZh'); "
                              "decompress it or give the file its real extension")
    try:
        passages = list(LOADERS[corpus_format](path, passage_words))
    except EOFError as err:  # bz2 and gzip say so when the stream stops before its end marker
        raise CorpusError(f"{path}: truncated {corpus_format} corpus ({err})") from None
    except (OSError, SyntaxError) as err:  # a corrupt bz2 stream; XML that does not parse (ParseError)
        raise CorpusError(f"{path}: not a readable {corpus_format} corpus: {err}") from None
    if not passages:
        raise ValueError(f"{path}: no passages in this {corpus_format} corpus")
    return passages
