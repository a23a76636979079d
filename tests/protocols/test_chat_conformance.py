"""Conformance of chat-tools tool turns, for every chat template family of the suite (written for the tests from
the published formats: ChatML/hermes with tools, the packaged hermes template, Llama 3, Mistral), with the
embedded SmolLM2 tokenizer.

Property (hypothesis): random conversations through the real rollout engine, with random calls (valid,
several per turn, malformed in every way), tool results holding special-token text, results far longer than
`max_tool_output_chars`, random budgets, and sampled ids that are not the tokenizer's own tokenization of their
text. Each finished trajectory must be a prefix of its whole conversation rendered at once and tokenized by the
definition (the template's text with its special tokens, every content as plain text, the model's turns as
the ids it sampled), with loss mask 1 exactly on the sampled ids. And a template that cannot be rendered turn by
turn (it strips earlier reasoning) is refused at set-up.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pipeline.config.rollout import RolloutConfig
from pipeline.config.tools import ChatToolsConfig
from pipeline.protocols import MALFORMED, TemplateError, protocol_for
from pipeline.reward import check_response
from pipeline.rollout.engine import RolloutEngine
from pipeline.types import BUILTIN_SPECS, Problem, ToolResult, ToolSpec
from tests.protocols.chat_helpers import (FAMILIES, STRIPS_REASONING, ChatScriptedLM, conversation,

                                          family_tokenizer, shown, smollm2_tokenizer, turn_end_id, whole_ids)

pytestmark = pytest.mark.integration  # every chat template over real tokenizers

LOOKUP = ToolSpec("lookup", "Look a word up.", {"type": "object", "required": ["word"],
                                                "properties": {"word": {"type": "string"}, "n": {"type": "integer"}}})
SPECIAL_TEXT = ["<|im_end|>", "<|im_start|>user\n", "<|endoftext|>", "<|eot_id|>", "<|start_header_id|>", "</s>",
                "[INST]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "<tool_call>", "</tool_response>", "\x00", "\ufffd"]
MARKERS = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "\x01")
PROBLEM = Problem("p", "Look up 'tapo', then compute 6 * 7.", ("42",), "complex", "complex", "train")

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01"), max_size=40)
special_rich = st.lists(st.one_of(st.sampled_from(SPECIAL_TEXT), text), max_size=6).map("".join)
prose = special_rich.filter(lambda t: not any(m in t for m in MARKERS))
output = st.one_of(special_rich, st.text(min_size=250, max_size=700).map(lambda t: t.replace("\x01", "")))
VALID = ("code", "search", "lookup")
KINDS = VALID * 2 + ("bad_json", "unknown", "missing", "extra", "wrong_type")  # valid calls half the time


class Replies:
    """Every tool of the run: the k-th call (over all tools) gets the k-th drawn reply (text, ok)."""

    def __init__(self, replies: list[tuple[str, bool]]) -> None:
        self.replies, self.count = replies, itertools.count()

    def tool(self, name: str, spec: ToolSpec):
        replies = self

        class Tool:
            async def __call__(self, call_input: str) -> ToolResult:
                out, ok = replies.replies[next(replies.count) % len(replies.replies)]
                return ToolResult(out, ok=ok, status="ok" if ok else "error")

            async def aclose(self) -> None:
                pass

        tool = Tool()
        tool.name, tool.spec = name, spec
        return tool


def call_of(kind: str, arg: str) -> tuple[str, dict]:
    """A call of `kind`: valid, or malformed in one way (bad JSON is made by `render_turn`)."""
    return {"code": ("code", {"code": arg}), "search": ("search", {"query": arg}),
            "lookup": ("lookup", {"word": arg, "n": 2}), "bad_json": ("lookup", {"word": arg}),
            "unknown": ("translate", {"word": arg}), "missing": ("lookup", {"n": 1}),
            "extra": ("code", {"code": arg, "timeout": 3}), "wrong_type": ("lookup", {"word": arg, "n": "two"})}[kind]


def render_turn(parser, calls: list[tuple[str, str]], thought: str) -> str:
    """A call turn: the family's rendering; a bad-JSON call loses its last closing brace."""
    rendered = parser.render([call_of(kind, arg) for kind, arg in calls], thought)
    if any(kind == "bad_json" for kind, _ in calls):
        cut = rendered.rfind("}")
        rendered = rendered[:cut] + rendered[cut + 1:]
    return rendered


