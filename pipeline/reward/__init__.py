"""Rule-based rewards and verifiers for TAPO, ToRL, Search-R1 and TEPO.

Public API (`protocol` is a `pipeline.protocols.Protocol`, resolved once with `protocol_for`; the
protocol owns its grammar and answer extraction, this package the scoring around them):
- `verify(kind, predicted, gold)`: f_kind in [0, 1], max over gold aliases (verifiers.py).
- `score_trajectory(problem, trajectory, cfg, protocol=..., max_policy_tokens=...)`: a
  `RewardBreakdown` (score.py); `RewardScorer` is the same, built once, for batches.
- `check_format(text, protocol, tool_outputs, ...)`: the format check: the engine's outputs, then
  the protocol's grammar (format.py); `check_response(trajectory, protocol, ...)` reads a trajectory as
  its protocol does (turn by turn for chat-tools).
- TEPO's terms need the policy's entropies and live with the algorithm (`pipeline.rl.tepo`).

Rules every verifier kind follows (verifiers.py):
- No credit for hedging (hedging.py): an answer naming several different candidate values
  ("1000 or 5000", "between 960 and 5000", "Paris or London", "3 (maybe 1)", "3 eller 1") scores 0 against a
  gold that names one, whatever value the kind would have read out of it; the joining words are read in every
  language the verifiers read (hedge_words.py).
- Every reader here is total and linear in its text: any response gets a verdict (hostile nesting, lone
  surrogates or NUL included), never an exception.
- A percentage is its value divided by 100 ("0.42%" is 0.0042), unless the problem asks for a
  percentage (its gold is written with %, or its question names percent): then "25%" also
  matches gold 25.
"""

from pipeline.reward.format import FormatResult, check_format, check_response, split_engine_outputs
from pipeline.reward.score import RewardScorer, route, score_trajectory, scorer_for, verify
from pipeline.reward.shaping import code_failure_penalty, overlong_penalty
from pipeline.reward.symbolic import SymbolicChecker
from pipeline.reward.verifiers import VERIFIER_KINDS, Verifier, fast_math_equal

__all__ = [
    "VERIFIER_KINDS",
    "FormatResult",
    "RewardScorer",
    "SymbolicChecker",
    "Verifier",
    "check_format",
    "check_response",
    "code_failure_penalty",
    "fast_math_equal",
    "overlong_penalty",
    "route",
    "score_trajectory",
    "scorer_for",
    "split_engine_outputs",
    "verify",
]
