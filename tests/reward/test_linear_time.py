"""Reading an answer costs time linear in its length, whatever the policy writes.

Found by an audit: an answer of 1,000 spaces took 13 s to check for hedges and 4,000 took 14 minutes (the
alternatives' pattern backtracked cubically), and a run of digits took normalize_math seconds (quadratic): a
policy that degenerates into repetition stalls every reward call of the trainer. Every text reader of the
verifiers runs here on 100,000-character answers made of the pieces such patterns trip on, each call limited to
4 s of the process's CPU time (a CPU-time timer, not wall time, so a busy machine does not fail it): linear
readers need well under a second, a quadratic one minutes.

The readers of the rollout run here too, with the pieces that tripped them: each model family's call parser and
every protocol's `read_segment` (the hermes parser was quadratic in unclosed `<tool_call>` tags: 12 s at 100,000
characters, the chat-tools scorer through it 25 s), the format check with the engine's outputs to find (quadratic
in `<response>x</response>` pairs: 18 s), the scorer of a tag and of a chat-tools trajectory, and the engine's cut
of a tool output.
"""

from __future__ import annotations

import pytest

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pipeline.protocols.answers import last_answer_tag

pytestmark = pytest.mark.integration  # time measured over growing inputs: a minute

PIECES = ["1", "1,", "1 or ", "(", "½", "²", " ", "√", "≈", "\\frac{1}{", "the answer is ", "1.", "\u200b", ",000",
          "\\boxed{", "1–", "\\text{", "x=", "1 ", "{", "\\", " and ", "between 1 and ", "1\n", "$", " (", " /", "^{",
          "<answer>", "<answer>1", "<think>", "</answer>", "**", "`", "*", "_", "\\(", "\\mathbf{", "Answer: ", "٤",
          "1\u202f000", "\u202f", "**Answer:** ", "negative ", "more than ", " or more", "1..", ":.", ">", "\\geq ", "1+",
          " squared", "half of ", " million",
          # the rollout's readers: calls, tags, wrappers, nesting, invalid text, and the hedge words of every language
          "<tool_call>", "</tool_call>", "<tool_call>{", "<response>x</response>", "<response>", "</response>\n", "[",
          '{"a":', '[{"name": "f", "arguments": ', "[TOOL_CALLS] [", "<|python_tag|>{", "```python\n", "```\n",
          "<code>", "</code>", "\ud83d", "\x00", "或", " eller ", "ᴏʀ ", "1 (maybe ", "\\\\ ", "1 или "]
ENDINGS = ["", "!"]
SIZE = 100_000
CALL_LIMIT_S = 4.0  # CPU seconds for one reader on one answer: linear readers need < 1 s, quadratic ones minutes

