"""SFT traces are really executed, verified and masked; the SFT loss goes down."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from mlflow import MlflowClient

from pipeline.config import config_from_dict
from pipeline.config.rollout import RolloutConfig
from pipeline.config.tools import ChatToolsConfig
from pipeline.data.calculator import generate
from pipeline.config.reward import RewardConfig
from pipeline.jsonl import write_problems
from pipeline.model import load_policy
from pipeline.protocols import TapoProtocol, protocol_for
from pipeline.protocols.chat_tools import template_source
from pipeline.rollout.engine import RolloutEngine
from pipeline.sft import THOUGHTS, Trace, scripted_traces, sft_step, to_batch
from pipeline.sft import run as sft_run
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.search import SearchClient
from pipeline.types import BUILTIN_SPECS, Problem
from tests.helpers.tiny import tiny_llama, tiny_tokenizer
from tests.protocols.chat_helpers import family_tokenizer, turn_end_id, whole_ids


def test_traces_run_in_the_sandbox_and_mask_tool_output(code_sandbox_url: str) -> None:
    tok = tiny_tokenizer()
    problems = generate(6, seed=1)
    wrong = dataclasses.replace(problems[0], id="wrong", meta={**problems[0].meta, "code": "print(1 / 0)"})
    no_code = dataclasses.replace(problems[1], id="no-code", meta={})
    traces = scripted_traces(problems + [wrong, no_code], tok, TapoProtocol(),
                             {"code": CodeSandboxClient(code_sandbox_url)}, RewardConfig(), max_output_chars=200)
    assert [t.problem_id for t in traces] == [p.id for p in problems]  # failing and code-less problems dropped
    for trace, problem in zip(traces, problems):
        text = tok.decode(trace.input_ids)
        answer = problem.answers[0]
        assert "<response>\n" in text and "<answer>" in text
        masked = tok.decode([i for i, m in zip(trace.input_ids, trace.loss_mask) if m == 0])
        taught = tok.decode([i for i, m in zip(trace.input_ids, trace.loss_mask) if m == 1])
        assert "<response>" in masked and "<response>" not in taught  # tool output is never a target
        assert problem.meta["code"] in taught and taught.endswith("</answer>" + tok.eos_token)
        assert trace.input_ids[-1] == tok.eos_token_id
        assert answer.split(".")[0] in taught


def test_fact_traces_search_for_real_and_alternate_with_code_traces(code_sandbox_url: str, wiki_search_url: str) -> None:
    """A question the fact verifier scores is taught as a real search whose visible output shows the answer the
    trace gives; both tools are offered in every prompt (type complex), and the two kinds alternate."""
    tok = tiny_tokenizer()
    calculator = [dataclasses.replace(p, type="complex") for p in generate(3, seed=2)]
    facts = [Problem(f"f{i}", q, a, "complex", "wiki_facts", "train") for i, (q, a) in enumerate([
        ("What is the capital of Algeria?", ("Algiers",)),
        ('Which subject is described as "a political philosophy that advocates self-governed societies"?',
         ("Anarchism",)),
        ("What is the capital of Atlantis, the lost city?", ("Poseidonis",))])]  # nothing shows it: no trace
    tools = {"code": CodeSandboxClient(code_sandbox_url), "search": SearchClient(wiki_search_url)}
    traces = scripted_traces(facts + calculator, tok, TapoProtocol(), tools, RewardConfig(), max_output_chars=1024)
    assert [t.problem_id for t in traces] == [calculator[0].id, "f0", calculator[1].id, "f1", calculator[2].id]
    for trace in traces:
        text = tok.decode(trace.input_ids)
        assert "<search>" in text.split("<|im_start|>assistant")[0] and "<code>" in text.split("<|im_start|>assistant")[0]
    for trace, answer in ((traces[1], "Algiers"), (traces[3], "Anarchism")):
        masked = tok.decode([i for i, m in zip(trace.input_ids, trace.loss_mask) if m == 0])
        taught = tok.decode([i for i, m in zip(trace.input_ids, trace.loss_mask) if m == 1])
        assert "<search>" in taught and f"<answer>{answer}</answer>" in taught
        assert answer in masked.split("<response>", 1)[1]  # the answer was read from the real search output


def test_sft_loss_decreases() -> None:
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=0)
    ids = tok("<think>x</think><code>print(6 * 7)</code>")["input_ids"]
    trace = Trace("t", tuple(ids), tuple([0] * 3 + [1] * (len(ids) - 3)))
    batch = to_batch([trace, trace], tok.pad_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = [sft_step(model, opt, batch, micro_size=1) for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_traces_sharing_their_system_turn_train_as_a_prefix_tree_to_the_same_step(checkpointing: bool) -> None:
    """Rows that open alike run their shared tokens once: the step's loss and the updated weights are those
    of the padded rows (float64), with or without gradient checkpointing (the `sft` stage's default)."""
    tok = tiny_tokenizer()
    system = tok("<|im_start|>system\nThe quick brown fox jumps over the lazy dog.<|im_end|>\n")["input_ids"]
    traces = []
    for i, text in enumerate(("<code>print(6 * 7)</code>", "<answer>42</answer>", "<search>capital</search>")):
        ids = system + tok(f"What is {i}?")["input_ids"] + tok(text)["input_ids"]
        traces.append(Trace(f"t{i}", tuple(ids), tuple([0] * (len(ids) - 6) + [1] * 6)))
    batch = to_batch(traces, tok.pad_token_id)
    batch = dataclasses.replace(batch, loss_mask_BT=batch.loss_mask_BT.double())
    results = []
    for share in (True, False):
        model = tiny_llama(len(tok), seed=4, dtype=torch.float64)
        if checkpointing:
            model.gradient_checkpointing_enable()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        results.append((sft_step(model, opt, batch, micro_size=3, share_prefixes=share),
                        torch.cat([p.detach().flatten() for p in model.parameters()])))
    (tree_loss, tree_weights), (padded_loss, padded_weights) = results
    assert abs(tree_loss - padded_loss) < 1e-9
    torch.testing.assert_close(tree_weights, padded_weights, atol=1e-7, rtol=0)


def test_chat_tools_traces_are_the_conversation_a_rollout_renders(code_sandbox_url: str) -> None:
    """A chat-tools trace (SmolLM2's tokenizer, the packaged ChatML tool template) is its whole conversation
    rendered at once, the teacher's turns (and their closers) the only targets."""
    tok, eos = family_tokenizer("hermes"), turn_end_id("hermes")
    protocol = protocol_for("chat-tools", ChatToolsConfig(template="hermes"))
    problems = generate(4, seed=2)
    traces = scripted_traces(problems, tok, protocol, {"code": CodeSandboxClient(code_sandbox_url)}, RewardConfig(),
                             max_output_chars=200)
    assert [t.problem_id for t in traces] == [p.id for p in problems]
    source = template_source("hermes", tok)
    for trace, problem in zip(traces, problems):
        answer = problem.answers[0]
        turns = [protocol.render_call("code", problem.meta["code"], THOUGHTS["code"]), protocol.render_answer(answer)]
        messages = protocol.messages(problem, ("code",))
        sampled = {len(messages): tok(turns[0], add_special_tokens=False)["input_ids"],
                   len(messages) + 2: tok(turns[1], add_special_tokens=False)["input_ids"]}
        messages += [{"role": "assistant", "content": turns[0]}, {"role": "tool", "name": "code", "content": answer},
                     {"role": "assistant", "content": turns[1]}]
        ids, mask = whole_ids(tok, source, messages, [BUILTIN_SPECS["code"].declaration()], sampled)
        assert list(trace.input_ids) == ids[:len(trace.input_ids)] and trace.input_ids[-1] == eos
        assert list(trace.loss_mask) == mask[:len(trace.input_ids)]


def test_the_sft_stage_trains_with_chat_tools_end_to_end(code_sandbox_url: str, tmp_path) -> None:
    """The `sft` stage with rollout.protocol chat-tools on a small SmolLM2-vocabulary model: real sandbox runs,
    chat-template traces, the loss goes down over epochs, and the saved model rolls out with the same protocol."""
    tok = family_tokenizer("hermes")
    init = tmp_path / "init"
    tiny_llama(len(tok), seed=0).save_pretrained(init)
    tok.save_pretrained(init)
    write_problems(tmp_path / "train.jsonl", generate(8, seed=3))
    cfg = config_from_dict({
        "rollout": {"protocol": "chat-tools", "chat_tools": {"template": "hermes"}, "max_total_tokens": 1024},
        "sft": {"init_model": str(init), "train_file": str(tmp_path / "train.jsonl"), "max_traces": 8, "epochs": 6,
                "batch_size": 4, "lr": 1e-2, "gradient_checkpointing": False, "output_dir": str(tmp_path / "sft")},
        "model": {"device": "cpu"}, "run": {"tracking_uri": f"sqlite:///{tmp_path / 'mlruns.db'}"}})
    metrics = sft_run(cfg, {"code": code_sandbox_url}, metrics_dir=tmp_path / "metrics")
    assert metrics["sft/traces"] == 8.0 and metrics["sft/steps"] == 12.0
    client = MlflowClient(cfg.run.tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name(cfg.run.experiment).experiment_id])
    losses = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "sft/loss"), key=lambda m: m.step)]
    assert len(losses) == 12 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-2:]) < 0.75 * sum(losses[:2])  # it learns the chat-template traces
    model, tokenizer = load_policy(str(tmp_path / "sft"))
    engine = RolloutEngine(model, tokenizer, {"code": CodeSandboxClient(code_sandbox_url)},
                           RolloutConfig(protocol="chat-tools", chat_tools=ChatToolsConfig(template="hermes"),
                                         max_policy_tokens=24, max_total_tokens=512))
    with engine:
        group = engine.rollout(generate(1, seed=9), 2).groups[0]
    assert all(len(t.response_ids) == len(t.loss_mask) for t in group.trajectories)
