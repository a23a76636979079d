"""Models side by side: tool-choice rates, the paired flips and their sign test, the comparison file and table."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import binomtest

from pipeline.evaluation.flips import paired_flips, sign_test_p
from pipeline.evaluation.report import COMPARE_FILE, TABLE_FILE, write_reports
from pipeline.evaluation.results import RunResult
from pipeline.evaluation.summary import summarise


def record(benchmark: str, pid: str, correct: bool, verifier: str, tools: list[str]) -> dict:
    return {"benchmark": benchmark, "id": pid, "sample": 0, "score": 1.0 if correct else 0.0, "verifier": verifier,
            "format_ok": True, "policy_tokens": 10, "tool_calls": [{"tool": t, "ok": True} for t in tools]}


@given(up=st.integers(0, 40), down=st.integers(0, 40))
def test_the_sign_test_is_the_exact_two_sided_binomial_test(up: int, down: int) -> None:
    expected = 1.0 if up + down == 0 else binomtest(up, up + down, 0.5).pvalue
    assert abs(sign_test_p(up, down) - expected) < 1e-12 and sign_test_p(up, down) == sign_test_p(down, up)


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=60))
def test_flips_count_each_problem_that_changed_side(pairs: list[tuple[bool, bool]]) -> None:
    before = [record("b", f"p{i}", a, "fact", []) for i, (a, _) in enumerate(pairs)]
    after = [record("b", f"p{i}", b, "fact", []) for i, (_, b) in enumerate(pairs)] + [record("b", "extra", True, "fact", [])]
    flips = paired_flips(before, after, ("sft", "rl"))
    assert flips.problems == len(pairs)  # only problems both scored
    assert flips.to_right == sum(b and not a for a, b in pairs) and flips.to_wrong == sum(a and not b for a, b in pairs)
    gain = sum(b for _, b in pairs) - sum(a for a, _ in pairs)
    assert flips.to_right - flips.to_wrong == gain


def test_right_tool_is_judged_on_the_first_call_by_the_problems_verifier() -> None:
    records = [record("calculator", "c1", True, "calculator", ["code"]), record("calculator", "c2", False, "calculator",
               ["search", "code"]), record("wiki_facts", "f1", True, "fact", ["search"]),
               record("wiki_facts", "f2", False, "fact", [])]
    m = summarise(records)
    assert m["calculator/right_tool"] == 0.5 and m["wiki_facts/right_tool"] == 0.5 and m["all/right_tool"] == 0.5
    assert m["calculator/tool_use"] == 1.0 and m["wiki_facts/tool_use"] == 0.5


def run_of(label: str, outcomes: list[bool], tool: str) -> RunResult:
    records = [record("calculator", f"c{i}", ok, "calculator", [tool]) for i, ok in enumerate(outcomes)]
    records += [record("wiki_facts", f"f{i}", ok, "fact", ["search"]) for i, ok in enumerate(outcomes)]
    return RunResult(label, f"models/{label}", "tools", {"wiki_facts": "fact", "calculator": "math"}, summarise(records),
                     records)


def test_the_report_puts_every_model_in_a_row_and_compares_the_last_two(tmp_path: Path) -> None:
    base, sft, rl = (run_of("base", [False] * 4, "search"), run_of("sft", [True, False, False, False], "code"),
                     run_of("rl", [True, True, True, False], "code"))
    write_reports(tmp_path, rl, [base, sft], plots=True)
    table = (tmp_path / TABLE_FILE).read_text()
    assert all(f"| {label} |" in table for label in ("base", "sft", "rl"))
    assert "Fact-reasoning: wiki_facts" in table and "Math: calculator" in table
    compared = json.loads((tmp_path / COMPARE_FILE).read_text())
    assert compared["order"] == ["base", "sft", "rl"] and set(compared["models"]) == {"base", "sft", "rl"}
    assert compared["models"]["rl"]["all"]["accuracy"] == 0.75 and compared["models"]["base"]["calculator"]["right_tool"] == 0
    assert compared["flips"] | {"sign_test_p": 0} == {"before": "sft", "after": "rl", "problems": 8, "to_right": 4,
                                                       "to_wrong": 0, "sign_test_p": 0}
    assert "4 wrong -> right, 0 right -> wrong" in table
    assert (tmp_path / "eval_plots" / "accuracy.png").stat().st_size > 1000