READ_ALL = textwrap.dedent("""
    import json, signal, sys
    from pipeline.config.reward import RewardConfig
    from pipeline.config.tools import ChatToolsConfig
    from pipeline.protocols import PROTOCOLS, protocol_for, tool_parsers
    from pipeline.reward import RewardScorer, check_format, hedging, numeric, numeval, presentation, qualifiers, textmatch, unicode_math, verifiers
    from pipeline.reward import format as check
    from pipeline.tools import shown
    from pipeline.types import Problem, ToolCall, ToolResult, Trajectory
    tags = protocol_for("tapo")
    protocols = dict(PROTOCOLS)
    scorer, problem = RewardScorer(RewardConfig()), Problem("p", "q", ("1",), "complex", "s", "train")

    def trajectory(s):
        call = ToolCall("code", "c", ToolResult(s[:2000], True), (0, 1), (1, 2))
        return Trajectory("p", (1,), (2, 3), (1, 0), (0.0, 0.0), (call,), "stop", s, 2, segments=(s, s))

    readers = {
        "extract_answer (tapo)": tags.extract_answer, "check_format (tapo)": lambda s: check_format(s, tags, []),
        "visible": presentation.visible, "readable": presentation.readable,
        "ascii_digits": presentation.ascii_digits, "unwrapped": presentation.unwrapped, "ascii_math": unicode_math.ascii_math,
        "normalize_math": numeric.normalize_math.__wrapped__, "number_in_text": numeric.number_in_text,
        "split_top_level": numeric.split_top_level, "evaluate": numeval.evaluate, "tapo_normalize": numeric.tapo_normalize,
        "normalize_text": textmatch.normalize_text.__wrapped__, "asks_for_percentage": verifiers.asks_for_percentage,
        "is_hedged": lambda s: [hedging.is_hedged(s, "1", kind) for kind in ("math", "complex", "fact")],
        "is_hedged (gold)": lambda s: hedging.is_hedged("1", s, "fact"),
        "fast_math_equal": lambda s: verifiers.fast_math_equal(s, "1"),
        "fast_math_equal (gold)": lambda s: verifiers.fast_math_equal("1", s),
        "calculator_score": lambda s: verifiers.calculator_score(s, "1", abs_tol=1e-6, rel_tol=1e-6),
        "complex_score": lambda s: verifiers.complex_score(s, "1", rel_tol=0.05),
        "fact_score": lambda s: textmatch.fact_score(s, "1"), "token_f1": lambda s: textmatch.token_f1(s, "1"),
        "number_span_in_text": numeric.number_span_in_text,
        "is_qualified": lambda s: [qualifiers.is_qualified(s, at, at + 1, evaluates_notation=n)
                                   for at in (0, len(s) // 2, len(s)) for n in (True, False)],
        "check_format (tapo, outputs)": lambda s: [check_format(s, tags, found) for found in (["x"], [s], [s[:500]])],
        "cut_middle": lambda s: shown.cut_middle(s, 1024), "shown_as": lambda s: check.shown_as(s, s[: len(s) // 3]),
        "score (tapo)": lambda s: scorer.score(problem, trajectory(s), protocol=tags, max_policy_tokens=100),
    }
    for family, parser in tool_parsers.PARSERS.items():
        readers[f"parse ({family})"] = parser.parse
        chat = protocol_for("chat-tools", ChatToolsConfig(parser=family))
        readers[f"score (chat-tools, {family})"] = (
            lambda s, chat=chat: scorer.score(problem, trajectory(s), protocol=chat, max_policy_tokens=100))
        protocols[f"chat-tools ({family})"] = chat
    for name, protocol in protocols.items():
        readers[f"read_segment ({name})"] = lambda s, p=protocol: [p.read_segment(s, ("code", "search"), at_eos=e)
                                                                     for e in (False, True)]
        readers[f"grammar_violation ({name})"] = lambda s, p=protocol: p.grammar_violation(s, strict=True,
                                                                                           eos_strings=("<|im_end|>",))
    pieces, endings, size, limit = json.loads(sys.argv[1])

    class TooSlow(Exception):
        pass

    def too_slow(*_):
        raise TooSlow

    signal.signal(signal.SIGPROF, too_slow)
    slow = []
    for piece in pieces:
        for ending in endings:
            answer = piece * (size // len(piece)) + ending
            for name, read in readers.items():
                signal.setitimer(signal.ITIMER_PROF, limit)  # counts this process's CPU time only
                try:
                    read(answer)
                except TooSlow:
                    slow.append(f"{name} on {piece!r} * {size // len(piece)} + {ending!r}")
                finally:
                    signal.setitimer(signal.ITIMER_PROF, 0)
    print(json.dumps(slow))
""")


def test_every_reader_is_linear_in_the_answer(repo_root: Path) -> None:
    child = subprocess.run([sys.executable, "-c", READ_ALL, json.dumps([PIECES, ENDINGS, SIZE, CALL_LIMIT_S])],
                           cwd=repo_root, env=dict(os.environ, PYTHONPATH=str(repo_root)), capture_output=True,
                           text=True, timeout=3600)
    assert child.returncode == 0, child.stderr[-2000:]
    slow = json.loads(child.stdout.strip().splitlines()[-1])
    assert slow == [], f"past {CALL_LIMIT_S} s of CPU on a {SIZE:,}-character answer: {slow}"


ANSWER_PATTERN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@given(st.lists(st.sampled_from(["<answer>", "</answer>", "a", " 1 ", "\n", "<answer", "answer>", "</"]), max_size=14))
def test_the_last_answer_block_is_the_one_the_lazy_pattern_finds(pieces: list[str]) -> None:
    """The linear reading of `<answer>` blocks finds what `<answer>(.*?)</answer>` found, in every interleaving."""
    text = "".join(pieces)
    blocks = ANSWER_PATTERN.findall(text)
    assert last_answer_tag(text) == (blocks[-1].strip() if blocks else None)
