"""Records passed between stages.

Every stage hands the next one of these frozen dataclasses, never a dict. Sequence fields
are tuples (immutable); tensor fields carry their shape in the name suffix
(`_BT` = [batch, tokens]) and in a comment.

Token spans are half-open `(start, end)` indices into `Trajectory.response_ids`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

ProblemType = Literal["math", "fact", "calculator", "complex", "multihop", "code"]
PROBLEM_TYPES: tuple[str, ...] = ("math", "fact", "calculator", "complex", "multihop", "code")
Split = Literal["train", "test", "validation"]
# A tool's name: the built-in clients' ("code", "search") or a user-defined tool's (`rollout.tools`).
ToolName = str
BUILTIN_TOOLS: tuple[ToolName, ...] = ("code", "search")
FinishReason = Literal["answer", "eos", "max_tokens", "max_turns", "error"]


@dataclass(frozen=True)
class Problem:
    """One question with its accepted answers.

    `answers` holds every accepted gold string (aliases for fact questions; one exact
    value for math and calculator problems). `type` selects the verifier and the tools a
    prompt may offer; `source` names the data set it came from (e.g. "gsm8k", "nq",
    "calculator") and routes rewards per TAPO Tables 4-5.
    """

    id: str
    question: str
    answers: tuple[str, ...]
    type: ProblemType
    source: str
    split: Split
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "answers": list(self.answers),
            "type": self.type,
            "source": self.source,
            "split": self.split,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Problem:
        """Build from a JSON row; raises ValueError naming the offending key."""
        missing = [k for k in ("id", "question", "answers", "type", "source", "split") if k not in row]
        if missing:
            raise ValueError(f"missing key(s) {missing}")
        answers = row["answers"]
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise ValueError("'answers' must be a string or a list of strings")
        if row["type"] not in PROBLEM_TYPES:
            raise ValueError(f"'type' is {row['type']!r}, expected one of {PROBLEM_TYPES}")
        return cls(
            id=str(row["id"]),
            question=str(row["question"]),
            answers=tuple(answers),
            type=row["type"],
            source=str(row["source"]),
            split=row["split"],
            meta=dict(row.get("meta") or {}),
        )


@dataclass(frozen=True)
class ToolResult:
    """What a tool returned. Failures are observations, never exceptions.

    `output` is the text shown to the model (for a failed code run: stdout plus the last
    traceback line, ToRL-style). `error` is None on success, else a short reason.
    `status` is the service's own verdict (e.g. "ok", "error", "timeout", "memory",
    "rejected", "unavailable").

    `infrastructure` is True when the *service* failed, not the policy's call: it could not be
    reached, answered 5xx/429 or garbage, or did not answer within the client's timeout (the
    snippet's own time limit is status "timeout" and not an outage). A trajectory holding such a
    result is never trained on (`Trajectory.infrastructure_failures`).
    """

    output: str
    ok: bool
    status: str = "ok"
    error: str | None = None
    latency_s: float = 0.0
    infrastructure: bool = False

    @classmethod
    def failure(cls, message: str, status: str = "error", latency_s: float = 0.0, *,
                infrastructure: bool = False) -> ToolResult:
        return cls(output=message, ok=False, status=status, error=message, latency_s=latency_s,
                   infrastructure=infrastructure)


@dataclass(frozen=True)
class ToolSpec:
    """What a model is told about a tool: its name, what it does, and its arguments as a JSON schema (an object
    schema, as OpenAI-style function declarations and `apply_chat_template(tools=...)` take it).

    `text_argument` names the one string argument of a text tool (code: "code", search: "query"): the tag
    protocols write that text between tags, a chat-template call passes it as that argument, and the client
    receives the text either way. None: the tool receives its arguments as a JSON object (user and MCP tools).
    `origin` says where the declaration came from (e.g. "MCP server 'files'"), for the start-up refusal of a
    schema that cannot be compiled; empty: the run's own config (`rollout.tools`).
    """

    name: ToolName
    description: str
    parameters: dict[str, Any] = field(hash=False)
    text_argument: str | None = None
    origin: str = field(default="", compare=False)

    def declaration(self) -> dict[str, Any]:
        """The tool as a chat template's `tools=` entry (the OpenAI function-calling shape)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


