"""chat-tools through the rollout engine, with the embedded SmolLM2 tokenizer and the packaged ChatML tool template:
several calls in a turn run concurrently and are answered in order, as `role: "tool"` messages; malformed calls
are answered, counted and fail the format check; the reward reads the answer through the protocol."""

from __future__ import annotations

import asyncio
import json

import pytest

from pipeline.config import load_config
from pipeline.config.reward import RewardConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.config.tools import ChatToolsConfig, CodeToolEntry, PythonToolEntry, SearchToolEntry
from pipeline.paths import REPO_ROOT
from pipeline.protocols import MALFORMED, protocol_for, protocol_of
from pipeline.reward import check_response, score_trajectory
from pipeline.rollout.engine import RolloutEngine
from pipeline.rollout.offered import tools_for
from pipeline.rollout.prompt_budget import PromptBudget, prompt_overruns
from pipeline.tools.base import tool_specs
from pipeline.tools.user import PythonTool
from pipeline.types import BUILTIN_SPECS, Problem, ToolResult, ToolSpec
from tests.protocols.chat_helpers import (FAMILIES, TEMPLATES, ChatScriptedLM, conversation, family_tokenizer,
                                          turn_end_id, whole_ids)

LOOKUP = ToolSpec("lookup", "Look a word up in the dictionary.",
                  {"type": "object", "properties": {"word": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["word"]})
PROBLEM = Problem("p0", "What is 6 * 7, and what does 'tapo' mean?", ("42",), "complex", "complex", "train")


class SlowTool:
    """A tool double that answers `answers[input]` after `delays[input]` seconds, recording the calls in flight."""

    def __init__(self, name: str, answers: dict[str, str], delays: dict[str, float] | None = None,
                 spec: ToolSpec | None = None) -> None:
        self.name, self.answers, self.delays, self.spec = name, answers, delays or {}, spec
        self.calls: list[str] = []
        self.in_flight = self.max_in_flight = 0

    async def __call__(self, call_input: str) -> ToolResult:
        self.calls.append(call_input)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.delays.get(call_input, 0.0))
        self.in_flight -= 1
        return ToolResult(self.answers.get(call_input, f"no answer for {call_input!r}"), ok=True)

    async def aclose(self) -> None:
        pass


def rollout_of(family: str, turns: list[str], tools: dict, problem: Problem = PROBLEM, **cfg):
    """One trajectory of the scripted turns (texts; each closed by the family's turn closer)."""
    tok, fam = family_tokenizer(family), FAMILIES[family]
    config = RolloutConfig(**{"protocol": "chat-tools", "max_policy_tokens": 400, "max_total_tokens": 2000,
                              "max_tool_calls": 4, "max_turns": 4, "max_tool_output_chars": 200,
                              "chat_tools": ChatToolsConfig(template=fam.template, parser=fam.parser), **cfg})
    eos = turn_end_id(family)
    scripts = [tok(t, add_special_tokens=False, split_special_tokens=True)["input_ids"] + [eos] for t in turns]
    model = ChatScriptedLM(tok, fam.resume, eos, [])
    engine = RolloutEngine(model, tok, tools, config)
    model.scripts.append((engine._new_sequence(problem).prompt_ids, scripts))
    result = engine.rollout([problem], 1)
    return engine, result, result.groups[0].trajectories[0], scripts


def assert_token_exact(engine: RolloutEngine, traj, family: str) -> None:
    """The trajectory is the whole conversation rendered at once (a prefix of it), sampled ids verbatim."""
    tok, protocol = engine.tokenizer, engine.protocol
    offered = engine._new_sequence(PROBLEM).tools
    messages, sampled = conversation(traj, tok, protocol.messages(PROBLEM, offered), turn_end_id(family),
                                     engine.cfg.max_tool_output_chars)
    ids, mask = whole_ids(tok, engine.renderer.template.source, messages, engine.renderer.declarations(offered),
                          sampled)
    full = list(traj.prompt_ids) + list(traj.response_ids)
    assert full == ids[:len(full)]
    assert list(traj.loss_mask) == mask[len(traj.prompt_ids):len(full)]


