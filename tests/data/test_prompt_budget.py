"""Curation refuses a row whose prompt overruns the rollout's token budget, with its file and line,
exactly as training's load-time check would: a kept row is never refused when training loads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flows.common import tools_needed
from flows.curate import prompt_budget
from pipeline.config.curate import CurateConfig, SourceConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.data.broken import BrokenDependency
from pipeline.data.curate import NO_BUDGET, run
from pipeline.rollout.engine import encode_prompt
from pipeline.protocols import protocol_for
from pipeline.rollout.offered import tools_for
from pipeline.rollout.prompt_budget import PromptBudget
from pipeline.sampling.training_problems import BadProblems, check_prompt_budget, read_training_problems
from pipeline.types import Problem
from tests.helpers.tiny import tiny_tokenizer

TOKENIZER = tiny_tokenizer()
ALL_TOOLS = ("code", "search")
WORDS = ["capital", "of", "Australia", "1234", "*", "5678", "zq", "xylophone", "fox", "\u00e9t\u00e9", "\u6771\u4eac"]


def empty_prompt_tokens(kind: str, protocol: str = "tapo") -> int:
    blank = Problem("x", "", ("1",), kind, "qa", "train")
    return len(encode_prompt(TOKENIZER, protocol_for(protocol), blank, tools_for(blank, ALL_TOOLS)))


def write_rows(path: Path, questions: list[str]) -> None:
    path.write_text("".join(json.dumps({"question": q, "answer": "42"}) + "\n" for q in questions), encoding="utf-8")


def curate(tmp_path: Path, questions: list[str], kind: str, rollout: RolloutConfig | None) -> tuple[dict, list[dict]]:
    write_rows(tmp_path / "rows.jsonl", questions)
    src = SourceConfig(name="qa", path=str(tmp_path / "rows.jsonl"), adapter="hotpotqa", type=kind, split="train")
    cfg = CurateConfig(calculator={"n_train": 0, "n_test": 0}, sources=(src,), output_dir=str(tmp_path / "out"),
                       filters={"exact_duplicates": False, "near_duplicate_threshold": 0.0, "contamination_ngram": 0})
    budget = PromptBudget(TOKENIZER, rollout, ALL_TOOLS) if rollout else None
    report = run(cfg, prompt_budget=budget).to_dict()
    rejected = [json.loads(line) for line in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    return report, rejected


def test_an_over_long_question_is_rejected_naming_its_file_and_line_and_the_rest_are_kept(tmp_path: Path) -> None:
    room = empty_prompt_tokens("fact") + 40
    rollout = RolloutConfig(max_policy_tokens=48, max_total_tokens=room + 48)
    questions = ["Who wrote Hamlet?", " ".join(["xylophone zq"] * 60), "What is the capital of Australia?"]
    report, rejected = curate(tmp_path, questions, "fact", rollout)
    assert report["n_train"] == 2 and report["per_filter"]["too_long"] == 1
    assert report["prompt_budget"].startswith(f"checked: prompts of at most {room} tokens")
    [row] = rejected
    assert (row["file"], row["line"], row["filter"], row["source"]) == (str(tmp_path / "rows.jsonl"), 2, "too_long", "qa")
    assert f"leaves {room}" in row["reason"] and "rollout.max_policy_tokens 48" in row["reason"]
    kept = [q for _, p in read_training_problems(tmp_path / "out" / "train.jsonl") for q in [p.question]]
    assert kept == [questions[0], questions[2]]


def test_without_a_tokenizer_curation_keeps_todays_filters_and_says_so(tmp_path: Path) -> None:
    report, rejected = curate(tmp_path, ["Who wrote Hamlet?", " ".join(["xylophone zq"] * 60)], "fact", None)
    assert report["n_train"] == 2 and rejected == [] and report["prompt_budget"] == NO_BUDGET
    assert prompt_budget(str(tmp_path / "no-model"), RolloutConfig()) is None


def test_the_flow_reads_the_prepared_models_tokenizer(tmp_path: Path) -> None:
    TOKENIZER.save_pretrained(tmp_path / "base")
    budget = prompt_budget(str(tmp_path / "base"), RolloutConfig(max_policy_tokens=8, max_total_tokens=64))
    assert budget is not None and budget.room == 56 and set(budget.tools) == set(ALL_TOOLS)
    problem = Problem("x", "Who wrote Hamlet?", ("1",), "fact", "qa", "train")
    protocol = protocol_for("tapo")
    assert encode_prompt(budget.tokenizer, protocol, problem, ("search",)) == encode_prompt(
        TOKENIZER, protocol, problem, ("search",))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["fact", "math", "complex", "code", "multihop"]),
       protocol=st.sampled_from(["tapo", "tapo-no-think", "torl", "search-r1"]),
       lengths=st.lists(st.integers(1, 120), min_size=1, max_size=6), slack=st.integers(0, 60),
       seed=st.integers(0, 10**6))
def test_a_row_curation_keeps_is_never_refused_at_load(tmp_path_factory, kind, protocol, lengths, slack, seed) -> None:
    """And a row it refuses is one the load-time check refuses too (the same encoding, both ways)."""
    tmp_path = tmp_path_factory.mktemp("budget")
    questions = [" ".join(WORDS[(seed + i * 7 + j) % len(WORDS)] for j in range(n)) + f" #{i}"
                 for i, n in enumerate(lengths)]
    room = empty_prompt_tokens(kind, protocol) + slack
    rollout = RolloutConfig(protocol=protocol, max_policy_tokens=16, max_total_tokens=room + 16)
    try:
        report, rejected = curate(tmp_path, questions, kind, rollout)
    except BrokenDependency as err:  # every row too long: the stage fails naming the filter, writes nothing
        assert "filter 'too_long'" in str(err) and not (tmp_path / "out").exists()
        report, rejected = {"n_train": 0}, [{"filter": "too_long", "question": q} for q in questions]
    train = tmp_path / "out" / "train.jsonl"
    if report["n_train"]:
        check_prompt_budget(train, read_training_problems(train), TOKENIZER, rollout, tools_needed(train))
    assert {r["filter"] for r in rejected} <= {"too_long"}
    for r in rejected:
        refused = Problem("r", r["question"], ("42",), kind, "qa", "train")
        with pytest.raises(BadProblems, match="leaves"):
            check_prompt_budget("r.jsonl", [(1, refused)], TOKENIZER, rollout, tools_needed_for(kind))


def tools_needed_for(kind: str) -> tuple[str, ...]:
    return tools_for(Problem("x", "", ("1",), kind, "qa", "train"), ALL_TOOLS)
