"""Rule-based filters: malformed rows, invalid answers, time-ambiguous questions.

Each check returns None for a good row or a short reason string for a rejected one, so the
caller can write the reason next to the row in rejected.jsonl.

Time ambiguity (TAPO's NQ curation): TAPO removes "temporally ambiguous questions that lack
explicit time constraints, such as 'What is the GDP of a certain region this year?'" but does
not publish its rule. Ours, `TIME_CUES`, is a list of named patterns (deictic time words,
"current"/"latest"/"now"-style words, "last time", present-perfect counts such as "how many
times has X won") that fire only when the question has no explicit year. It is deliberately
precise rather than exhaustive; an LLM judge can be layered on top through the multi-LLM stage.

Invalid math answers: "unparsable" is a structural LaTeX check (balanced braces, brackets and
`\\left`/`\\right`, no stray `$`). We do not call math-verify's parser here: it returns no
expression for legitimate answers such as `\\aleph_0` or `\\mathbb{Z}_8` and costs ~3 ms a row.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from pipeline.config.curate import FilterConfig
from pipeline.types import Problem

TIME_CUES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("this-period", r"\bthis (?:year|month|week|season|decade|century|term|summer|winter|spring|fall)\b"),
        ("current", r"\b(?:current|currently|presently|present-day|nowadays|at present|right now|as of now|as of today)\b"),
        ("now", r"\bnow\b"),
        ("today", r"\btoday(?:'s)?\b"),
        # Not "recently": "released more recently" compares two dates, "the recently abdicated
        # queen" is history; both are common in multi-hop sets.
        ("latest", r"\b(?:latest|newest|most recent|upcoming|incumbent|reigning)\b"),
        ("last-time", r"\blast (?:time|year|month|week|season|election)\b(?! of)"),
        ("so-far", r"\b(?:so far|to date|until now|up to now|as of yet|still)\b"),
        ("next", r"\b(?:the next|next year|next season)\b"),
        ("present-perfect-count", r"\bhow many (?:\w+ ){0,4}(?:has|have) (?:[\w.'-]+ ){0,6}(?:won|played|scored|appeared in|been to)\b"),
    )
)
_YEAR = re.compile(r"\b(?:1[0-9]{3}|20[0-9]{2})s?\b")


def time_ambiguity(question: str) -> str | None:
    """The name of the first time cue in a question without an explicit year, else None.

    Cues match lower-case words only (the first letter of the question is lowered first), so
    capitalised titles and names such as "Standing Still" or "USA TODAY" do not trigger them.
    """
    if _YEAR.search(question):
        return None
    text = question[:1].lower() + question[1:]
    for name, pattern in TIME_CUES:
        if pattern.search(text):
            return name
    return None


def malformed(problem: Problem, cfg: FilterConfig) -> str | None:
    """Absurdly long fields or too many aliases (a sign of a broken export)."""
    if len(problem.question) > cfg.max_question_chars:
        return f"question has {len(problem.question)} chars (max {cfg.max_question_chars})"
    if len(problem.answers) > cfg.max_answers:
        return f"{len(problem.answers)} answers (max {cfg.max_answers})"
    longest = max(len(a) for a in problem.answers)
    if longest > cfg.max_answer_chars:
        return f"answer has {longest} chars (max {cfg.max_answer_chars})"
    if "\x00" in problem.question:
        return "question contains a NUL character"
    return None


def _balanced(text: str) -> bool:
    depth = 0
    pairs = {"{": 1, "}": -1}
    escaped = False
    for ch in text:
        if escaped:  # \{ and \} are literal braces
            escaped = False
            continue
        if ch == "\\":
            escaped = True
            continue
        depth += pairs.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0 and text.count("\\left") == text.count("\\right")


def invalid_math_answer(answer: str) -> str | None:
    core = answer.strip().strip("$").strip()
    if not core:
        return "empty math answer"
    if "$" in core.replace("\\$", ""):  # an escaped dollar sign (\$36) is part of the answer
        return f"stray '$' in math answer {answer!r}"
    if not _balanced(core):
        return f"unbalanced braces in math answer {answer!r}"
    return None


def invalid_answer(problem: Problem) -> str | None:
    """Answers the verifier of this problem's type could never match."""
    if not problem.answers or any(not a.strip() for a in problem.answers):
        return "empty answer"
    if problem.type == "math":
        return next((r for r in map(invalid_math_answer, problem.answers) if r), None)
    if problem.type == "calculator":
        try:
            Decimal(problem.answers[0].replace(",", ""))
        except InvalidOperation:
            return f"calculator answer {problem.answers[0]!r} is not a number"
        return None
    if not any(re.search(r"\w", a) for a in problem.answers):
        return "answer has no letters or digits"
    return None


def rule_rejection(problem: Problem, cfg: FilterConfig) -> tuple[str, str] | None:
    """(filter name, reason) of the first rule a row breaks, or None if it passes them all."""
    reason = malformed(problem, cfg)
    if reason:
        return "malformed", reason
    reason = invalid_answer(problem)
    if reason:
        return "invalid_answer", reason
    if cfg.time_ambiguous and problem.type in cfg.time_ambiguous_types:
        cue = time_ambiguity(problem.question)
        if cue:
            return "time_ambiguous", f"time cue '{cue}' and no explicit year"
    return None
