"""Score one trajectory: format (Eq. 7) + accuracy f_T + length (Eq. 9) + code penalty (+ TEPO).

    total = format_penalty + length + code_penalty                      if the format is wrong
    total = w + (1 - w) * f_T(answer, gold) + length + code_penalty + entropy   otherwise

with w = `wrong_answer_reward` (0 = TAPO Eq. 10; -1 = ToRL's +-1). f_T is chosen by routing
the problem's `source` (else its `type`) to a verifier kind (TAPO Tables 4-5). The answer is
extracted from the model's own text, with the engine's tool outputs removed, so a search
result that happens to contain `<answer>` cannot answer for the model. The format grammar and the
extraction are the protocol's (`pipeline.protocols`): callers pass the object, resolved once.

`entropy` is 0 here: TEPO needs the policy's token entropies, which only the trainer has.
The trainer adds TEPO's terms (`pipeline.rl.tepo`): the sparse variant reshapes the reward
from the delta segment entropies, the dense one the advantages per call.

A `RewardScorer` is built once per config (verifier cache, symbolic workers, routing);
`score_trajectory` and `verify` reuse one per distinct config. For a whole step, prefer
`RewardScorer.score_batch` / `score_group`: the same breakdowns, with the slow symbolic
checks run concurrently.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from pipeline.config.reward import RewardConfig
from pipeline.protocols import ToolProtocol
from pipeline.reward.format import FormatResult, check_response
from pipeline.reward.shaping import code_failure_penalty, overlong_penalty
from pipeline.reward.verifiers import VERIFIER_KINDS, Verifier, asks_for_percentage
from pipeline.types import PROBLEM_TYPES, Group, Problem, RewardBreakdown, ScoredGroup, Trajectory


def route(problem: Problem, cfg: RewardConfig) -> str:
    """The verifier kind for a problem: by source (TAPO Tables 4-5), else by type."""
    kind = cfg.routing.get(problem.source) or cfg.type_routing.get(problem.type)
    if kind is None:
        raise ValueError(
            f"problem {problem.id!r}: no verifier for source {problem.source!r} or type {problem.type!r}; "
            "add it to reward.routing or reward.type_routing in params.yaml"
        )
    return kind


class RewardScorer:
    """Everything scoring needs, resolved once from a RewardConfig."""

    def __init__(self, cfg: RewardConfig, verifier: Verifier | None = None) -> None:
        missing = [t for t in PROBLEM_TYPES if t not in cfg.type_routing]
        if missing:
            raise ValueError(f"reward.type_routing lacks problem type(s) {missing}")
        self.cfg = cfg
        self.verifier = verifier or Verifier(cfg)

    def score(self, problem: Problem, trajectory: Trajectory, *, protocol: ToolProtocol, max_policy_tokens: int) -> RewardBreakdown:
        return self._breakdown(problem, trajectory, self._read(trajectory, protocol), max_policy_tokens)

    def score_batch(
        self, items: Sequence[tuple[Problem, Trajectory]], *, protocol: ToolProtocol, max_policy_tokens: int
    ) -> list[RewardBreakdown]:
        """Score many trajectories; the slow symbolic checks among them run concurrently.

        Distinct (kind, answer, gold) triples that need the symbolic checker are verified
        first, up to `symbolic_workers` at a time (each thread waits on its own worker process, so they do not fight over
        the GIL); the breakdowns then read the verifier cache.
        """
        reads = [self._read(trajectory, protocol) for _, trajectory in items]
        triples = {
            (route(problem, self.cfg), answer, problem.answers, asks_for_percentage(problem.question)): None
            for (problem, _), (fmt, answer) in zip(items, reads, strict=True)
            if fmt.ok and answer is not None
        }
        triples = {t: None for t in triples if self.verifier.needs_symbolic(*t)}
        if self.cfg.symbolic_workers > 1 and len(triples) > 1:
            with ThreadPoolExecutor(self.cfg.symbolic_workers) as pool:
                list(pool.map(lambda triple: self.verifier.score(*triple), triples))
        return [self._breakdown(p, t, read, max_policy_tokens) for (p, t), read in zip(items, reads, strict=True)]

    def score_group(self, group: Group, *, protocol: ToolProtocol, max_policy_tokens: int) -> ScoredGroup:
        items = [(group.problem, t) for t in group.trajectories]
        return ScoredGroup(group, tuple(self.score_batch(items, protocol=protocol, max_policy_tokens=max_policy_tokens)))

    def _read(self, trajectory: Trajectory, protocol: ToolProtocol) -> tuple[FormatResult, str | None]:
        """The format verdict and the extracted answer (from the model's own text). A trajectory that ended in an
        error (a failure inside it, `Trajectory.error`) has no answer: its reward is the format penalty."""
        if trajectory.finish_reason == "error":
            return FormatResult(False, f"the trajectory ended in an error: {trajectory.error}", ""), None
        strict = self.cfg.format_strictness == "strict"
        fmt = check_response(trajectory, protocol, strict=strict, eos_strings=self.cfg.eos_strings)
        return fmt, protocol.extract_answer(fmt.model_text)

    def _breakdown(
        self, problem: Problem, trajectory: Trajectory, read: tuple[FormatResult, str | None], max_policy_tokens: int
    ) -> RewardBreakdown:
        cfg = self.cfg
        fmt, predicted = read
        length = overlong_penalty(trajectory.policy_token_count, max_policy_tokens, cfg.overlong_buffer)
        code = code_failure_penalty(trajectory.tool_calls, cfg.code_penalty, cfg.code_failure_statuses)
        if not fmt.ok or predicted is None:
            total = cfg.format_penalty + length + code
            return RewardBreakdown(False, 0.0, cfg.format_penalty, length, code, 0.0, total, predicted)
        accuracy = self.verifier.score(route(problem, cfg), predicted, problem.answers,
                                       asks_for_percentage(problem.question))
        outcome = cfg.wrong_answer_reward + (1.0 - cfg.wrong_answer_reward) * accuracy
        return RewardBreakdown(True, accuracy, 0.0, length, code, 0.0, outcome + length + code, predicted)


_scorers: dict[str, RewardScorer] = {}
_scorers_by_id: dict[int, tuple[RewardConfig, RewardScorer]] = {}
_scorers_lock = threading.Lock()


def scorer_for(cfg: RewardConfig) -> RewardScorer:
    """The shared scorer of this config (one verifier cache and worker pool per distinct config)."""
    known = _scorers_by_id.get(id(cfg))
    if known is not None and known[0] is cfg:  # the same (frozen) object: skip the JSON key
        return known[1]
    key = cfg.model_dump_json()
    with _scorers_lock:
        scorer = _scorers.get(key)
        if scorer is None:
            scorer = _scorers[key] = RewardScorer(cfg)
        _scorers_by_id[id(cfg)] = (cfg, scorer)  # holding cfg keeps its id from being reused
    return scorer


def score_trajectory(
    problem: Problem, trajectory: Trajectory, cfg: RewardConfig, *, protocol: ToolProtocol, max_policy_tokens: int
) -> RewardBreakdown:
    """The reward of one trajectory, term by term (see the module docstring for the formula)."""
    return scorer_for(cfg).score(problem, trajectory, protocol=protocol, max_policy_tokens=max_policy_tokens)


def verify(kind: str, predicted: str, gold: str | list[str], percent_asked: bool = False) -> float:
    """f_kind(predicted, gold) in [0, 1] with the default reward settings (max over aliases); `percent_asked`:
    the problem asks for a percentage (see verifiers.py)."""
    if kind not in VERIFIER_KINDS:
        raise ValueError(f"unknown verifier kind {kind!r}; expected one of {VERIFIER_KINDS}")
    return scorer_for(_DEFAULT_CONFIG).verifier.score(kind, predicted, gold, percent_asked)


_DEFAULT_CONFIG = RewardConfig()