def _text_tool(name: ToolName, description: str, argument: str, about: str) -> ToolSpec:
    parameters = {"type": "object", "properties": {argument: {"type": "string", "description": about}},
                  "required": [argument], "additionalProperties": False}
    return ToolSpec(name, description, parameters, text_argument=argument)


# The project's own tools, as a chat template declares them (the tag protocols teach them in their prompts).
BUILTIN_SPECS: dict[ToolName, ToolSpec] = {
    "code": _text_tool("code", "Run a Python program in a sandbox and return what it prints (stdout, and the last "
                       "traceback line if it fails). print() the values you need.", "code", "The Python program."),
    "search": _text_tool("search", "Search the web and return the top passages, one line each.", "query",
                         "The search query."),
}


@dataclass(frozen=True)
class ToolCall:
    """One tool call inside a trajectory.

    `call_span`: response-token span of the model's call (e.g. `<code>...</code>`), mask 1.
    `output_span`: response-token span of the inserted tool output (`<response>...</response>`), mask 0.
    Calls written in one chat turn (`chat-tools`) share both: the turn, and the template's rendering of
    all their results, in order.
    """

    tool: ToolName
    input: str
    result: ToolResult
    call_span: tuple[int, int]
    output_span: tuple[int, int]


@dataclass(frozen=True)
class Trajectory:
    """One sampled response to one prompt, with tool outputs spliced in.

    Invariants (tested): len(response_ids) == len(loss_mask) == len(logprobs);
    loss_mask is 1 exactly on sampled tokens and 0 on tool-output tokens;
    logprobs are the sampling log-probs of sampled tokens (0.0 where mask is 0).
    """

    problem_id: str
    prompt_ids: tuple[int, ...]  # [P] chat-templated prompt
    response_ids: tuple[int, ...]  # [R] sampled tokens and tool-output tokens, in order
    loss_mask: tuple[int, ...]  # [R] 1 = sampled by the policy, 0 = inserted tool output
    logprobs: tuple[float, ...]  # [R] log pi_old(token) at sampling time; 0.0 where mask is 0
    tool_calls: tuple[ToolCall, ...]
    finish_reason: FinishReason
    text: str  # the decoded response, tool outputs included
    turns: int  # generation segments (1 + number of tool calls answered)
    # [R] entropy of the sampling distribution at each token; None where unknown (mask 0, or a backend without it)
    entropies: tuple[float | None, ...] = ()
    # The policy's own text, one entry per run of sampled tokens between two insertions (so one more than
    # the insertions), each decoded alone with special tokens kept: what a protocol that reads turns
    # (`chat-tools`) checks, instead of finding the insertions in `text`. Empty for hand-built records.
    segments: tuple[str, ...] = ()
    # Why the trajectory ended with finish_reason "error" (a failure inside it: its tool output could not be
    # rendered, its prompt could not be built, the watchdog ended a row stuck waiting); empty otherwise.
    error: str = ""

    @property
    def output_spans(self) -> list[tuple[int, int]]:
        """The distinct insertion spans, in order (the calls of one chat turn share one)."""
        return list(dict.fromkeys(c.output_span for c in self.tool_calls))

    @property
    def policy_token_count(self) -> int:
        return sum(self.loss_mask)

    def calls_of(self, tool: ToolName) -> int:
        return sum(1 for c in self.tool_calls if c.tool == tool)

    @property
    def infrastructure_failures(self) -> int:
        """Tool calls whose service failed (see `ToolResult.infrastructure`): what the policy read there
        is an outage, not a consequence of its action, so the trajectory must not be trained on."""
        return sum(1 for c in self.tool_calls if c.result.infrastructure)


@dataclass(frozen=True)
class RewardBreakdown:
    """The reward of one trajectory, term by term, for logging. `total` is what trains."""

    format_ok: bool
    accuracy: float  # f_T(o, gt) in [0, 1] (0 when the format is wrong)
    format: float  # 0, or the format penalty (TAPO Eq. 7: -1) when the format is wrong
    length: float  # overlong shaping over policy tokens (TAPO Eq. 9), <= 0
    code_penalty: float = 0.0  # ToRL: -0.5 when a code call failed to execute, else 0
    entropy: float = 0.0  # TEPO shaping term added to the total
    total: float = 0.0
    predicted: str | None = None

    @property
    def correct(self) -> bool:
        return self.accuracy > 0.9

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Group:
    """G trajectories sampled for one problem (the unit of group-relative advantages)."""

    problem: Problem
    trajectories: tuple[Trajectory, ...]


