"""The vLLM backend records what the update compares with: log-probs over the whole vocabulary (also
under a nucleus), and no entropy it did not compute (None, never 0.0). Needs `.venv-vllm`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipeline.config.rollout import RolloutConfig
from pipeline.rollout.backends import make_backend
from pipeline.rollout.backends.decoding import SamplingParams
from tests.vllm.test_vllm_backend import QUESTIONS, OneSegmentScheduler, reference_logprobs, sequences, tok  # noqa: F401
from tests.vllm.tiny_vllm import load_tiny

TOP_P = 0.6


@pytest.fixture(scope="module")
def nucleus_backend(tiny_dir: Path, tok) -> Iterator[object]:  # noqa: F811
    cfg = RolloutConfig(backend="vllm", temperature=1.0, top_p=TOP_P, max_batch_sequences=8, max_total_tokens=512,
                        max_policy_tokens=64)
    backend = make_backend(str(tiny_dir), tok, cfg, seed=0)
    try:
        yield backend
    finally:
        backend.close()


@torch.no_grad()
def nucleus_mass(model, seq) -> torch.Tensor:
    """The probability mass of the top-p nucleus at each sampled position (1 = no truncation)."""
    ids = torch.tensor([seq.prompt_ids + seq.response_ids])
    probs = F.softmax(model(ids).logits[0, len(seq.prompt_ids) - 1:-1].float(), dim=-1)
    sorted_p = probs.sort(dim=-1, descending=True).values
    keep = sorted_p.cumsum(-1) - sorted_p <= TOP_P
    return (sorted_p * keep).sum(-1)


def test_nucleus_sampling_records_untruncated_logprobs_and_no_entropy(nucleus_backend, tok, tiny_dir) -> None:  # noqa: F811
    seqs = sequences(tok, QUESTIONS)
    params = SamplingParams(temperature=1.0, top_p=TOP_P, max_policy_tokens=24, max_total_tokens=500)
    nucleus_backend.decoder(params, 3).run(OneSegmentScheduler(seqs))
    hf = load_tiny(tiny_dir)
    truncated = 0
    for seq in seqs:
        assert seq.response_ids and seq.entropies == [None] * len(seq.response_ids)
        torch.testing.assert_close(torch.tensor(seq.logprobs), reference_logprobs(hf, seq, 1.0), atol=2e-3, rtol=0)
        truncated += int((nucleus_mass(hf, seq) < 0.99).sum())
    assert truncated > 0  # the nucleus did cut: renormalised log-probs would have differed there
