"""The vLLM decoder: token-exact sampling, log-probs of the sampled distribution, stop
strings that end mid-token, and the weight-update hook (needs `.venv-vllm`)."""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipeline.rollout.backends.decoding import SamplingParams
from pipeline.rollout.sequence import Sequence
from pipeline.types import Problem
from tests.helpers.tiny import tiny_tokenizer
from tests.vllm.tiny_vllm import load_tiny, tiny_model

QUESTIONS = ["What is 6 * 7?", "What is 1234 * 5678?", "capital of Australia", "The quick brown fox"]
# Longer than the CPU build's 128-token KV blocks, so a repeated prompt hits the prefix cache.
LONG_QUESTIONS = [q + " The quick brown fox jumps over the lazy dog 0123456789." * 6 for q in QUESTIONS]


class OneSegmentScheduler:
    """Drives a decoder as the rollout engine does, with one segment per sequence (no tools)."""

    def __init__(self, seqs: list[Sequence], stops: tuple[str, ...] = ()) -> None:
        self.ready, self.stops = deque(seqs), stops
        self.open, self.reasons = len(seqs), {}
        self.cond = threading.Condition()

    def take_ready(self, max_n: int) -> list[tuple[Sequence, tuple[str, ...]]]:
        with self.cond:
            return [(self.ready.popleft(), self.stops) for _ in range(min(max_n, len(self.ready)))]

    def wait_ready(self, timeout_s: float) -> None:
        with self.cond:
            if not self.ready and self.open > 0:
                self.cond.wait(timeout_s)

    def unfinished(self) -> int:
        with self.cond:
            return self.open

    def segment_ended(self, seq: Sequence, reason: str) -> None:
        with self.cond:
            self.reasons[id(seq)] = reason
            self.open -= 1
            self.cond.notify()


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def sequences(tok, questions: list[str]) -> list[Sequence]:
    out = []
    for i, q in enumerate(questions):
        prompt = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        ids = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        out.append(Sequence(Problem(f"p{i}", q, ("42",), "calculator", "calculator", "train"), ("code",), ids))
        out[-1].rng.manual_seed(i)  # as the engine does: one generator seed per sequence index
    return out


def generate(backend, tok, questions, *, temperature=1.0, max_tokens=24, stops=(), seed=1):
    seqs = sequences(tok, questions)
    params = SamplingParams(temperature=temperature, top_p=1.0, max_policy_tokens=max_tokens, max_total_tokens=500)
    scheduler = OneSegmentScheduler(seqs, stops)
    stats = backend.decoder(params, seed).run(scheduler)
    return seqs, [scheduler.reasons[id(s)] for s in seqs], stats


@torch.no_grad()
def reference_logprobs(model, seq: Sequence, temperature: float) -> torch.Tensor:
    """Log-probs the HF model gives the sampled tokens, under the temperature-scaled distribution."""
    ids = torch.tensor([seq.prompt_ids + seq.response_ids])
    logits = model(ids).logits[0, len(seq.prompt_ids) - 1:-1].float()
    logp = F.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    return logp.gather(-1, torch.tensor(seq.response_ids)[:, None])[:, 0]


def test_sampled_tokens_and_logprobs_match_the_hf_model(backend, tok, tiny_dir: Path) -> None:
    seqs, reasons, stats = generate(backend, tok, QUESTIONS, temperature=0.8)
    hf = load_tiny(tiny_dir)
    for seq, reason in zip(seqs, reasons, strict=True):
        assert reason in {"eos", "budget"}
        assert 0 < len(seq.response_ids) <= 24 and seq.loss_mask == [1] * len(seq.response_ids)
        assert len(seq.logprobs) == len(seq.entropies) == len(seq.response_ids)
        if reason == "budget":
            assert len(seq.response_ids) == 24
        else:
            assert seq.response_ids[-1] == tok.eos_token_id  # EOS kept as a sampled token, as the hf backend does
        torch.testing.assert_close(torch.tensor(seq.logprobs), reference_logprobs(hf, seq, 0.8), atol=2e-3, rtol=0)
    assert stats.sampled_tokens == sum(len(s.response_ids) for s in seqs)
    assert len({tuple(s.response_ids) for s in seqs}) > 1