def test_calls_of_a_turn_run_together_and_are_answered_in_order() -> None:
    # the first call answers last: the results still go back in the order the calls were written
    code = SlowTool("code", {"print(6 * 7)": "42", "print(6 + 7)": "13"}, {"print(6 * 7)": 0.2})
    search = SlowTool("search", {"tapo meaning": "Doc 1 (Title: TAPO) tool-aware policy optimisation"})
    parser = protocol_for("chat-tools").parser
    turns = [parser.render([("code", {"code": "print(6 * 7)"}), ("search", {"query": "tapo meaning"}),
                            ("code", {"code": "print(6 + 7)"})], "I will compute and look it up."),
             "6 * 7 = 42, and TAPO is a policy optimisation method. The answer is \\boxed{42}."]
    engine, result, traj, scripts = rollout_of("hermes", turns, {"code": code, "search": search})
    assert traj.finish_reason == "answer" and traj.turns == 2
    assert [(c.tool, c.input, c.result.output) for c in traj.tool_calls] == [
        ("code", "print(6 * 7)", "42"), ("search", "tapo meaning", search.answers["tapo meaning"]),
        ("code", "print(6 + 7)", "13")]
    assert code.max_in_flight == 2  # both code calls were in flight at once (started together, not in turn)
    assert len({c.output_span for c in traj.tool_calls}) == 1  # one insertion answers all three
    o0, o1 = traj.tool_calls[0].output_span
    inserted = engine.tokenizer.decode(traj.response_ids[o0:o1])
    assert inserted == ("\n<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n"
                        f"{search.answers['tapo meaning']}\n</tool_response>\n<tool_response>\n13\n</tool_response>"
                        "<|im_end|>\n<|im_start|>assistant\n")
    assert_token_exact(engine, traj, "hermes")
    assert [t for t, m in zip(traj.response_ids, traj.loss_mask) if m] == scripts[0] + scripts[1]
    reward = score_trajectory(PROBLEM, traj, RewardConfig(), protocol=engine.protocol, max_policy_tokens=400)
    assert reward.format_ok and reward.predicted == "42" and reward.correct


@pytest.mark.parametrize(("call", "error"), [
    ('<tool_call>\n{"name": "lookup", "arguments": {"word": "tapo"}\n</tool_call>', "not valid JSON"),
    ('<tool_call>\n{"name": "translate", "arguments": {"word": "tapo"}}\n</tool_call>', "unknown tool 'translate'"),
    ('<tool_call>\n{"name": "lookup", "arguments": {"limit": 3}}\n</tool_call>', "'word' is a required property"),
    ('<tool_call>\n{"name": "lookup", "arguments": {"word": "tapo", "lang": "en"}}\n</tool_call>',
     "Additional properties are not allowed ('lang' was unexpected)"),
    ('<tool_call>\n{"name": "lookup", "arguments": {"word": "tapo", "limit": "3"}}\n</tool_call>',
     "'3' is not of type 'integer'"),
    ('<tool_call>\n{"name": "lookup", "arguments": "word=tapo"}\n</tool_call>', "must be a JSON object"),
    ('<tool_call>\n{"name": "lookup", "arguments": {"word": "tapo"}}', "not closed"),
])
def test_a_malformed_call_is_answered_with_its_error_and_fails_the_format(call: str, error: str) -> None:
    lookup = SlowTool("lookup", {json.dumps({"word": "tapo"}): "a method"}, spec=LOOKUP)
    engine, result, traj, _ = rollout_of("hermes", [call, "It is a method: \\boxed{42}."], {"lookup": lookup})
    (answered,) = traj.tool_calls
    assert answered.result.status == MALFORMED and error in answered.result.output, answered.result.output
    assert not lookup.calls  # never run
    assert traj.finish_reason == "answer" and result.stats.malformed_calls == 1
    assert result.stats.as_metrics()["rollout/malformed_calls"] == 1.0
    assert_token_exact(engine, traj, "hermes")
    verdict = check_response(traj, engine.protocol)
    assert not verdict.ok and "malformed tool call" in verdict.reason


def test_a_well_formed_user_tool_call_gets_its_json_arguments() -> None:
    arguments = {"word": "tapo", "limit": 2}
    lookup = SlowTool("lookup", {json.dumps(arguments): "tool-aware policy optimisation"}, spec=LOOKUP)
    call = protocol_for("chat-tools").parser.render([("lookup", arguments)], "")
    engine, _, traj, _ = rollout_of("hermes", [call, "\\boxed{42}"], {"lookup": lookup})
    assert lookup.calls == [json.dumps(arguments)] and traj.tool_calls[0].result.ok
    assert check_response(traj, engine.protocol).ok


def test_budget_exhausted_calls_are_answered_after_the_first_c() -> None:
    code = SlowTool("code", {f"print({i})": str(i) for i in range(3)})
    parser = protocol_for("chat-tools").parser
    call = parser.render([("code", {"code": f"print({i})"}) for i in range(3)], "")
    _, _, traj, _ = rollout_of("hermes", [call, "\\boxed{42}"], {"code": code}, max_tool_calls=2)
    assert code.calls == ["print(0)", "print(1)"]
    assert [c.result.status for c in traj.tool_calls] == ["ok", "ok", "budget"]


def test_a_turn_closed_by_another_end_of_sequence_ends_the_trajectory() -> None:
    tok = family_tokenizer("hermes")
    other = tok.convert_tokens_to_ids("<|endoftext|>")
    code = SlowTool("code", {"print(1)": "1"})
    call = protocol_for("chat-tools").parser.render([("code", {"code": "print(1)"})], "")
    engine, _, _, _ = rollout_of("hermes", ["\\boxed{1}"], {"code": code})
    ids = tok(call, add_special_tokens=False)["input_ids"] + [other]
    dialogue = engine.renderer.start(PROBLEM, ("code",))
    end = engine.renderer.read(dialogue, ids, ("code",), at_eos=True)
    assert end.calls == () and not end.answered  # nothing renders after a closer the template does not use


