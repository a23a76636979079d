"""Bad input is refused up front, naming the file, the row and the key: training problems files (non-UTF-8,
empty, empty answer lists, questions whose prompt does not fit the rollout's token budget), curation sources
that hold no rows, and search corpora that are not what their format says (not bz2, truncated bz2, not XML).

The training cases go through `pipeline.train.run` with a model path that does not exist: a file refused
before the model loads never reaches it; the token budget is checked once the tokenizer is there, before
the first step.
"""

from __future__ import annotations

import bz2
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config.curate import CurateConfig, SourceConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.data.curate import run as curate
from pipeline.data.formats import SourceError
from pipeline.rollout.engine import encode_prompt
from pipeline.protocols import protocol_for
from pipeline.rollout.offered import tools_for
from sandbox.search.corpus import CorpusError, load_corpus
from pipeline.train import run
from pipeline.sampling.training_problems import BadProblems, check_prompt_budget
from pipeline.types import Problem
from tests.helpers.tiny import tiny_llama, tiny_tokenizer
from tests.train.toy_task import toy_config

GOOD = {"id": "p", "question": "What is 6 * 7?", "answers": ["42"], "type": "calculator", "source": "calculator",
        "split": "train"}
TOKENIZER = tiny_tokenizer()


def line(**changes: object) -> bytes:
    return json.dumps({**GOOD, **changes}).encode() + b"\n"


BAD_LINES = {
    "non-utf8": (b'{"id": "p", "question": "Caf\xe9?", "answers": ["x"], "type": "calculator", '
                 b'"source": "calculator", "split": "train"}\n', r"not UTF-8 \(byte 29 of the line"),
    "answers-empty-list": (line(answers=[]), "answers: empty list"),
    "answers-blank": (line(answers=["42", " "]), r"answers\[1\]: empty answer"),
    "question-blank": (line(question="  "), "question: empty"),
    "not-json": (b'{"id": "p", \n', "not valid JSON"),
    "answers-not-strings": (line(answers=[42]), "'answers' must be a string or a list of strings"),
    "missing-key": (json.dumps({k: v for k, v in GOOD.items() if k != "type"}).encode() + b"\n", "missing key"),
}


def train_with(tmp_path: Path, problems: Path, model_dir: Path | None = None) -> None:
    cfg = toy_config(tmp_path, model_dir or tmp_path / "no-model-here", train_file=str(problems))
    run(cfg, {}, metrics_dir=tmp_path / "metrics")


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(sorted(BAD_LINES)), before=st.integers(0, 5), after=st.integers(0, 3))
def test_a_bad_training_row_is_refused_before_the_model_loads_naming_file_and_line(
        tmp_path_factory: pytest.TempPathFactory, kind: str, before: int, after: int) -> None:
    tmp = tmp_path_factory.mktemp("bad")
    bad, needle = BAD_LINES[kind]
    path = tmp / "problems.jsonl"
    path.write_bytes(line() * before + bad + line() * after)
    with pytest.raises(BadProblems) as info:
        train_with(tmp, path)
    assert re.search(f"{re.escape(str(path))}:{before + 1}: .*{needle}", str(info.value)), str(info.value)


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"], ids=["empty", "blank-lines"])
def test_an_empty_training_file_is_refused_before_the_model_loads(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "problems.jsonl"
    path.write_bytes(content)
    with pytest.raises(BadProblems, match=re.escape(f"{path}: no training problems (the file is empty)")):
        train_with(tmp_path, path)


def test_a_question_longer_than_the_token_budget_is_refused_before_the_first_step(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    tiny_llama(len(TOKENIZER)).save_pretrained(model_dir)
    TOKENIZER.save_pretrained(model_dir)
    path = tmp_path / "problems.jsonl"
    path.write_bytes(line() + line(question="How many words are here? " + "word " * 3000) + line())
    with pytest.raises(BadProblems, match=re.escape(f"{path}:2: question: the prompt is ")) as info:
        train_with(tmp_path, path, model_dir)
    assert "rollout.max_total_tokens 1024 - rollout.max_policy_tokens 64 leaves 960" in str(info.value)
    assert not (tmp_path / "metrics" / "train_history.jsonl").exists() or \
        not (tmp_path / "metrics" / "train_history.jsonl").read_text()


@settings(max_examples=80, deadline=None)
@given(question=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
                        max_size=600),
       tools=st.sampled_from([(), ("code",), ("code", "search")]),
       max_total=st.integers(300, 900), kind=st.sampled_from(["calculator", "fact", "math"]))
def test_the_budget_check_refuses_exactly_the_prompts_that_do_not_fit(question: str, tools: tuple, max_total: int,
                                                                      kind: str) -> None:
    """Its shortcut (a question of fewer bytes than the room left is not encoded) never lets an overflow by."""
    cfg = RolloutConfig(max_policy_tokens=16, max_total_tokens=max_total)
    problem = Problem("p", question, ("1",), kind, kind, "train")
    n = len(encode_prompt(TOKENIZER, protocol_for(cfg.protocol), problem, tools_for(problem, tools)))
    if n > max_total - 16:
        with pytest.raises(BadProblems, match=f"train.jsonl:7: question: the prompt is {n} tokens"):
            check_prompt_budget("train.jsonl", [(7, problem)], TOKENIZER, cfg, tools)
    else:
        check_prompt_budget("train.jsonl", [(7, problem)], TOKENIZER, cfg, tools)


def test_an_empty_curation_source_is_refused_naming_it(tmp_path: Path) -> None:
    empty = tmp_path / "qa.jsonl"
    empty.write_text("")
    src = SourceConfig(name="qa", path=str(empty), adapter="hotpotqa", type="fact", split="train")
    cfg = CurateConfig(calculator={"n_train": 4, "n_test": 1}, sources=(src,), output_dir=str(tmp_path / "out"))
    with pytest.raises(SourceError, match=re.escape(f"source 'qa' ({empty}): no rows")):
        curate(cfg)


WIKI_XML = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">
{}
</mediawiki>
""".format("\n".join(
    f"<page><title>Article {i}</title><ns>0</ns><id>{i}</id><revision><text>Article {i} is about the number "
    f"{i} and the words around it, repeated. {'filler ' * 40}</text></revision></page>" for i in range(1, 40)))


def test_a_wikidump_corpus_loads_when_whole(tmp_path: Path) -> None:
    path = tmp_path / "wiki.xml.bz2"
    path.write_bytes(bz2.compress(WIKI_XML.encode()))
    assert len(load_corpus(path, "wikidump", 100)) == 39


@pytest.mark.parametrize("damage", ["not-bz2", "truncated-bz2", "not-xml"])
def test_a_corpus_that_is_not_what_its_format_says_is_refused_naming_the_file(tmp_path: Path, damage: str) -> None:
    whole = bz2.compress(WIKI_XML.encode())
    path, content = {
        "not-bz2": (tmp_path / "wiki.xml.bz2", WIKI_XML.encode()),
        "truncated-bz2": (tmp_path / "wiki.xml.bz2", whole[: len(whole) // 2]),
        "not-xml": (tmp_path / "wiki.xml", b"\x00\x01binary, not a dump <<<"),
    }[damage]
    path.write_bytes(content)
    with pytest.raises(CorpusError, match=re.escape(str(path))):
        load_corpus(path, "wikidump", 100)


def test_a_non_utf8_jsonl_corpus_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'{"title": "A", "text": "fine"}\n{"title": "B", "text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: not UTF-8")):
        load_corpus(path, "jsonl", 100)