def test_seeded_sampling_is_reproducible(backend, tok) -> None:
    a, _, _ = generate(backend, tok, QUESTIONS[:2], seed=7)
    b, _, _ = generate(backend, tok, QUESTIONS[:2], seed=7)
    c, _, _ = generate(backend, tok, QUESTIONS[:2], seed=8)
    assert [s.response_ids for s in a] == [s.response_ids for s in b]
    assert [s.response_ids for s in a] != [s.response_ids for s in c]
    twins, _, _ = generate(backend, tok, QUESTIONS[:1] * 2, seed=7)  # same prompt, two sequences
    assert twins[0].response_ids != twins[1].response_ids


def mid_token_stop(tok, ids: list[int]) -> tuple[str, int]:
    """A stop string whose first occurrence in decode(ids) ends inside a multi-character token."""
    text = tok.decode(ids)
    for j in range(1, len(ids)):
        start, piece = len(tok.decode(ids[:j])), tok.decode(ids[j:j + 1])
        if len(piece) < 2 or start < 2 or tok.decode(ids[:j + 1]) != text[:start + len(piece)]:
            continue
        stop = text[start - 2:start + 1]  # two characters before the token, one inside it
        if text.find(stop) == start - 2:
            return stop, j
    raise AssertionError(f"no multi-character token to cut in {text!r}")


def test_stop_string_ending_mid_token_keeps_the_token_whole(backend, tok) -> None:
    free, _, _ = generate(backend, tok, QUESTIONS[:1], temperature=0.0, max_tokens=48)
    full = free[0].response_ids
    stop, j = mid_token_stop(tok, full)
    stopped, reasons, _ = generate(backend, tok, QUESTIONS[:1], temperature=0.0, max_tokens=48, stops=(stop,))
    assert reasons == ["stop"]
    assert stopped[0].response_ids == full[:j + 1]  # exactly as sampled, the straddling token included
    assert stop in tok.decode(stopped[0].response_ids) and stop not in tok.decode(full[:j])


def test_weight_update_changes_the_next_samples(backend, tok, tiny_dir: Path) -> None:
    old, new = load_tiny(tiny_dir), tiny_model(len(tok), seed=1)
    before, _, _ = generate(backend, tok, LONG_QUESTIONS, temperature=0.0)
    assert min(len(s.prompt_ids) for s in before) > 128
    again, _, stats = generate(backend, tok, LONG_QUESTIONS, temperature=0.0)
    assert stats.prefill_tokens < sum(len(s.prompt_ids) for s in again)  # the prefix cache is in use
    assert [s.response_ids for s in again] == [s.response_ids for s in before]
    assert backend.update_weights(new.named_parameters()) > 0
    try:
        # Same prompts again: a stale prefix cache would reuse KV computed with the old weights.
        after, _, _ = generate(backend, tok, LONG_QUESTIONS, temperature=0.0)
        for seq in after:
            torch.testing.assert_close(torch.tensor(seq.logprobs), reference_logprobs(new, seq, 0.0), atol=2e-3, rtol=0)
        assert [s.response_ids for s in after] != [s.response_ids for s in before]
    finally:
        backend.update_weights(old.named_parameters())
    restored, _, _ = generate(backend, tok, LONG_QUESTIONS, temperature=0.0)
    assert [s.response_ids for s in restored] == [s.response_ids for s in before]


@pytest.mark.timeout(120)
def test_a_failed_request_aborts_the_rollout_instead_of_hanging(backend, tok) -> None:
    seqs = sequences(tok, ["What is 6 * 7?", "fox " * 700])  # the second exceeds the engine's 512-token limit
    params = SamplingParams(temperature=1.0, top_p=1.0, max_policy_tokens=8, max_total_tokens=5000)
    scheduler = OneSegmentScheduler(seqs)
    with pytest.raises(RuntimeError, match="vLLM generation failed") as err:
        backend.decoder(params, 0).run(scheduler)
    assert err.value.__cause__ is not None
    ok, _, _ = generate(backend, tok, QUESTIONS[:1])  # the engine still serves later rollouts
    assert ok[0].response_ids
