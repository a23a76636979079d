"""Time-ambiguity rules, invalid answers, duplicates and n-gram contamination."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config.curate import CurateConfig, FilterConfig, SourceConfig
from pipeline.data.curate import run
from pipeline.data.dedupe import Deduper, NgramIndex, normalize
from pipeline.data.filters import invalid_answer, rule_rejection, time_ambiguity
from pipeline.types import Problem


@pytest.mark.parametrize(("question", "cue"), [
    ("What is the GDP of France this year?", "this-period"),
    ("who is the current president of the united states?", "current"),
    ("who is the host of fantasy football now?", "now"),
    ("how many members are in the supreme court today?", "today"),
    ("what is the latest version of android?", "latest"),
    ("when was the last time arsenal won the premier league?", "last-time"),
    ("how many world series games has the boston red sox won?", "present-perfect-count"),
    ("who has scored the most goals so far in la liga?", "so-far"),
    ("when does the next episode of izombie air?", "next"),
])
def test_time_ambiguous_questions_are_caught(question: str, cue: str) -> None:
    assert time_ambiguity(question) == cue


@pytest.mark.parametrize("question", [
    "who was the president of the united states in 1990?",
    "who won the latest world cup as of 2018?",  # an explicit year anchors it
    "Which film was released more recently, Blind Shaft or The Mask Of Fu Manchu?",
    "Where was The Running Jumping & Standing Still Film made?",  # a title, not a time cue
    "Fulton County serves what city ranked third on the USA TODAY list?",
    "What was the last year of the Governor post of Lagos?",
    "How many books were said to have been written by Plato?",
    "when was the last time anyone was on the moon in 1972?",
])
def test_time_rules_leave_anchored_or_unrelated_questions(question: str) -> None:
    assert time_ambiguity(question) is None


def _p(question: str, answers: tuple[str, ...], ptype: str = "math", split: str = "train", source: str = "s") -> Problem:
    return Problem(id=f"{source}-{abs(hash((question, split))) % 10**8}", question=question, answers=answers,
                   type=ptype, source=source, split=split)  # type: ignore[arg-type]


def test_invalid_answers() -> None:
    assert invalid_answer(_p("q", ("\\frac{1}{2",))) is not None
    assert invalid_answer(_p("q", ("$$",))) is not None
    assert invalid_answer(_p("q", ("x$ and $y",))) is not None
    assert invalid_answer(_p("q", ("\\$36",))) is None  # an escaped dollar is fine
    assert invalid_answer(_p("q", ("\\left( 3, \\frac{\\pi}{2} \\right)",))) is None
    assert invalid_answer(_p("q", ("\\left( 3",))) is not None
    assert invalid_answer(_p("q", ("\\aleph_0",))) is None
    assert invalid_answer(_p("q", ("12.5",), "calculator")) is None
    assert invalid_answer(_p("q", ("twelve",), "calculator")) is not None
    assert invalid_answer(_p("q", ("!!!",), "fact")) is not None
    assert rule_rejection(_p("who is the current king?", ("Charles",), "fact"), FilterConfig()) == (
        "time_ambiguous", "time cue 'current' and no explicit year")
    assert rule_rejection(_p("who is the current king?", ("Charles",), "math"), FilterConfig()) is None


def test_normalisation_keeps_signs_and_operators() -> None:
    assert normalize("What is  3+5?") == normalize("what is 3+5")
    assert normalize("Convert -32.9 F.") != normalize("Convert 32.9 F.")
    assert normalize("Evaluate 3+5.") != normalize("Evaluate 3-5.")


def test_deduper_exact_and_near_need_a_shared_answer() -> None:
    d = Deduper(near_threshold=0.8)
    long_q = ("A train leaves the station at noon travelling at a constant speed of sixty miles per hour towards "
              "a city that is three hundred miles away. At what time does it arrive?")
    assert d.check("a", long_q, ("5 pm",), near=True) is None
    assert d.check("b", long_q.upper(), ("5 pm",), near=True) == ("exact", "a")
    near = long_q.replace("does it arrive", "will it arrive")
    assert d.check("c", near, ("5 PM",), near=True) == ("near", "a")
    # Same wording with a different answer is a different problem (a changed number or year).
    variant = long_q.replace("sixty", "seventy")
    assert d.check("d", variant, ("4:17 pm",), near=True) is None
    d2 = Deduper(near_threshold=0.8)
    d2.check("a", long_q, ("5 pm",), near=True)
    assert d2.check("d", variant, ("5 pm",), near=True) == ("near", "a")  # same text, shared answer: caught
    assert d.check("e", "Unrelated question about cats?", ("x",), near=True) is None


def test_ngram_index_finds_shared_13_grams_only() -> None:
    index = NgramIndex(13)
    index.add("t1", "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.")
    hit = index.overlap("Yesterday natalia sold clips to 48 of her friends in April and then she sold half as many apples")
    assert hit is not None and hit[0] == "t1"
    assert index.overlap("Natalia sold clips to 48 of her friends in June and then bought more.") is None


def _write(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows))
    return path


def test_curate_drops_train_copies_of_test_rows_and_records_why(tmp_path: Path) -> None:
    shared_q = ("Tom has twelve apples and gives a third of them to each of his two sisters, keeping the rest "
                "for himself. How many apples does Tom keep?")
    test_file = _write(tmp_path / "eval.jsonl", [(shared_q, "4"), ("who is the current pope?", "Leo XIV")])
    train_file = _write(tmp_path / "train.jsonl", [
        (shared_q.lower(), "4"),  # exact duplicate (after normalisation) of a test row
        ("Yesterday Tom has twelve apples and gives a third of them to each of his two sisters, on Monday.", "8"),
        ("What is 2 + 2?", "4"),
        ("What is 2 + 2?", "4"),
    ])
    cfg = CurateConfig(
        calculator={"n_train": 5, "n_test": 2},
        sources=(SourceConfig(name="train", path=str(train_file), adapter="hotpotqa", type="math", split="train"),
                 SourceConfig(name="eval", path=str(test_file), adapter="hotpotqa", type="fact", split="test")),
        output_dir=str(tmp_path / "out"),
    )
    report = run(cfg)
    rejected = {(r["source"], r["line"]): r for r in
                (json.loads(x) for x in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines())}
    assert rejected[("train", 1)]["filter"] == "duplicate" and "in split test" in rejected[("train", 1)]["reason"]
    assert rejected[("train", 2)]["filter"] == "contamination"
    assert rejected[("train", 4)]["filter"] == "duplicate"
    assert rejected[("eval", 2)]["filter"] == "time_ambiguous"
    assert (report.n_train, report.n_test) == (5 + 1, 2 + 1)
    assert report.per_source["train"] == {"read": 4, "train": 1, "test": 0, "rejected": 3,
                                          "rejected:duplicate": 2, "rejected:contamination": 1}
    assert report.per_filter["duplicate"] == 2 and report.per_filter["time_ambiguous"] == 1