def test_the_prompt_budget_counts_the_tools_the_template_declares() -> None:
    tok = family_tokenizer("hermes")
    specs = {"code": BUILTIN_SPECS["code"], "lookup": LOOKUP}
    chat = ChatToolsConfig(template="hermes")
    offered = tools_for(PROBLEM, tuple(specs))
    renderer = protocol_for("chat-tools", chat).bind(tok, specs, frozenset({tok.eos_token_id}))
    n = len(renderer.start(PROBLEM, offered).prompt_ids)
    assert "lookup" in offered and n > len(renderer.start(PROBLEM, ("code",)).prompt_ids)
    for total, over in ((n + 99, [(0, n)]), (n + 100, [])):
        rollout = RolloutConfig(protocol="chat-tools", chat_tools=chat, max_total_tokens=total, max_policy_tokens=100)
        assert prompt_overruns([PROBLEM], PromptBudget(tok, rollout, tuple(specs), specs)) == over


@pytest.mark.parametrize("kind", ["complex", "fact", "math"])
def test_curation_counts_the_configured_user_tools_as_training_declares_them(kind: str) -> None:
    """Curation (no tool started yet) and training's load-time check (the started registry) agree on every
    budget around the prompt's length: a row curation keeps is never refused when training loads it."""
    tok = family_tokenizer("hermes")
    entry = PythonToolEntry(name="lookup", description="Look a word up in the dictionary. " * 8,
                            parameters=LOOKUP.parameters, function="tests.tools.user_functions:lookup")
    chat = ChatToolsConfig(template="hermes")
    problem = Problem("p1", "What does 'tapo' mean?", ("a method",), kind, kind, "train")
    registry = {"code": SlowTool("code", {}), "search": SlowTool("search", {}), "lookup": PythonTool(entry)}
    started = (tuple(registry), tool_specs(registry))
    bare = RolloutConfig(protocol="chat-tools", chat_tools=chat, max_total_tokens=101, max_policy_tokens=100)
    [(_, without_user_tools)] = prompt_overruns([problem], PromptBudget.before_start(tok, bare))
    for total in range(3000, 100, -50):
        rollout = RolloutConfig(protocol="chat-tools", chat_tools=chat, max_total_tokens=total, max_policy_tokens=100,
                                tools=(CodeToolEntry(), SearchToolEntry(), entry))
        curation = prompt_overruns([problem], PromptBudget.before_start(tok, rollout))
        assert curation == prompt_overruns([problem], PromptBudget(tok, rollout, *started))
        if curation:
            [(_, n)] = curation
            break
    assert n > without_user_tools  # the user tool's schema is in the prompt curation measures


def test_the_chat_tools_params_file_loads_and_binds_to_smollm2() -> None:
    cfg = load_config(REPO_ROOT / "configs" / "chat-tools.yaml")
    tok = family_tokenizer("hermes")
    renderer = protocol_of(cfg.rollout).bind(tok, BUILTIN_SPECS, frozenset({tok.eos_token_id}))
    assert "<tool_call>" in tok.decode(renderer.start(PROBLEM, ("code",)).prompt_ids)


def test_a_drift_the_set_up_probe_missed_ends_its_trajectory_instead_of_training_on_it(tmp_path) -> None:
    """A template that rewrites an earlier turn only for some contents passes the set-up probe; the turn where it
    drifts ends that trajectory, naming why (finish reason "error", the format penalty), rather than yielding a
    trajectory the template would not show the model, or stopping the rollout."""
    source = (TEMPLATES / "chatml_tools.jinja").read_text().replace(
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}",
        "{{- '<|im_start|>' + message.role + '\\n' + message.content.replace('forget', '') + '<|im_end|>\\n' }}")
    assert "replace('forget'" in source
    path = tmp_path / "forgetful.jinja"
    path.write_text(source)
    call = protocol_for("chat-tools").parser.render([("code", {"code": "print(1)"})], "I forget.")
    engine, _, traj, scripts = rollout_of("chatml", [call, "\\boxed{1}"], {"code": SlowTool("code", {"print(1)": "1"})},
                                          chat_tools=ChatToolsConfig(template=str(path)))
    assert traj.finish_reason == "error" and "does not render the conversation incrementally" in traj.error
    assert list(traj.response_ids) == scripts[0] and traj.tool_calls == ()  # nothing of the drifted reply
    reward = score_trajectory(PROBLEM, traj, RewardConfig(), protocol=engine.protocol, max_policy_tokens=400)
    assert not reward.format_ok and reward.format == RewardConfig().format_penalty
