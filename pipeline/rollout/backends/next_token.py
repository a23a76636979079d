"""Drawing the next token of each row from the decoder's logits (the hf backend), each row from its own generator.

A row's tokens depend only on its own generator and logits, never on which rows share its batch (that depends on
tool latency): one uniform per token, inverted through the cumulative distribution. Each sampled token is appended
with the log-probability of the temperature-scaled distribution it was drawn from and that distribution's entropy
(TEPO reads it); the update recomputes the same log-probabilities."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.rollout.backends.decoding import SamplingParams
from pipeline.rollout.sequence import Sequence

SAMPLE_CHUNK_ELEMENTS = 2**20  # logits sampled together (see sample_tokens): 21 rows of a 49k vocabulary


def sample_tokens(logits_BV: torch.Tensor, rows: list[Sequence], params: SamplingParams) -> torch.Tensor:
    """Sample one token per row, each from the row's own generator, and append it (mask 1) with its
    log-prob and the entropy of the distribution sampled from (TEPO reads it); the tokens, on the CPU.

    Rows go in chunks of about SAMPLE_CHUNK_ELEMENTS logits: larger [B, V] temporaries (float64 for the
    cumulative sum) pass glibc's mmap threshold, and each step then gets fresh, zeroed pages (measured with
    SmolLM2's vocabulary: 64 rows at once 3.6x slower per row than 16)."""
    logits_BV = logits_BV.float().cpu()
    step = max(1, SAMPLE_CHUNK_ELEMENTS // logits_BV.shape[1])
    return torch.cat([_sample_rows(logits_BV[i:i + step], rows[i:i + step], params)
                      for i in range(0, len(rows), step)])


def _sample_rows(logits_BV: torch.Tensor, rows: list[Sequence], params: SamplingParams) -> torch.Tensor:
    temperature = params.temperature
    logp_BV = F.log_softmax(logits_BV / temperature if temperature > 0 else logits_BV, dim=-1)
    probs_BV = logp_BV.exp()
    if temperature == 0:
        tokens_B = logp_BV.argmax(-1)
    else:
        uniform_B = torch.cat([torch.rand(1, generator=seq.rng, dtype=torch.float64) for seq in rows])
        tokens_B = inverse_cdf_sample(_top_p(probs_BV, params.top_p), uniform_B)
    chosen_B = logp_BV.gather(-1, tokens_B[:, None])[:, 0]
    entropy_B = -(probs_BV * logp_BV).sum(-1)
    for seq, tok, lp, h in zip(rows, tokens_B.tolist(), chosen_B.tolist(), entropy_B.tolist(), strict=True):
        seq.append_sampled(tok, lp, h)
    return tokens_B


def inverse_cdf_sample(probs_BV: torch.Tensor, uniform_B: torch.Tensor) -> torch.Tensor:
    """One token per row with probability proportional to `probs_BV`, from one uniform in [0, 1) per row.

    Exact like `torch.multinomial`, but one random number per row instead of one per vocabulary entry
    (multinomial draws V exponentials for one sample: a third of the decoder's time, measured on a small
    model with SmolLM2's 49k vocabulary); the cumulative sum is float64 so late tokens are not shorted."""
    cdf_BV = probs_BV.cumsum(-1, dtype=torch.float64)
    target_B1 = (uniform_B * cdf_BV[:, -1])[:, None]
    # the first token whose cdf exceeds the target: its own probability is > 0
    tokens_B = torch.searchsorted(cdf_BV, target_B1, right=True)[:, 0].clamp(max=cdf_BV.shape[1] - 1)
    past_end_B = probs_BV.gather(-1, tokens_B[:, None])[:, 0] <= 0  # rounding ran past the last token with mass
    if bool(past_end_B.any()):
        tokens_B[past_end_B] = cdf_BV.shape[1] - 1 - (probs_BV[past_end_B] > 0).flip(-1).int().argmax(-1)
    return tokens_B


def _top_p(probs_BV: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return probs_BV
    sorted_p, order = probs_BV.sort(dim=-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p > top_p  # keep the smallest prefix reaching top_p
    sorted_p[drop] = 0.0
    return torch.zeros_like(probs_BV).scatter(-1, order, sorted_p)
