"""Rule-based rewards: format grammar, per-source verifiers, length/code shaping, TEPO.

Routing follows TAPO Tables 4-5 (nq -> fact, gsm8k/dapo/deepmath/aime -> math,
calculator -> calculator, complex -> complex): `routing` maps a problem's `source` to a
verifier kind and `type_routing` is the fallback by problem `type`.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from pipeline.config.base import StageConfig

VerifierKind = Literal["math", "fact", "calculator", "complex", "em", "f1"]

DEFAULT_SOURCE_ROUTING: dict[str, VerifierKind] = {
    "nq": "fact",
    "nq_open": "fact",
    "triviaqa": "fact",
    "popqa": "fact",
    "hotpotqa": "fact",
    "2wikimultihopqa": "fact",
    "musique": "fact",
    "bamboogle": "fact",
    "gsm8k": "math",
    "dapo": "math",
    "dapo_math": "math",
    "deepmath": "math",
    "math": "math",
    "math500": "math",
    "aime": "math",
    "aime24": "math",
    "aime25": "math",
    "amc23": "math",
    "calculator": "calculator",
    "wiki_facts": "fact",
    "complex": "complex",
}

DEFAULT_TYPE_ROUTING: dict[str, VerifierKind] = {
    "math": "math",
    "fact": "fact",
    "calculator": "calculator",
    "complex": "complex",
    "multihop": "fact",
    "code": "math",
}


class TepoOff(StageConfig):
    """No entropy shaping: the reward is the rule-based reward alone."""

    display_name: ClassVar[str] = ""  # in the policy's row of an evaluation table
    kind: Literal["off"] = "off"


class TepoSparse(StageConfig):
    """TEPO sparse outcome reward: R = base * m / n (m entropy-reducing calls of n; R = base when n = 0)."""

    display_name: ClassVar[str] = "TEPO sparse"  # in the policy's row of an evaluation table
    kind: Literal["sparse"] = "sparse"
    min_segment_tokens: int = Field(1, ge=1, description="A segment shorter than this has no entropy; its call counts as not entropy-reducing.")


class TepoDense(StageConfig):
    """TEPO dense process reward: r_k = base * (1 + alpha * 1[dH_k < 0]) per call, advantages over a group's calls."""

    display_name: ClassVar[str] = "TEPO dense"  # in the policy's row of an evaluation table
    kind: Literal["dense"] = "dense"
    alpha: float = Field(0.5, ge=0.0, le=10.0, description="Bonus factor for an entropy-reducing call.")
    min_segment_tokens: int = Field(1, ge=1, description="A segment shorter than this has no entropy; its call counts as not entropy-reducing.")
    advantage_eps: float = Field(1e-6, gt=0.0, description="Added to the std of a group's call rewards before dividing.")


TepoConfig = Annotated[TepoOff | TepoSparse | TepoDense, Field(discriminator="kind")]


class RewardConfig(StageConfig):
    # Keys that shape how the policy learns (pipeline.rl), not how an answer is scored: an evaluation of a fixed
    # model neither reads them nor keys its stored samples on them, and its DVC stages leave them out.
    TRAINING_ONLY: ClassVar[frozenset[str]] = frozenset({"tepo"})

    format_penalty: float = Field(-1.0, le=0.0, description="Reward when the format is wrong (TAPO Eq. 7).")
    overlong_buffer: int = Field(64, ge=0, description="L_cache: policy tokens over which the overlong penalty ramps to -1 (TAPO Eq. 9).")
    format_strictness: Literal["strict", "lenient"] = Field(
        "strict", description="Tag protocols: strict = only whitespace between blocks; lenient = free text between blocks (TAPO's code)."
    )
    math_mode: Literal["equivalent", "strict"] = Field(
        "equivalent", description="equivalent: numeric/symbolic equivalence; strict: TAPO's normalised string equality."
    )
    verify_timeout_s: float = Field(2.0, gt=0.0, le=60.0, description="CPU-time limit of one symbolic equivalence check (the checking process's own CPU seconds, so a verdict does not depend on how busy the machine is; 30x it in wall time if the check gets no CPU); over it counts as not equivalent.")
    symbolic_workers: int = Field(2, ge=1, le=16, description="Processes that run symbolic checks (each killable on time-out).")
    cache_size: int = Field(65536, ge=0, description="Verified (kind, prediction, gold) results kept in memory (0 = no cache).")
    wrong_answer_reward: float = Field(
        0.0, ge=-1.0, le=0.0, description="Outcome of a well-formed wrong answer: 0 (TAPO) or -1 (ToRL); accuracy a maps to w + (1 - w) * a."
    )
    code_penalty: float = Field(0.0, ge=-1.0, le=0.0, description="Added once when any code call failed to execute (ToRL: -0.5; 0 = off).")
    code_failure_statuses: tuple[str, ...] = Field(
        ("error", "timeout", "memory", "rejected"), description="Tool-result statuses that count as code that failed to execute."
    )
    fact_max_ratio: float = Field(0.5, ge=0.0, le=1.0, description="f_fact is 0 above this normalised Levenshtein ratio (TAPO Eq. 8).")
    fold_diacritics: bool = Field(True, description="Fact/EM/F1 normalisation also drops accents (Röntgen == Rontgen).")
    calculator_abs_tol: float = Field(1e-3, gt=0.0, description="Calculator answers match within this absolute error (TAPO code).")
    calculator_rel_tol: float = Field(1e-6, ge=0.0, lt=1.0, description="... or within this relative error, for large magnitudes.")
    complex_rel_tol: float = Field(0.05, gt=0.0, lt=1.0, description="Complex answers match within this relative error (TAPO code).")
    eos_strings: tuple[str, ...] = Field(
        ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>"), description="End-of-sequence markers allowed after the final answer."
    )
    routing: dict[str, VerifierKind] = Field(
        default_factory=lambda: dict(DEFAULT_SOURCE_ROUTING), description="Problem source -> verifier kind (TAPO Tables 4-5)."
    )
    type_routing: dict[str, VerifierKind] = Field(
        default_factory=lambda: dict(DEFAULT_TYPE_ROUTING), description="Problem type -> verifier kind, for sources not in `routing`."
    )
    tepo: TepoConfig = Field(default_factory=TepoOff, description=(
        "TEPO entropy shaping (a typed choice: off, sparse or dense). Sparse and dense read the sampling entropies, "
        "which only rollout.backend hf records: refused with vllm."))

    def scoring(self) -> dict:
        """Every key but the training-only ones: what scores an answer."""
        return self.model_dump(exclude=set(self.TRAINING_ONLY))