@dataclass(frozen=True)
class ScoredGroup:
    """A group with one reward per trajectory."""

    group: Group
    rewards: tuple[RewardBreakdown, ...]  # [G]
    # The opening of a group dynamic sampling dropped (`pipeline.rl.anchor`): it trains the KL term alone, so it
    # gets zero advantage by what it is, and nothing judges it again (cut, its trajectories lost their calls).
    anchor_only: bool = False

    @property
    def totals(self) -> tuple[float, ...]:
        return tuple(r.total for r in self.rewards)


@dataclass(frozen=True)
class TrainBatch:
    """Right-padded tensors for one optimisation step (B = trajectories, T = prompt + response).

    `loss_mask_BT` is 1 on sampled response tokens only (prompt, tool output and padding
    are 0). `n_policy_tokens` is the global count of mask-1 tokens over the whole batch,
    the single normaliser of the token-level loss (DAPO), so micro-batching cannot change
    the gradient. Under the masking ablation (`train.update.mask_tool_output: false`) the loss mask also
    covers tool output, and `sampled_mask_BT` keeps the tokens the policy sampled: the step's
    diagnostics (entropy, KL, clip fractions) are read over those, so they compare across the two arms.
    """

    input_ids_BT: torch.Tensor  # [B, T] long
    attention_mask_BT: torch.Tensor  # [B, T] long
    loss_mask_BT: torch.Tensor  # [B, T] float
    old_logprobs_BT: torch.Tensor  # [B, T] float, sampling log-probs aligned with input_ids
    advantages_BT: torch.Tensor  # [B, T] float, per-token advantage (0 where loss_mask is 0)
    n_policy_tokens: int
    ref_logprobs_BT: torch.Tensor | None = None  # [B, T] float, the reference policy's (only with a KL term)
    sampled_mask_BT: torch.Tensor | None = None  # [B, T] float, 1 on sampled tokens; None: the loss mask's tokens

    @property
    def diagnostic_mask_BT(self) -> torch.Tensor:
        """The tokens the policy sampled, over which the step's diagnostics are read (see the class docstring)."""
        return self.loss_mask_BT if self.sampled_mask_BT is None else self.sampled_mask_BT

    def __len__(self) -> int:
        return int(self.input_ids_BT.shape[0])

    def _map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> TrainBatch:
        """The batch with `fn` applied to each of its [B, T] tensors (an absent reference stays absent)."""
        mapped: dict[str, Any] = {f.name: fn(getattr(self, f.name)) for f in dataclasses.fields(self)
                                  if isinstance(getattr(self, f.name), torch.Tensor)}
        return dataclasses.replace(self, **mapped)

    def to(self, device: torch.device) -> TrainBatch:
        """The same batch on `device` (the model's): every tensor moves, none is copied when already there."""
        return self._map_tensors(lambda t: t.to(device))

    def trimmed(self) -> TrainBatch:
        """The batch without its trailing all-padding columns (rows are right-padded, so no token of any row
        sees them): a micro-batch of short rows does not pay for the width of the longest row elsewhere."""
        attended_T = self.attention_mask_BT.bool().any(0)
        width = int(attended_T.nonzero().max()) + 1 if bool(attended_T.any()) else 1
        return self if width == self.input_ids_BT.shape[1] else self._map_tensors(lambda t: t[:, :width])

    def select(self, rows: slice | list[int]) -> TrainBatch:
        """A micro-batch: same global normaliser, subset of rows."""
        return self._map_tensors(lambda t: t[rows])


@dataclass(frozen=True)
class Collected:
    """One step's rollout: the groups to train on, every group scored, and the rollout metrics."""

    kept: list[ScoredGroup]
    seen: list[ScoredGroup]  # kept or dropped by dynamic sampling (the sample tables draw from these)
    metrics: dict[str, float]
    dropped: list[ScoredGroup] = field(default_factory=list)  # seen, not kept (no signal: the set-up's dynamic-sampling filter)
