"""Map one raw row of a known data set to (question, answers, meta).

Each adapter knows the field names of its data set as published (and of the common
FlashRAG/Hugging Face variants) and raises `RowError` with a reason for a row it cannot use;
the caller records that row in rejected.jsonl and goes on.

Answer extraction:
- GSM8K: the text after the last `####`, thousands separators removed.
- MATH/MATH500/Minerva: the `answer` field, else the last `\\boxed{}` of `solution`.
- OlympiadBench: `final_answer` (a list) with `$` delimiters stripped; multi-part answers joined.
- NQ-open: the question gets a trailing "?" (as in Search-R1 and TAPO's NQ processing).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

Adapted = tuple[str, list[str], dict[str, Any]]


class RowError(ValueError):
    """A row that cannot become a Problem; the message is the rejection reason."""


def _field(row: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in row and row[key] is not None:
            return row[key]
    raise RowError(f"missing field {' or '.join(repr(k) for k in keys)}")


def _text(row: dict[str, Any], *keys: str) -> str:
    value = _field(row, *keys)
    if not isinstance(value, str):
        raise RowError(f"field {keys[0]!r} must be a string, got {type(value).__name__}")
    value = value.strip()
    if not value:
        raise RowError(f"field {keys[0]!r} is empty")
    return value


def _answer_text(value: Any, key: str) -> str:
    if isinstance(value, bool):
        raise RowError(f"answer in {key!r} must be a string or number, got bool")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RowError(f"answer in {key!r} is not a finite number")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value.strip()
    raise RowError(f"answer in {key!r} must be a string or number, got {type(value).__name__}")


def _answers(row: dict[str, Any], *keys: str) -> list[str]:
    value = _field(row, *keys)
    items = value if isinstance(value, list | tuple) else [value]
    answers = [_answer_text(v, keys[0]) for v in items]
    answers = [a for a in answers if a]
    if not answers:
        raise RowError(f"empty answer in {keys[0]!r}")
    return list(dict.fromkeys(answers))  # drop repeated aliases, keep order


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (braces balanced) or `\\boxed x`; None if absent."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        idx = text.rfind("\\boxed ")
        return text[idx + len("\\boxed "):].split("$")[0].strip() or None if idx >= 0 else None
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j].strip() or None
    return None


def _strip_dollars(answer: str) -> str:
    answer = answer.strip()
    while len(answer) >= 2 and answer.startswith("$") and answer.endswith("$"):
        answer = answer[1:-1].strip()
    return answer


def _unquote_csv_artifact(question: str) -> str:
    # Some TriviaQA exports keep CSV quoting: "\"Who wrote \"\"A ...\"\"?\"".
    if len(question) > 2 and question[0] == question[-1] == '"' and '""' in question:
        return question[1:-1].replace('""', '"')
    return question


def gsm8k(row: dict[str, Any]) -> Adapted:
    solution = _text(row, "answer")
    if "####" not in solution:
        raise RowError("no '####' answer marker in 'answer'")
    answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not answer:
        raise RowError("empty answer after '####'")
    return _text(row, "question"), [answer], {}


def math_solution(row: dict[str, Any]) -> Adapted:
    question = _text(row, "problem", "question")
    answer = row.get("answer")
    if isinstance(answer, str | int | float) and not isinstance(answer, bool) and _answer_text(answer, "answer"):
        answers = [_answer_text(answer, "answer")]
    else:
        boxed = last_boxed(_text(row, "solution"))
        if boxed is None:
            raise RowError("no 'answer' field and no \\boxed{} in 'solution'")
        answers = [boxed]
    meta = {k: row[k] for k in ("level", "subject", "type", "unique_id") if isinstance(row.get(k), str | int)}
    return question, answers, meta


def competition(row: dict[str, Any]) -> Adapted:
    """AIME / AMC rows: `problem` or `question`, a string or numeric `answer`."""
    question = _text(row, "problem", "question")
    answers = [_strip_dollars(a) for a in _answers(row, "answer")]
    meta = {k: row[k] for k in ("id", "url") if isinstance(row.get(k), str | int)}
    return question, answers, meta


def _inline_math(answer: str) -> str:
    # OlympiadBench writes several values as "$69$,$84$" or "$f(x)=x$, $g(x)=1$": drop the
    # unescaped inline-math delimiters and a trailing full stop.
    return re.sub(r"(?<!\\)\$", "", answer).strip().rstrip(".").strip()


def olympiadbench(row: dict[str, Any]) -> Adapted:
    question = _text(row, "question")
    context = row.get("context")
    if isinstance(context, str) and context.strip():
        question = f"{context.strip()}\n\n{question}"
    parts = [_inline_math(a) for a in _answers(row, "final_answer")]
    answers = [", ".join(parts)] if row.get("is_multiple_answer") is True else parts
    meta = {k: row[k] for k in ("id", "subfield", "answer_type", "unit") if isinstance(row.get(k), str | int)}
    return question, answers, meta


def deepmath(row: dict[str, Any]) -> Adapted:
    question = _text(row, "question", "prompt")
    answers = [_strip_dollars(a) for a in _answers(row, "final_answer", "ground_truth")]
    meta = {"difficulty": str(row["difficulty"])} if "difficulty" in row else {}
    return question, answers, meta


def nq_open(row: dict[str, Any]) -> Adapted:
    question = _text(row, "question")
    if not question.endswith("?"):
        question += "?"
    return question, _answers(row, "answer", "golden_answers"), {}


def _trivia_answers(row: dict[str, Any]) -> list[str]:
    value = row.get("answer")
    if isinstance(value, dict):  # Hugging Face trivia_qa: {"value": ..., "aliases": [...]}
        return _answers({"answer": [value.get("value"), *(value.get("aliases") or [])]}, "answer")
    return _answers(row, "golden_answers", "answer")


def triviaqa(row: dict[str, Any]) -> Adapted:
    return _unquote_csv_artifact(_text(row, "question")), _trivia_answers(row), {}


def popqa(row: dict[str, Any]) -> Adapted:
    possible = row.get("possible_answers")
    if isinstance(possible, str) and possible.startswith("["):  # the hub's PopQA stores a JSON list as text
        try:
            row = {**row, "possible_answers": json.loads(possible)}
        except json.JSONDecodeError:
            raise RowError("field 'possible_answers' is not a valid JSON list") from None
    metadata = row.get("metadata")
    meta_in = metadata if isinstance(metadata, dict) else row
    meta = {k: meta_in[k] for k in ("prop", "s_pop") if isinstance(meta_in.get(k), str | int)}
    return _text(row, "question"), _answers(row, "golden_answers", "possible_answers"), meta


def multihop_qa(row: dict[str, Any]) -> Adapted:
    """HotpotQA, 2WikiMultihopQA, MuSiQue, Bamboogle: question + answer (or golden_answers)."""
    question = _text(row, "question", "Question")
    answers = _answers(row, "golden_answers", "answer", "Answer")
    aliases = row.get("answer_aliases")
    if isinstance(aliases, list):
        answers += [a.strip() for a in aliases if isinstance(a, str) and a.strip() and a.strip() not in answers]
    meta = {k: row[k] for k in ("type", "level") if isinstance(row.get(k), str)}
    return question, answers, meta


def verl(row: dict[str, Any]) -> Adapted:
    """verl-style rows (ToRL's and TAPO's parquet files): chat `prompt`, `reward_model.ground_truth`.

    The question is the `question` column when there is one (TAPO's release), else the last
    user message of `prompt`; ground_truth may be a string, a list, or TAPO's `{"target": [...]}`.
    """
    if isinstance(row.get("question"), str):
        question = _text(row, "question")
    else:
        messages = _field(row, "prompt")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise RowError("field 'prompt' must be a list of chat messages")
        users = [m.get("content") for m in messages if m.get("role") == "user"]
        question = _text({"prompt": users[-1] if users else None}, "prompt")
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict):
        raise RowError("field 'reward_model' must be an object")
    truth = reward_model.get("ground_truth")
    if isinstance(truth, dict):
        truth = truth.get("target")
    answers = [_strip_dollars(a) for a in _answers({"ground_truth": truth}, "ground_truth")]
    meta = {"data_source": row["data_source"]} if isinstance(row.get("data_source"), str) else {}
    return question, answers, meta


ADAPTERS: dict[str, Callable[[dict[str, Any]], Adapted]] = {
    "gsm8k": gsm8k,
    "math": math_solution,
    "aime": competition,
    "amc": competition,
    "olympiadbench": olympiadbench,
    "deepmath": deepmath,
    "nq_open": nq_open,
    "triviaqa": triviaqa,
    "popqa": popqa,
    "hotpotqa": multihop_qa,
    "2wikimultihopqa": multihop_qa,
    "musique": multihop_qa,
    "bamboogle": multihop_qa,
    "verl": verl,
}


def get_adapter(name: str) -> Callable[[dict[str, Any]], Adapted]:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise ValueError(f"unknown adapter {name!r}; known: {sorted(ADAPTERS)}") from None
