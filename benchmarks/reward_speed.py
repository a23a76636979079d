"""Reward scoring throughput on a realistic mix of real problems, ours vs a naive baseline.

Mix (TAPO-like): GSM8K and MATH-500 (math), NQ-open (fact, with aliases) and generated
calculator problems. Each problem gets G sampled trajectories per step, over several
steps; a trajectory's answer is drawn from a small per-problem pool of candidates (the
gold verbatim, an equivalent rewrite, near misses, other answers), as a policy repeats
itself within a group; about 60% call a tool and about 10% break the format (including
model-written tool output). The texts use the TAPO tag protocol.

- ours: `RewardScorer` (format grammar, fast exact path, cached verifiers, math-verify in
  killable workers only for what the fast path cannot decide).
- baseline: the anchors' way: math-verify parse + verify in-process for every math answer
  (ToRL's `is_equiv`), Levenshtein for facts, `complex()` for calculator, no cache. Run on a
  prefix of the same trajectories (it is slow) and reported per trajectory.

Prints one JSON object as its last line: trajectories/s for both and `ratio` = ours/baseline.
Usage (from the repository root):
    python -m benchmarks.reward_speed [--problems 600] [--group-size 8] [--steps 4] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import re
import time
from dataclasses import dataclass

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from rapidfuzz.distance import Levenshtein

from benchmarks import harness
from pipeline.config.reward import RewardConfig
from pipeline.jsonl import iter_json_lines
from pipeline.paths import shared_data_dir
from pipeline.protocols import protocol_for
from pipeline.reward import RewardScorer
from pipeline.reward.numeric import normalize_math, parse_number
from pipeline.reward.textmatch import normalize_text
from pipeline.types import Problem, ToolCall, ToolResult, Trajectory

TOKENS_PER_CHAR = 0.25  # a rough tokenizer: 4 characters a token
QUICK = {"problems": 10, "group_size": 2, "steps": 2, "baseline_items": 10}


@dataclass(frozen=True)
class Item:
    problem: Problem
    trajectory: Trajectory


def load_problems(n: int, rng: random.Random) -> list[Problem]:
    """n problems: 35% GSM8K, 15% MATH-500, 35% NQ-open, 15% calculator."""
    data = shared_data_dir()
    gsm = [r for _, r in iter_json_lines(data / "gsm8k/test.jsonl")]
    math500 = [r for _, r in iter_json_lines(data / "math500/test.jsonl")]
    nq = [r for _, r in iter_json_lines(data / "nq_open/NQ-open.dev.jsonl")]
    out: list[Problem] = []
    for i in range(int(n * 0.35)):
        row = gsm[i % len(gsm)]
        out.append(Problem(f"g{i}", row["question"], (row["answer"].split("####")[-1].strip(),), "math", "gsm8k", "train"))
    for i in range(int(n * 0.15)):
        row = math500[i % len(math500)]
        out.append(Problem(f"m{i}", row["problem"], (row["answer"],), "math", "math500", "train"))
    for i in range(int(n * 0.35)):
        row = nq[i % len(nq)]
        out.append(Problem(f"n{i}", row["question"], tuple(row["answer"]), "fact", "nq", "train"))
    while len(out) < n:
        a, b = rng.randint(100, 99999), rng.randint(2, 9999)
        op, value = rng.choice([("*", a * b), ("/", round(a / b, 4)), ("+", a + b)])
        out.append(Problem(f"c{len(out)}", f"What is {a} {op} {b}?", (str(value),), "calculator", "calculator", "train"))
    return out


def candidate_answers(p: Problem, others: list[Problem], rng: random.Random) -> list[str]:
    """What a policy might answer: gold, a rewrite of it, near misses, an unrelated answer."""
    gold = p.answers[0]
    pool = [gold, gold, rng.choice(others).answers[0]]
    if re.fullmatch(r"-?\d+(\.\d+)?", gold.replace(",", "")):
        value = float(gold.replace(",", ""))
        pool += [f"{value:,.2f}", f"\\${gold}", str(int(value) + rng.randint(1, 9)), f"x = {gold}"]
    elif p.type == "fact":
        pool += [f"the {gold.lower()}", " ".join(gold.split()[:-1]) or gold + "s", gold.upper()]
    else:
        pool += [f"\\boxed{{{gold}}}", gold.replace("\\frac", "\\dfrac"), gold + "+1"]
    return pool


def make_text(question: str, answer: str, tool: str | None, output: str, rng: random.Random) -> tuple[str, int]:
    """A TAPO-protocol response and its policy-token count; ~10% break the format."""
    thought = f"<think>{question[:300]} Let me work this out step by step.</think>\n"
    call = ""
    if tool == "code":
        call = f"<code>print({answer!r})</code>\n<response>\n{output}\n</response>\n"
    elif tool == "search":
        call = f"<search>{question[:60]}</search>\n<response>\n{output}\n</response>\n"
    roll = rng.random()
    if roll < 0.04:
        return thought + f"<response>{answer}</response><answer>{answer}</answer>", len(thought) // 4
    if roll < 0.07:
        return thought + call + f"<answer>{answer}</answer> I hope this helps!", len(thought) // 4 + 20
    if roll < 0.10:
        return thought + call + "I am not sure.", len(thought) // 4 + 10
    text = thought + call + f"<answer>{answer}</answer>"
    return text, int((len(text) - len(output)) * TOKENS_PER_CHAR)


def make_items(problems: list[Problem], group_size: int, steps: int, rng: random.Random) -> list[Item]:
    pools = {p.id: candidate_answers(p, problems, rng) for p in problems}
    items: list[Item] = []
    for _ in range(steps):
        for p in rng.sample(problems, len(problems)):
            for _ in range(group_size):
                answer = rng.choice(pools[p.id])
                tool = rng.choice([None, "code" if p.type != "fact" else "search", "code" if p.type != "fact" else "search"])
                output = f"Doc 1 (Title: {answer}) {p.question[:200]}" if tool == "search" else answer
                text, n_policy = make_text(p.question, answer, tool, output, rng)
                calls = (
                    (ToolCall(tool, "x", ToolResult(output, True), (0, 1), (1, 2)),) if tool else ()  # type: ignore[arg-type]
                )
                mask = (1,) * max(1, n_policy) + (0,) * (len(output) // 4)
                items.append(Item(p, Trajectory(p.id, (0,), tuple(range(len(mask))), mask, (0.0,) * len(mask),
                                                calls, "answer", text, 1 + len(calls))))  # fmt: skip
    return items


_TAPO_TAG = re.compile(r"\s*<(\w+)>(.*?)</\1>\s*", re.DOTALL)
_MV_CONFIG = [LatexExtractionConfig(), ExprExtractionConfig()]


def baseline_score(item: Item) -> float:
    """The anchors' scorer: TAPO's regex format scan, math-verify for every math answer, no cache."""
    text = item.trajectory.text.strip()
    pos, last, answer = 0, None, None
    while pos < len(text):
        match = _TAPO_TAG.search(text[pos:])
        if not match or match.group(1) not in {"think", "response", "answer", "search", "code"}:
            return -1.0
        last, pos = match.group(1), pos + match.end()
        if last == "answer":
            answer = match.group(2)
    if last != "answer" or answer is None:
        return -1.0
    p = item.problem
    if p.type == "math":
        gold = parse(f"${p.answers[0]}$", extraction_config=_MV_CONFIG, parsing_timeout=2)
        pred = parse(f"${answer}$", extraction_config=_MV_CONFIG, parsing_timeout=2)
        return float(verify(gold, pred, timeout_seconds=2))
    if p.type == "fact":
        return max(0.0 if (r := Levenshtein.normalized_distance(answer, g)) > 0.5 else 1 - r for g in p.answers)
    try:
        return float(abs(complex(answer) - complex(p.answers[0])) < 1e-3)
    except ValueError:
        return 0.0


def run(n_problems: int, group_size: int, steps: int, baseline_items: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    items = make_items(load_problems(n_problems, rng), group_size, steps, rng)
    scorer = RewardScorer(RewardConfig())
    scorer.score_batch([], protocol=protocol_for("tapo"), max_policy_tokens=1024)
    scorer.verifier.checker.start()  # worker start-up is a one-off, outside the timing

    per_step = len(items) // steps
    start = time.perf_counter()
    step_times = []
    for step in range(steps):
        batch = [(item.problem, item.trajectory) for item in items[step * per_step : (step + 1) * per_step]]
        step_start = time.perf_counter()
        scorer.score_batch(batch, protocol=protocol_for("tapo"), max_policy_tokens=1024)
        step_times.append(time.perf_counter() - step_start)
    ours_s = time.perf_counter() - start

    for cached in (normalize_math, parse_number, normalize_text):  # start the one-by-one run cold too
        cached.cache_clear()
    sequential = RewardScorer(RewardConfig(symbolic_workers=1))
    sequential.verifier.checker.start()
    start = time.perf_counter()
    for item in items[:per_step]:
        sequential.score(item.problem, item.trajectory, protocol=protocol_for("tapo"), max_policy_tokens=1024)
    sequential_first_s = time.perf_counter() - start

    subset = items[:baseline_items]
    start = time.perf_counter()
    for item in subset:
        baseline_score(item)
    base_s = time.perf_counter() - start

    ours = len(items) / ours_s
    base = len(subset) / base_s
    return {
        "load_avg_1min": round(os.getloadavg()[0], 1),  # other jobs share the cores; read figures with it
        "trajectories": len(items),
        "steps": steps,
        "ours_per_s": round(ours, 1),
        "ours_first_step_per_s": round(per_step / step_times[0], 1),
        "ours_later_steps_per_s": round((len(items) - per_step) / sum(step_times[1:]), 1) if steps > 1 else None,
        "ours_first_step_one_by_one_per_s": round(per_step / sequential_first_s, 1),
        "baseline_per_s": round(base, 1),
        "baseline_trajectories": len(subset),
        "symbolic_timeouts": scorer.verifier.checker.timeouts,
        "cache": scorer.verifier.cache_info(),
        "ratio": round(ours / base, 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=600)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--baseline-items", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    args = harness.parse(parser, argv, QUICK)
    logging.disable(logging.WARNING)  # math-verify logs on every baseline call
    result = run(args.problems, args.group_size, args.steps, args.baseline_items, args.seed)
    harness.last_line(result, args.quick)


if __name__ == "__main__":
    main()
