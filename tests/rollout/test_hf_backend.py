"""Continuous batching with cache merges gives the same greedy tokens as one-at-a-time generation."""

from __future__ import annotations

import torch

from pipeline.rollout.hf_backend import HFDecoder, SamplingParams
from pipeline.rollout.sequence import Sequence
from pipeline.types import Problem
from tests.helpers.tiny import tiny_llama, tiny_tokenizer


class StaggeredScheduler:
    """Admits one new sequence every `every` calls, so the batch is merged into repeatedly."""

    def __init__(self, seqs: list[Sequence], every: int) -> None:
        self.pending, self.every, self.calls, self.done = list(seqs), every, 0, 0
        self.total = len(seqs)

    def take_ready(self, max_n):
        self.calls += 1
        if self.pending and self.calls % self.every == 1 and max_n > 0:
            return [(self.pending.pop(0), ())]
        return []

    def wait_ready(self, timeout_s):
        pass

    def unfinished(self):
        return self.total - self.done

    def segment_ended(self, seq, reason):
        self.done += 1


def _seq(prompt: list[int]) -> Sequence:
    return Sequence(problem=Problem("p", "q", ("a",), "math", "s", "train"), tools=(), prompt_ids=prompt)


def test_merged_batch_matches_single_sequence_greedy() -> None:
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=3)
    model.generation_config.eos_token_id = None  # run every sequence to its budget
    params = SamplingParams(temperature=0.0, top_p=1.0, max_policy_tokens=12, max_total_tokens=512)
    prompts = [tok("What is 6 * 7?")["input_ids"], tok("The quick brown fox jumps")["input_ids"],
               tok("0123")["input_ids"], tok("<answer>42</answer> the lazy dog")["input_ids"]]
    batched = [_seq(p) for p in prompts]
    HFDecoder(model, tok, params, max_batch=4).run(StaggeredScheduler(batched, every=3))
    for prompt, seq in zip(prompts, batched):
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                                 pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
        assert seq.response_ids == ref
        # the recorded log-probs are those of a full forward pass
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ref])).logits[0].log_softmax(-1)
        expected = [logits[len(prompt) - 1 + i, t].item() for i, t in enumerate(ref)]
        assert torch.allclose(torch.tensor(seq.logprobs), torch.tensor(expected), atol=1e-4)