def sampled_ids(tok, turn: str, cuts: list[int], eos: int) -> list[int]:
    """The turn's ids as a model may sample them: the text tokenized in pieces (not the tokenizer's own
    merges across the cuts), special-token text spelled out, then the turn closer."""
    points = sorted({min(max(c, 0), len(turn)) for c in cuts} | {0, len(turn)})
    ids = []
    for a, b in itertools.pairwise(points):
        ids += tok(turn[a:b], add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return ids + [eos]


@st.composite
def scripts(draw, family: str) -> list[str]:
    parser = protocol_for("chat-tools", ChatToolsConfig(parser=FAMILIES[family].parser)).parser
    turns = []
    for _ in range(draw(st.integers(0, 3))):
        calls = draw(st.lists(st.tuples(st.sampled_from(KINDS), special_rich), min_size=1, max_size=3))
        turns.append(render_turn(parser, calls, draw(prose)))
    answer = draw(prose.filter(lambda t: t.strip() and not t.strip().startswith("{")))
    return turns + [answer + draw(st.sampled_from(["", " \\boxed{42}"]))]


@pytest.mark.parametrize("family", sorted(FAMILIES))
# One example is a whole rollout: no shrinking (it takes minutes); a failing example prints its draws.
@settings(max_examples=15, deadline=None, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_every_tool_turn_is_the_templates_own_rendering(family: str, data: st.DataObject) -> None:
    tok, fam, eos = family_tokenizer(family), FAMILIES[family], turn_end_id(family)
    replies = Replies(data.draw(st.lists(st.tuples(output, st.booleans()), min_size=1, max_size=4)))
    tools = {s.name: replies.tool(s.name, s) for s in (BUILTIN_SPECS["code"], BUILTIN_SPECS["search"], LOOKUP)}
    turns = data.draw(scripts(family))
    ids = [sampled_ids(tok, t, data.draw(st.lists(st.integers(0, len(t)), max_size=4)), eos) for t in turns]
    room, policy = data.draw(st.integers(40, 900)), data.draw(st.integers(20, 500))
    model = ChatScriptedLM(tok, fam.resume, eos, [])
    cfg = RolloutConfig(protocol="chat-tools", chat_tools=ChatToolsConfig(template=fam.template, parser=fam.parser),
                        max_tool_calls=data.draw(st.integers(0, 4)), max_turns=data.draw(st.integers(2, 5)),
                        max_tool_output_chars=data.draw(st.integers(32, 200)), max_total_tokens=400 + room,
                        max_policy_tokens=min(policy, 399 + room), temperature=1.0)
    engine = RolloutEngine(model, tok, tools, cfg)
    seq = engine._new_sequence(PROBLEM)
    model.scripts.append((seq.prompt_ids, ids))
    result = engine.rollout([PROBLEM], data.draw(st.integers(1, 2)))
    for traj in result.groups[0].trajectories:
        check_trajectory(engine, traj, seq, eos, ids)
    malformed = sum(c.result.status == MALFORMED for g in result.groups for t in g.trajectories for c in t.tool_calls)
    assert result.stats.malformed_calls == malformed


def check_trajectory(engine: RolloutEngine, traj, seq, eos: int, script: list[list[int]]) -> None:
    tok, cfg = engine.tokenizer, engine.cfg
    messages, sampled = conversation(traj, tok, engine.protocol.messages(PROBLEM, seq.tools), eos,
                                     cfg.max_tool_output_chars)
    ids, mask = whole_ids(tok, engine.renderer.template.source, messages, engine.renderer.declarations(seq.tools),
                          sampled)
    full = list(traj.prompt_ids) + list(traj.response_ids)
    assert full == ids[:len(full)], traj.finish_reason
    assert list(traj.loss_mask) == mask[len(traj.prompt_ids):len(full)]
    assert len(full) <= cfg.max_total_tokens and traj.policy_token_count <= cfg.max_policy_tokens
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask) if not m)
    policy = [t for t, m in zip(traj.response_ids, traj.loss_mask) if m]
    assert policy == list(itertools.chain(*script))[:len(policy)]  # the sampled ids, verbatim
    for call in traj.tool_calls:
        assert len(shown(call.result.output, call.result.ok, cfg.max_tool_output_chars)) <= cfg.max_tool_output_chars
    verdict = check_response(traj, engine.protocol)
    if any(c.result.status == MALFORMED for c in traj.tool_calls):
        assert not verdict.ok


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_conversation_with_every_hazard_is_token_exact(family: str) -> None:
    """Whatever the draws: two calls in a turn, results holding every family's special-token text (encoded as
    text), a result far past max_tool_output_chars (cut), an empty one, then a malformed call, then the answer."""
    tok, fam, eos = family_tokenizer(family), FAMILIES[family], turn_end_id(family)
    replies = Replies([("".join(SPECIAL_TEXT), True), ("x" * 400 + "".join(SPECIAL_TEXT) + "y" * 400, True),
                       ("", True), ("", False)])
    tools = {s.name: replies.tool(s.name, s) for s in (BUILTIN_SPECS["code"], BUILTIN_SPECS["search"], LOOKUP)}
    parser = protocol_for("chat-tools", ChatToolsConfig(parser=fam.parser)).parser
    turns = [render_turn(parser, [("code", "print(1)"), ("lookup", "tapo")], "Two at once."),
             render_turn(parser, [("search", "q"), ("code", "print(2)")], ""),
             render_turn(parser, [("wrong_type", "tapo")], "Once more."), "It is \\boxed{42}."]
    ids = [sampled_ids(tok, t, [3, 10], eos) for t in turns]
    model = ChatScriptedLM(tok, fam.resume, eos, [])
    cfg = RolloutConfig(protocol="chat-tools", chat_tools=ChatToolsConfig(template=fam.template, parser=fam.parser),
                        max_tool_calls=4, max_turns=4, max_tool_output_chars=64, max_total_tokens=3000,
                        max_policy_tokens=1000)
    engine = RolloutEngine(model, tok, tools, cfg)
    seq = engine._new_sequence(PROBLEM)
    model.scripts.append((seq.prompt_ids, ids))
    traj = engine.rollout([PROBLEM], 1).groups[0].trajectories[0]
    assert traj.finish_reason == "answer" and [c.result.status for c in traj.tool_calls] == [
        "ok", "ok", "ok", "error", MALFORMED]
    check_trajectory(engine, traj, seq, eos, ids)
    assert not check_response(traj, engine.protocol).ok


