"""Reward shaping terms that do not depend on the answer: overlong length, failed code.

- `overlong_penalty` is TAPO Eq. 9 (DAPO's soft overlong punishment) over policy tokens
  only (tool-output tokens are excluded, as in TAPO's `dapo.py`):
  0 up to L_max - L_cache, then a linear ramp to -1 at L_max, and -1 beyond.
- `code_failure_penalty` is ToRL's -0.5 for non-executable code, applied once per
  trajectory when ANY code call failed. Departure from ToRL's code: it reads only the last
  round's pass flag, which also punishes answers that never ran code; here only code calls
  whose result status is a failure status count, and a tool service that was down
  ("unavailable") is not the model's fault.
"""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.types import ToolCall


def overlong_penalty(policy_tokens: int, max_tokens: int, buffer: int) -> float:
    """TAPO Eq. 9: R_length(L_o) with L_max = max_tokens and L_cache = buffer, in [-1, 0]."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if policy_tokens >= max_tokens:
        return -1.0
    threshold = max_tokens - min(buffer, max_tokens)
    if policy_tokens <= threshold:
        return 0.0
    return (threshold - policy_tokens) / buffer


def code_failure_penalty(calls: Iterable[ToolCall], penalty: float, failure_statuses: Iterable[str]) -> float:
    """`penalty` when any code call ended in a failure status, else 0.0 (once per trajectory)."""
    statuses = frozenset(failure_statuses)
    failed = any(call.tool == "code" and not call.result.ok and call.result.status in statuses for call in calls)
    return penalty if failed else 0.0
