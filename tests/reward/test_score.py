"""score_trajectory: Eq. 7 + f_T + Eq. 9 + ToRL code penalty, routing, and the TEPO sparse term."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.config.reward import RewardConfig, TepoSparse
from pipeline.rl.tepo import NoTepo, sparse_term
from pipeline.protocols import protocol_for
from pipeline.reward import (
    RewardScorer,
    Verifier,
    overlong_penalty,
    route,
    score_trajectory,
    scorer_for,
    verify,
)
from pipeline.types import Group, Problem, ToolCall, ToolResult, Trajectory

CFG = RewardConfig()


def problem(answers: tuple[str, ...], type_: str = "math", source: str = "gsm8k") -> Problem:
    return Problem(id="p1", question="q", answers=answers, type=type_, source=source, split="train")  # type: ignore[arg-type]


def call(output: str, ok: bool = True, status: str = "ok", tool: str = "code") -> ToolCall:
    result = ToolResult(output=output, ok=ok, status=status, error=None if ok else output)
    return ToolCall(tool=tool, input="x", result=result, call_span=(0, 1), output_span=(1, 2))  # type: ignore[arg-type]


def trajectory(text: str, policy_tokens: int = 10, calls: tuple[ToolCall, ...] = (), tool_tokens: int = 0) -> Trajectory:
    mask = (1,) * policy_tokens + (0,) * tool_tokens
    return Trajectory(
        problem_id="p1", prompt_ids=(1,), response_ids=tuple(range(len(mask))), loss_mask=mask,
        logprobs=(0.0,) * len(mask), tool_calls=calls, finish_reason="answer", text=text, turns=1 + len(calls),
    )  # fmt: skip


def score(p: Problem, t: Trajectory, cfg: RewardConfig = CFG, protocol: str = "tapo", max_tokens: int = 100) -> tuple:
    r = score_trajectory(p, t, cfg, protocol=protocol_for(protocol), max_policy_tokens=max_tokens)
    return r.format_ok, r.accuracy, r.format, r.length, r.code_penalty, r.total, r.predicted


def test_correct_math_answer_in_another_form() -> None:
    t = trajectory("<think>half</think><answer>\\frac{1}{2}</answer>")
    assert score(problem(("0.5",)), t) == (True, 1.0, 0.0, 0.0, 0.0, 1.0, "\\frac{1}{2}")


def test_wrong_answer_scores_zero_not_minus_one() -> None:
    assert score(problem(("3",)), trajectory("<answer>4</answer>"))[5] == 0.0


def test_bad_format_scores_the_penalty() -> None:
    assert score(problem(("4",)), trajectory("I think <answer>4</answer> maybe")) == (False, 0.0, -1.0, 0.0, 0.0, -1.0, "4")


def test_model_written_tool_output_is_penalised_even_with_the_right_answer() -> None:
    t = trajectory("<code>print(2+2)</code><response>4</response><answer>4</answer>")
    assert score(problem(("4",)), t)[:3] == (False, 0.0, -1.0)


def test_fact_question_gets_partial_credit_roentgen() -> None:
    p = problem(("Wilhelm Conrad Röntgen",), type_="fact", source="nq")
    result = score_trajectory(p, trajectory("<answer>Wilhelm Röntgen</answer>"), CFG, protocol=protocol_for("tapo"), max_policy_tokens=100)
    assert result.accuracy == pytest.approx(1 - 7 / 22)
    assert result.total == pytest.approx(1 - 7 / 22)


def test_answer_is_read_from_model_text_not_tool_output() -> None:
    output = "<answer>Paris</answer>"
    t = trajectory(f"<search>q</search>\n<response>\n{output}\n</response>\n<answer>London</answer>",
                   calls=(call(output, tool="search"),))  # fmt: skip
    p = problem(("Paris",), type_="fact", source="nq")
    assert score(p, t)[6] == "London"
    assert score(p, t)[1] == 0.0


def test_calculator_routing_and_tool_call() -> None:
    t = trajectory("<code>print(1234*5678)</code>\n<response>\n7006652\n</response>\n<answer>7006652</answer>",
                   calls=(call("7006652"),), tool_tokens=5)  # fmt: skip
    p = problem(("7006652",), type_="calculator", source="calculator")
    assert score(p, t)[5] == 1.0


@pytest.mark.parametrize(
    ("tokens", "max_tokens", "buffer", "expected"),
    [(10, 100, 20, 0.0), (80, 100, 20, 0.0), (90, 100, 20, -0.5), (99, 100, 20, -0.95), (100, 100, 20, -1.0),
     (150, 100, 20, -1.0), (5, 10, 0, 0.0), (10, 10, 0, -1.0), (1, 10, 64, -0.015625)],
)  # fmt: skip
def test_overlong_penalty_eq9(tokens: int, max_tokens: int, buffer: int, expected: float) -> None:
    assert overlong_penalty(tokens, max_tokens, buffer) == pytest.approx(expected)


def test_length_counts_policy_tokens_only() -> None:
    cfg = RewardConfig(overlong_buffer=20)
    # 85 policy tokens + 500 tool-output tokens: only the 85 count -> (80 - 85) / 20 = -0.25
    t = trajectory("<code>x</code>\n<response>\nout\n</response>\n<answer>4</answer>", 85, (call("out"),), 500)
    assert score(problem(("4",)), t, cfg)[3] == pytest.approx(-0.25)
    assert score(problem(("4",)), t, cfg)[5] == pytest.approx(0.75)


def test_bad_format_and_overlong_add_up() -> None:
    assert score(problem(("4",)), trajectory("no tags", policy_tokens=100))[5] == -2.0


CODE = "<code>x</code>\n<response>\n{}\n</response>\n"


@pytest.mark.parametrize(
    ("calls", "expected_penalty"),
    [
        ((), 0.0),
        ((call("1"),), 0.0),
        ((call("SyntaxError", ok=False, status="error"),), -0.5),
        ((call("Timed out", ok=False, status="timeout"), call("1")), -0.5),  # not just the last round
        ((call("1"), call("MemoryError", ok=False, status="memory"), call("2", ok=False, status="error")), -0.5),
        ((call("service down", ok=False, status="unavailable"),), 0.0),
        ((call("no result", ok=False, status="error", tool="search"),), 0.0),
    ],
)
def test_torl_code_penalty_per_trajectory(calls: tuple[ToolCall, ...], expected_penalty: float) -> None:
    cfg = RewardConfig(code_penalty=-0.5, wrong_answer_reward=-1.0)
    text = "".join(CODE.format(c.result.output) for c in calls) + "<answer>4</answer>"
    result = score_trajectory(problem(("4",)), trajectory(text, calls=calls), cfg, protocol=protocol_for("tapo"), max_policy_tokens=100)
    assert result.code_penalty == expected_penalty
    assert result.total == pytest.approx(1.0 + expected_penalty)


@pytest.mark.parametrize(("answer", "expected"), [("42", 1.0), ("41", -1.0)])
def test_torl_plus_minus_one(answer: str, expected: float) -> None:
    cfg = RewardConfig(wrong_answer_reward=-1.0)
    text = "```python\nprint(6*7)\n```\n```output\n42\n```\nSo \\boxed{" + answer + "}."
    t = trajectory(text, calls=(call("42"),))
    assert score(problem(("42",), source="aime24"), t, cfg, protocol="torl")[5] == expected
    assert score(problem(("42",)), trajectory("no box"), cfg, protocol="torl")[5] == -1.0


def test_strict_math_mode_is_tapo_string_match() -> None:
    cfg = RewardConfig(math_mode="strict")
    assert score(problem(("0.5",)), trajectory("<answer>1/2</answer>"), cfg)[1] == 0.0
    assert score(problem(("1000",)), trajectory("<answer>1,000</answer>"), cfg)[1] == 1.0
    assert score(problem(("3",)), trajectory("<answer>Three</answer>"), cfg)[1] == 1.0


def test_lenient_format_allows_free_text_between_blocks() -> None:
    t = trajectory("Sure. <think>a</think> Now: <answer>4</answer>")
    assert score(problem(("4",)), t)[0] is False
    assert score(problem(("4",)), t, RewardConfig(format_strictness="lenient"))[0] is True


@pytest.mark.parametrize(
    ("source", "type_", "kind"),
    [("nq", "fact", "fact"), ("gsm8k", "math", "math"), ("deepmath", "math", "math"), ("aime24", "math", "math"),
     ("calculator", "calculator", "calculator"), ("complex", "complex", "complex"), ("my_new_set", "multihop", "fact"),
     ("my_math", "math", "math")],
)  # fmt: skip
def test_routing_tables_4_5(source: str, type_: str, kind: str) -> None:
    assert route(problem(("1",), type_=type_, source=source), CFG) == kind


def test_routing_is_configurable() -> None:
    cfg = RewardConfig(routing={"nq": "em"})
    assert route(problem(("1",), type_="fact", source="nq"), cfg) == "em"


def test_missing_type_routing_is_named() -> None:
    with pytest.raises(ValueError, match=r"type_routing lacks problem type\(s\) \['code'\]"):
        RewardScorer(RewardConfig(type_routing={"math": "math", "fact": "fact", "calculator": "calculator",
                                                "complex": "complex", "multihop": "f1"}))  # fmt: skip


def test_score_group_scores_each_trajectory() -> None:
    p = problem(("4",))
    group = Group(p, (trajectory("<answer>4</answer>"), trajectory("<answer>5</answer>"), trajectory("4")))
    scored = RewardScorer(CFG).score_group(group, protocol=protocol_for("tapo"), max_policy_tokens=100)
    assert scored.totals == (1.0, 0.0, -1.0)


def test_tepo_sparse_term_scales_by_entropy_reducing_share() -> None:
    cfg = RewardConfig(tepo=TepoSparse())
    base = score_trajectory(problem(("4",)), trajectory("<answer>4</answer>"), cfg, protocol=protocol_for("tapo"), max_policy_tokens=100)
    shaped = sparse_term(base, [-0.1, 0.2, -0.3, 0.0], cfg.wrong_answer_reward)  # m = 2 of n = 4
    assert (shaped.entropy, shaped.total) == (pytest.approx(-0.5), pytest.approx(0.5))
    assert sparse_term(base, [], cfg.wrong_answer_reward) == base  # no calls: the base reward
    assert NoTepo().shape(base, trajectory("<answer>4</answer>")) == base  # TEPO off


def test_score_batch_equals_one_by_one_and_runs_symbolic_checks_concurrently() -> None:
    cfg = RewardConfig(symbolic_workers=2, verify_timeout_s=5.0)
    answers = ["\\frac{\\sqrt{2}}{2}", "\\sin(\\pi/4)", "(x+1)^2", "0.5", "x^2+2x+1", "I am not sure", "7"]
    golds = [("\\frac{1}{\\sqrt{2}}",), ("\\frac{\\sqrt{2}}{2}",), ("x^2+2x+1",), ("1/2",), ("(x+1)^2",), ("1",), ("8",)]
    items = [(problem(g), trajectory(f"<answer>{a}</answer>")) for a, g in zip(answers, golds, strict=True)]
    items.append((problem(("1",)), trajectory("no format")))
    checker = scorer_for(CFG).verifier.checker  # share warm workers; each Verifier keeps its own cache
    batch = RewardScorer(cfg, Verifier(cfg, checker)).score_batch(items, protocol=protocol_for("tapo"), max_policy_tokens=100)
    scorer = RewardScorer(cfg, Verifier(cfg, checker))
    one_by_one = [scorer.score(p, t, protocol=protocol_for("tapo"), max_policy_tokens=100) for p, t in items]
    assert batch == one_by_one
    assert [r.total for r in batch] == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, -1.0]


def test_needs_symbolic_only_for_undecided_math() -> None:
    verifier = RewardScorer(CFG).verifier
    assert verifier.needs_symbolic("math", "(x+1)^2", ("x^2+2x+1",))
    assert not verifier.needs_symbolic("math", "0.5", ("1/2",))
    assert not verifier.needs_symbolic("math", "Paris", ("48",))
    assert not verifier.needs_symbolic("fact", "(x+1)^2", ("x^2+2x+1",))
    assert not RewardScorer(RewardConfig(math_mode="strict")).verifier.needs_symbolic("math", "(x+1)^2", ("x^2+2x+1",))


def test_verify_from_many_threads_matches_sequential() -> None:
    cases = [("math", "1/2", "0.5"), ("math", "3", "4"), ("fact", "Wilhelm Röntgen", "Wilhelm Conrad Röntgen"),
             ("em", "the Beatles", "Beatles"), ("f1", "New York City", "New York"), ("calculator", "3.1416", "3.14159"),
             ("complex", "3.5 million", "3400000"), ("math", "50\\%", "0.5")] * 25  # fmt: skip
    expected = [verify(*case) for case in cases]
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(lambda case: verify(*case), cases)) == expected
