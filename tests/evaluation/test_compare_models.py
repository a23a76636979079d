"""Models side by side: tool-choice rates, the paired flips and their sign test, the comparison file and table."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import binomtest

from pipeline.evaluation.flips import paired_flips, sign_test_p
from pipeline.evaluation.report import COMPARE_FILE, TABLE_FILE, headline, markdown_report, write_reports
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
    rows = {cells[0]: cells for cells in table_rows(table)}
    assert {"base", "sft", "rl"} <= rows.keys()
    assert "Fact-reasoning: wiki_facts" in table and "Math: calculator" in table
    compared = json.loads((tmp_path / COMPARE_FILE).read_text())
    assert compared["order"] == ["base", "sft", "rl"] and set(compared["models"]) == {"base", "sft", "rl"}
    assert compared["models"]["rl"]["all"]["accuracy"] == 0.75 and compared["models"]["base"]["calculator"]["right_tool"] == 0
    assert compared["flips"] | {"sign_test_p": 0} == {"before": "sft", "after": "rl", "problems": 8, "to_right": 4,
                                                       "to_wrong": 0, "sign_test_p": 0}
    assert table.rstrip().splitlines()[-1].startswith("Flips sft -> rl on the 8 problems both evaluated: 4 wrong -> "
                                                      "right, 0 right -> wrong (two-sided sign test p = 0.125)")
    assert (tmp_path / "eval_plots" / "accuracy.png").stat().st_size > 1000


def table_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row in `text` (header and body, not the rule)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and not line.startswith("|-")]


def sized_run(label: str, facts: list[bool], sums: list[bool], format_ok: bool = True,
              response: str = "") -> RunResult:
    records = [record("wiki_facts", f"f{i}", ok, "fact", ["search"]) for i, ok in enumerate(facts)]
    records += [record("calculator", f"c{i}", ok, "calculator", ["code"]) for i, ok in enumerate(sums)]
    for r in records:
        r.update(format_ok=format_ok, response=response, gold=["Paris"] if r["benchmark"] == "wiki_facts" else ["42"])
    return RunResult(label, f"models/{label}", "tools", {"wiki_facts": "fact", "calculator": "math"},
                     summarise(records), records)


def test_the_table_names_its_averages_and_shows_format_errors() -> None:
    """Benchmarks of different sizes: the pooled (micro) accuracy differs from the mean of the benchmarks (macro);
    the table says which is which, and the micro one is the headline's and the logs'."""
    rl = sized_run("rl", [True] * 3 + [False], [True] + [False] * 11)  # 3/4 facts, 1/12 sums: micro 4/16, macro 41.7
    rows = table_rows(markdown_report([rl]))
    head, body = rows[0], rows[1]
    assert head[-3:] == ["Macro avg.", "All (micro)", "Format errors"]
    assert body[-3:] == ["41.7", "25.0", "0.0"]
    assert headline([rl], {})["accuracy"] == rl.value("all", "accuracy") == 0.25


def test_a_model_that_never_answers_in_the_protocol_is_named_under_the_table() -> None:
    base = sized_run("base", [False] * 4, [False] * 4, format_ok=False, response="The capital is Paris.")
    sft = sized_run("sft", [True] * 4, [False] * 4)
    report = markdown_report([base, sft])
    assert table_rows(report)[1][0] == "base" and table_rows(report)[1][-1] == "100.0"
    (note,) = [line for line in report.splitlines() if line.startswith("base: never answered")]
    assert "0.0 % is a format failure" in note and "(4 of its 8 responses contain a gold answer verbatim)" in note
    assert not any(line.startswith("sft: never") for line in report.splitlines())


def test_the_headline_names_each_baseline_by_its_folder_and_ends_on_the_flips() -> None:
    base, sft, rl = (sized_run("base", [False] * 4, [False] * 4), sized_run("sft", [True, False], [True, False]),
                     sized_run("rl", [True, True], [True, False]))
    base.source, sft.source = "metrics/eval/base", "metrics/eval/sft/"
    other = sized_run("other", [True, True], [True, True])
    other.source = "runs/evaluate/other"  # a compare dir that is no baseline: in the table, not the headline
    got = headline([base, sft, other, rl], {"base": "metrics/eval/base", "sft": "metrics/eval/sft"})
    assert got == {"accuracy": 0.75, "right_tool": 1.0, "acc_base": 0.0, "acc_sft": 0.5, "to_right": 0.0,
                   "to_wrong": 1.0, "p_value": 1.0}
    assert headline([rl], {"base": "metrics/eval/base"}) == {"accuracy": 0.75, "right_tool": 1.0}
