"""Every adapter on the real benchmark files, and every file format, end to end to `Problem`s."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config.curate import SourceConfig
from pipeline.data.sources import Rejection, holdout_split, load_source
from pipeline.types import Problem

# (file under shared data, adapter, type, expected rows, index, expected question start, expected answers)
CASES = [
    ("gsm8k/test.jsonl", "gsm8k", "math", 1319, 0, "Janet’s ducks lay 16 eggs", ("18",)),
    ("math500/test.jsonl", "math", "math", 500, 0, "Convert the point $(0,3)$", ("\\left( 3, \\frac{\\pi}{2} \\right)",)),
    ("math/test.jsonl", "math", "math", 5000, 0, "How many vertical asymptotes", ("2",)),
    ("aime24/test.jsonl", "aime", "math", 30, 0, "Every morning Aya goes", ("204",)),
    ("aime25/test.jsonl", "aime", "math", 30, 0, "Find the sum of all integer bases", ("70",)),
    ("amc23/test.jsonl", "amc", "math", 40, 0, "Cities $A$ and $B$ are $45$ miles apart", ("27",)),
    ("olympiadbench/test.jsonl", "olympiadbench", "math", 675, 0, "Xenia and Sergey play", ("2",)),
    ("deepmath_103k_subset/math_deepmath_deal.jsonl", "deepmath", "math", 4994, 0, "Find the least nonnegative residue", ("1",)),
    ("torl_test/test.parquet", "verl", "math", 374, 0, "Every morning Aya goes", ("204",)),
    ("nq_open/NQ-open.dev.jsonl", "nq_open", "fact", 3610, 0, "when was the last time anyone was on the moon?",
     ("14 December 1972 UTC", "December 1972")),
    ("triviaqa/test.jsonl", "triviaqa", "fact", 1000, 0, 'Who wrote "A cauliflower is nothing but', None),
    ("popqa/test.jsonl", "popqa", "fact", 1000, 0, "Who was the composer of Easy Living?", ("Ralph Rainger", "Ralph Reichenthal")),
    ("hotpotqa/dev.json", "hotpotqa", "multihop", 7405, 0, "Were Scott Derrickson and Ed Wood", ("yes",)),
    ("hotpotqa/hotpotqa_500.jsonl", "hotpotqa", "multihop", 500, 0, "In the 1973 NFL season", ("Kauffman Stadium",)),
    ("2wikimultihopqa/2wikimultihop_test_questions_and_answers.json", "2wikimultihopqa", "multihop", 12576, 0,
     "Who is the mother of the director of film Polish-Russian War", ("Małgorzata Braunek",)),
    ("musique/musique_500.jsonl", "musique", "multihop", 500, 0, "What was the director of Addicted to Love", None),
    ("bamboogle/test.csv", "bamboogle", "multihop", 125, 0, "Who was president of the United States in the year that Citibank",
     ("james madison",)),
    ("bamboogle/test.jsonl", "bamboogle", "multihop", 125, 0, "Who was president of the United States", ("james madison",)),
]


def _load(shared: Path, rel: str, adapter: str, ptype: str, **extra: object) -> tuple[list[Problem], list[Rejection]]:
    cfg = SourceConfig(name="src", path=str(shared / rel), adapter=adapter, type=ptype, split="test", **extra)
    items = list(load_source(cfg, seed=0, test_fraction=0.1))
    return [i for i in items if isinstance(i, Problem)], [i for i in items if isinstance(i, Rejection)]


@pytest.mark.parametrize(("rel", "adapter", "ptype", "rows", "index", "question", "answers"), CASES,
                         ids=[c[0] for c in CASES])
def test_adapter_reads_real_file(shared_data: Path, rel: str, adapter: str, ptype: str, rows: int, index: int,
                                 question: str, answers: tuple[str, ...] | None) -> None:
    problems, rejected = _load(shared_data, rel, adapter, ptype)
    assert len(problems) + len(rejected) == rows
    assert len(rejected) <= rows * 0.01, [r.reason for r in rejected[:5]]
    p = problems[index]
    assert p.question.startswith(question), p.question[:120]
    if answers is not None:
        assert p.answers == answers
    assert p.type == ptype and p.source == "src" and p.split == "test"
    assert p.meta["file"].endswith(rel) and p.meta["line"] >= 1
    assert all(a.strip() for q in problems for a in q.answers)
    assert len({q.id for q in problems}) == len({q.question for q in problems})


def test_math_answer_falls_back_to_last_boxed(shared_data: Path) -> None:
    problems, _ = _load(shared_data, "math/test.jsonl", "math", "math", limit=50)
    assert problems[0].answers == ("2",)  # MATH has no answer field: this comes from \boxed{2}
    assert all("\\boxed" not in a for p in problems for a in p.answers)


def test_limit_and_line_numbers(shared_data: Path) -> None:
    problems, _ = _load(shared_data, "gsm8k/train.jsonl", "gsm8k", "math", limit=7)
    assert [p.meta["line"] for p in problems] == list(range(1, 8))
    csv_rows, _ = _load(shared_data, "bamboogle/test.csv", "bamboogle", "multihop", limit=3)
    assert [p.meta["line"] for p in csv_rows] == [2, 3, 4]  # line 1 is the header


def test_holdout_split_is_seeded_stable_and_near_the_fraction(shared_data: Path) -> None:
    cfg = SourceConfig(name="nq", path=str(shared_data / "nq_open/NQ-open.dev.jsonl"), adapter="nq_open",
                       type="fact", split="holdout")
    splits = {p.id: p.split for p in load_source(cfg, seed=0, test_fraction=0.2) if isinstance(p, Problem)}
    assert 0.17 < sum(s == "test" for s in splits.values()) / len(splits) < 0.23
    limited = {p.id: p.split for p in load_source(cfg.model_copy(update={"limit": 100}), 0, 0.2) if isinstance(p, Problem)}
    assert all(splits[i] == s for i, s in limited.items())  # a row's split does not depend on the others
    assert holdout_split(1, "nq-x", 0.5) == holdout_split(1, "nq-x", 0.5)
    other_seed = {p.id: p.split for p in load_source(cfg, seed=1, test_fraction=0.2) if isinstance(p, Problem)}
    assert other_seed != splits


def test_hub_source_reads_through_datasets(tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub id goes through `datasets.load_dataset`; a local dataset folder exercises it offline."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    folder = tmp_path / "tiny_hub_dataset"
    folder.mkdir()
    lines = (shared_data / "gsm8k/test.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / "test.jsonl").write_text("".join(lines[:10]), encoding="utf-8")
    cfg = SourceConfig(name="gsm8k-hub", hub_id=str(folder), hub_split="test", adapter="gsm8k", type="math", split="test",
                       limit=5)
    problems = [p for p in load_source(cfg, 0, 0.1) if isinstance(p, Problem)]
    assert len(problems) == 5 and problems[0].answers == ("18",)
    assert problems[0].meta["file"].startswith("hub:")


def test_verl_adapter_reads_tapo_release_rows() -> None:
    from pipeline.data.adapters import RowError, verl

    tapo_row = {"question": "Who wrote Hamlet?", "data_source": "nq", "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare", "William Shakespeare"]}}}
    assert verl(tapo_row) == ("Who wrote Hamlet?", ["Shakespeare", "William Shakespeare"], {"data_source": "nq"})
    chat_row = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
                "reward_model": {"ground_truth": "$4$"}}
    assert verl(chat_row)[:2] == ("2+2?", ["4"])
    with pytest.raises(RowError, match="reward_model"):
        verl({"question": "q?"})
    with pytest.raises(RowError, match="chat messages"):
        verl({"prompt": "just text", "reward_model": {"ground_truth": "1"}})
