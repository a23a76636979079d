"""Corpus loaders on the shared Wikipedia samples, the default gensim corpus, and the BM25 index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config.search import SearchConfig
from sandbox.search.bm25 import BM25Index
from sandbox.search.build_index import build_index, main
from sandbox.search.corpus import load_corpus, split_passages
from tests.search.conftest import HOTPOT_PARAGRAPHS, write_params

KILT_SAMPLE = "wiki_corpus_samples/filtered_kilt_sample_100.jsonl"


def test_split_passages() -> None:
    text = "one two three\n\nfour five six seven\neight"
    assert split_passages(text, 3) == ["one two three", "four five six", "seven eight"]
    assert split_passages("", 3) == []


def test_kilt_loader(shared_data: Path) -> None:
    passages = load_corpus(shared_data / KILT_SAMPLE, "kilt", passage_words=100)
    assert len(passages) > 5000 and len({p.id for p in passages}) == len(passages)
    assert passages[0].title == "A" and "first letter" in passages[0].text
    assert not any(p.text.startswith("Section::::") for p in passages)


def test_jsonl_loader(shared_data: Path) -> None:
    passages = load_corpus(shared_data / HOTPOT_PARAGRAPHS, "jsonl", passage_words=10_000)
    assert len(passages) == 1000 and passages[0].title == "Constantin Medien" and passages[0].id == "0"


def test_wiki18_loader(tmp_path: Path) -> None:
    path = tmp_path / "wiki18.jsonl"
    path.write_text(json.dumps({"id": "42", "contents": '"Albedo"\nAlbedo is the  fraction of light.'}) + "\n")
    [passage] = load_corpus(path, "wiki18")
    assert (passage.id, passage.title, passage.text) == ("42", "Albedo", "Albedo is the fraction of light.")


@pytest.mark.parametrize(("line", "message"), [
    ("not json", "bad.jsonl:2: not valid JSON"),
    ('{"title": "T"}', "bad.jsonl:2: missing key 'text'"),
    ('{"title": "T", "text": 5}', "bad.jsonl:2: 'text' must be str"),
])
def test_bad_rows_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"title": "ok", "text": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        load_corpus(path, "jsonl")


def test_missing_corpus_and_wrong_default_format(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_corpus(tmp_path / "nope.jsonl", "jsonl")
    with pytest.raises(ValueError, match="corpus_format must be 'wikidump'"):
        load_corpus("", "kilt")


def test_default_index_is_gensim_wikipedia(default_index: Path) -> None:
    manifest = json.loads((default_index / "manifest.json").read_text())
    assert manifest["corpus"].startswith("enwiki-latest-pages-articles1") and manifest["n_passages"] > 1000
    index = BM25Index.load(default_index)
    top = index.search("albedo diffuse reflection of sunlight", 3)
    assert [p.title for p in top] == ["Albedo"] * 3 and top[0].score >= top[1].score >= top[2].score > 0
    assert index.search("zzzxqv", 3) == []  # no known word, no results


def test_build_index_cli_and_rebuild(hotpot_index: Path, shared_data: Path, tmp_path: Path) -> None:
    params = write_params(tmp_path / "params.yaml", corpus_path=str(shared_data / HOTPOT_PARAGRAPHS),
                          corpus_format="jsonl", passage_words=2000, index_dir=str(tmp_path / "index"))
    main(["--params", str(params)])
    main(["--params", str(params)])  # rebuilding replaces the index in place
    index = BM25Index.load(tmp_path / "index")
    assert len(index.passages) == 1000 and not (tmp_path / "index.building").exists()
    assert index.search("Ismaning media group", 1)[0].title == "Constantin Medien"


def test_build_index_reports(tmp_path: Path) -> None:
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "title": f"T{i}", "text": f"word{i} shared"}) + "\n"
                            for i in range(5)))
    report = build_index(SearchConfig(corpus_path=str(path), corpus_format="jsonl", index_dir=str(tmp_path / "ix")))
    assert report.n_passages == 5 and report.index_dir == tmp_path / "ix" and report.seconds > 0


def test_missing_index_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="build_index"):
        BM25Index.load(tmp_path / "none")