def test_a_template_that_strips_earlier_reasoning_is_refused_at_set_up() -> None:
    tok = smollm2_tokenizer()
    cfg = RolloutConfig(protocol="chat-tools", chat_tools=ChatToolsConfig(template=str(STRIPS_REASONING)))
    with pytest.raises(TemplateError, match="does not render the conversation incrementally"):
        RolloutEngine(ChatScriptedLM(tok, "", tok.eos_token_id, []), tok, {}, cfg)


SYSTEM_WITH_TOOLS = "{% if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
GENERATION = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


@pytest.mark.parametrize(("template", "error"), [
    ("", "ignores the tools it is given"),  # SmolLM2's own template has no tool support
    (SYSTEM_WITH_TOOLS + "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n"
     "{% endfor %}" + GENERATION, "does not render the conversation incrementally"),
    (SYSTEM_WITH_TOOLS + "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | tojson }}<|im_end|>\n"
     "{% endfor %}" + GENERATION, "content"),
    (SYSTEM_WITH_TOOLS + "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}\n{% endfor %}"
     + GENERATION, "end-of-sequence token"),
])
def test_templates_chat_tools_cannot_train_with_are_refused_naming_why(tmp_path, template: str, error: str) -> None:
    tok = smollm2_tokenizer()
    path = tmp_path / "t.jinja"
    path.write_text(template)
    cfg = ChatToolsConfig(template=str(path) if template else "")
    with pytest.raises(TemplateError, match=error):
        protocol_for("chat-tools", cfg).bind(tok, BUILTIN_SPECS, frozenset({tok.eos_token_id}))
