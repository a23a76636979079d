"""Continuous batching with cache merges gives the same greedy tokens as one-at-a-time generation, and the log-probs
of the model's own forward for every attention variant (sliding windows included)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig,
                          LlamaForCausalLM, Llama4TextConfig, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

from pipeline.config.rollout import RolloutConfig
from pipeline.rollout.backends.decoding import SamplingParams
from pipeline.rollout.backends.hf import MIN_SHARED_PREFIX_TOKENS, HFBackend, HFDecoder
from pipeline.rollout.backends.windows import attention_windows
from pipeline.rollout.backends.next_token import inverse_cdf_sample
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


class ToolRoundsScheduler:
    """Every segment end is treated as a tool call: `rounds` times, tool-output tokens are
    appended (mask 0) and the sequence is re-admitted; then it finishes."""

    def __init__(self, seqs: list[Sequence], rounds: int, outputs: list[list[int]]) -> None:
        self.ready, self.rounds, self.outputs = list(seqs), rounds, outputs
        self.total, self.done = len(seqs), 0

    def take_ready(self, max_n):
        taken, self.ready = self.ready[:max_n], self.ready[max_n:]
        return [(s, ()) for s in taken]

    def wait_ready(self, timeout_s):
        pass

    def unfinished(self):
        return self.total - self.done

    def segment_ended(self, seq, reason):
        seq.turns += 1
        if seq.turns > self.rounds:
            seq.finish_reason = "max_turns"
            self.done += 1
            return
        seq.append_inserted(self.outputs[(seq.turns + len(seq.prompt_ids)) % len(self.outputs)])
        self.ready.append(seq)


def _run_tool_rounds(model, tok, prompts, max_parked_kv_tokens: int,
                     max_batch: int = 2) -> tuple[list[Sequence], int, int]:
    params = SamplingParams(temperature=0.0, top_p=1.0, max_policy_tokens=6, max_total_tokens=512)
    outputs = [tok(t)["input_ids"] for t in ("<output>42</output>", "<output>error: x</output> more", "ok")]
    seqs = [_seq(p) for p in prompts]
    decoder = HFDecoder(model, tok, params, max_batch=max_batch, max_parked_kv_tokens=max_parked_kv_tokens)
    stats = decoder.run(ToolRoundsScheduler(seqs, rounds=3, outputs=outputs))
    return seqs, stats.reused_tokens, stats.prefill_tokens


def test_parked_caches_give_the_same_tokens_and_logprobs_as_full_prefill() -> None:
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=5)
    model.generation_config.eos_token_id = None
    prompts = [tok(t)["input_ids"] for t in ("What is 6 * 7?", "The quick brown fox jumps over", "0123", "a b")]
    reused, reused_tokens, reused_prefill = _run_tool_rounds(model, tok, prompts, max_parked_kv_tokens=10_000)
    fresh, fresh_reused, fresh_prefill = _run_tool_rounds(model, tok, prompts, max_parked_kv_tokens=0)
    assert fresh_reused == 0 and reused_tokens > 0
    assert reused_prefill + reused_tokens == fresh_prefill  # every context token is fed once or served from cache
    for a, b in zip(reused, fresh):
        assert a.response_ids == b.response_ids and a.loss_mask == b.loss_mask
        assert sum(a.loss_mask) == 6 + 3  # a 6-token segment, then one token after each of 3 tool outputs
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
        with torch.no_grad():  # and both are the log-probs of one full forward pass
            logits = model(torch.tensor([a.context_ids])).logits[0].log_softmax(-1)
        n = len(a.prompt_ids)
        expected = [logits[n - 1 + i, t].item() if m else 0.0 for i, (t, m) in enumerate(zip(a.response_ids, a.loss_mask))]
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(expected), atol=1e-4)


def test_parked_cache_bound_falls_back_to_full_prefill() -> None:
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=5)
    model.generation_config.eos_token_id = None
    prompts = [tok(t)["input_ids"] for t in ("What is 6 * 7?", "0123")]
    small, reused_tokens, _ = _run_tool_rounds(model, tok, prompts, max_parked_kv_tokens=len(prompts[1]) + 8)
    full, _, _ = _run_tool_rounds(model, tok, prompts, max_parked_kv_tokens=0)
    assert 0 < reused_tokens  # the short sequence fits at first, the long one never does
    assert [s.response_ids for s in small] == [s.response_ids for s in full]


def test_group_copies_of_a_prompt_are_prefilled_once_and_sample_independently() -> None:
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=7)
    model.generation_config.eos_token_id = None
    prompt, other = tok("What is 6 * 7?")["input_ids"], tok("0123")["input_ids"]
    seqs = [_seq(prompt) for _ in range(3)] + [_seq(other)]
    for i, seq in enumerate(seqs):
        seq.rng.manual_seed(100 + i)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_policy_tokens=10, max_total_tokens=512)
    stats = HFDecoder(model, tok, params, max_batch=4).run(ToolRoundsScheduler(seqs, rounds=0, outputs=[[]]))
    assert stats.prefill_tokens == len(prompt) + len(other)
    assert stats.reused_tokens == 2 * len(prompt)
    assert len({tuple(s.response_ids) for s in seqs[:3]}) > 1  # shared prompt cache, independent samples
    for seq in seqs:
        with torch.no_grad():
            logits = model(torch.tensor([seq.context_ids])).logits[0].log_softmax(-1)
        n = len(seq.prompt_ids)
        expected = [logits[n - 1 + i, t].item() for i, t in enumerate(seq.response_ids)]
        assert torch.allclose(torch.tensor(seq.logprobs), torch.tensor(expected), atol=1e-4)


def _system_turn_rows(tok, system: list[int], questions: list[list[int]], shared: bool) -> list[Sequence]:
    return [Sequence(problem=Problem("p", "q", ("a",), "math", "s", "train"), tools=(), prompt_ids=system + q,
                     shared_prefix_len=len(system) if shared else 0) for q in questions]


def test_fresh_rows_start_from_one_prefill_of_their_shared_system_turn() -> None:
    """Rows whose prompts open with the same system turn, admitted at different times and again after tool
    outputs (no parked caches): that turn is prefilled once, with the tokens and log-probs of full prefills."""
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=11)
    model.generation_config.eos_token_id = None
    system = tok("<|im_start|>system\nThe quick brown fox jumps over the lazy dog 0123456789.<|im_end|>\n")["input_ids"]
    assert len(system) >= MIN_SHARED_PREFIX_TOKENS
    questions = [tok(q)["input_ids"] for q in ("What is 6 * 7?", "0123", "capital of Australia")]
    params = SamplingParams(temperature=0.0, top_p=1.0, max_policy_tokens=8, max_total_tokens=512)

    shared, plain = (_system_turn_rows(tok, system, questions, flag) for flag in (True, False))
    shared_stats = HFDecoder(model, tok, params, max_batch=2).run(StaggeredScheduler(shared, every=3))
    plain_stats = HFDecoder(model, tok, params, max_batch=2).run(StaggeredScheduler(plain, every=3))
    assert shared_stats.prefill_tokens == len(system) + sum(map(len, questions))
    assert plain_stats.prefill_tokens == sum(len(system) + len(q) for q in questions)
    assert shared_stats.reused_tokens == len(questions) * len(system)
    for a, b in zip(shared, plain, strict=True):
        assert a.response_ids == b.response_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)

    outputs = [tok(t)["input_ids"] for t in ("<output>42</output>", "ok")]
    shared, plain = (_system_turn_rows(tok, system, questions, flag) for flag in (True, False))
    shared_stats = HFDecoder(model, tok, params, max_batch=2).run(ToolRoundsScheduler(shared, 2, outputs))
    plain_stats = HFDecoder(model, tok, params, max_batch=2).run(ToolRoundsScheduler(plain, 2, outputs))
    admissions = 3 * len(questions)  # each row: its prompt, then after each of 2 tool outputs
    assert plain_stats.prefill_tokens - shared_stats.prefill_tokens == (admissions - 1) * len(system)
    for a, b in zip(shared, plain, strict=True):
        assert a.response_ids == b.response_ids and a.loss_mask == b.loss_mask
        with torch.no_grad():  # the log-probs of one full forward pass
            logits = model(torch.tensor([a.context_ids])).logits[0].log_softmax(-1)
        n = len(a.prompt_ids)
        expected = [logits[n - 1 + i, t].item() if m else 0.0 for i, (t, m) in enumerate(zip(a.response_ids, a.loss_mask))]
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(expected), atol=1e-4, rtol=0)


def test_inverse_cdf_sampling_follows_the_distribution() -> None:
    """One uniform per row gives each token its probability; tokens without mass are never drawn."""
    probs = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0])
    n = 40_000
    uniform = torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    tokens = inverse_cdf_sample(probs.expand(n, -1), uniform)
    freq = torch.bincount(tokens, minlength=6).double() / n
    assert torch.all(freq[probs == 0] == 0)
    # binomial standard error <= 0.0025 at n = 40k: 0.01 is four of them
    assert torch.allclose(freq, probs.double(), atol=0.01), freq


def test_inverse_cdf_sampling_edges_pick_a_token_with_mass() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0]] * 3)
    # u = 0 skips leading zeros; u just below 1 and a u past the end (what rounding can do) skip trailing zeros
    tokens = inverse_cdf_sample(probs, torch.tensor([0.0, 1.0 - 2.0**-53, 1.0], dtype=torch.float64))
    assert tokens.tolist() == [1, 2, 2]


def test_sampling_is_the_same_for_a_row_alone_or_in_a_batch() -> None:
    """Each sequence draws from its own generator: batch company does not change its token."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 50, generator=g)
    probs = logits.softmax(-1)
    alone = [int(inverse_cdf_sample(probs[i:i + 1], torch.rand(1, generator=torch.Generator().manual_seed(i),
                                                               dtype=torch.float64))) for i in range(4)]
    uniform = torch.cat([torch.rand(1, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
                         for i in range(4)])
    assert inverse_cdf_sample(probs, uniform).tolist() == alone


def test_a_stop_string_written_one_character_per_token_ends_the_segment_at_its_last_token() -> None:
    """Stop detection decodes the tail only after a token that can bring a stop's last character;
    it must still catch a stop spread over tokens, and exactly at its last one."""
    tok = tiny_tokenizer()
    decoder = HFDecoder(tiny_llama(len(tok)), tok, SamplingParams(1.0, 1.0, 100, 1000), max_batch=4)
    chars = [tok.convert_tokens_to_ids(c) for c in "x</code>"]
    assert len(set(chars)) == 8 and tok.decode(chars) == "x</code>"
    seq = _seq([0])
    ends = []
    for token in chars:
        seq.append_sampled(token, 0.0, None)
        ends.append(decoder._segment_end(seq, ("</code>", "</answer>")))
    assert ends == [None] * 7 + ["stop"]


def test_copies_that_agree_through_a_tool_output_are_prefilled_once() -> None:
    """Greedy copies of one prompt write the same segments and get the same tool outputs: each
    re-admission prefills the new tokens once for all copies, with the tokens and log-probs of one
    full forward pass."""
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=5)
    model.generation_config.eos_token_id = None
    prompt = tok("What is 6 * 7?")["input_ids"]
    copies, _, copies_prefill = _run_tool_rounds(model, tok, [prompt] * 3, max_parked_kv_tokens=10_000, max_batch=3)
    alone, _, alone_prefill = _run_tool_rounds(model, tok, [prompt], max_parked_kv_tokens=10_000, max_batch=3)
    assert copies_prefill == alone_prefill
    for seq in copies:
        assert seq.response_ids == alone[0].response_ids and seq.loss_mask == alone[0].loss_mask
        assert torch.allclose(torch.tensor(seq.logprobs), torch.tensor(alone[0].logprobs), atol=1e-5)


# --- attention variants: every forward that feeds a log-prob matches the model's own ------------------------------
WINDOW = 4  # rows run far past it: prompts of 5-30 tokens, 3 tool rounds
VARIANT_SIZES = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=256)
VARIANTS = {  # as tests/train/test_attention_variants.py builds them, with the tokenizer's vocabulary
    "llama": lambda v: LlamaForCausalLM(LlamaConfig(vocab_size=v, **VARIANT_SIZES)),
    "qwen2-sliding": lambda v: Qwen2ForCausalLM(Qwen2Config(vocab_size=v, **VARIANT_SIZES, use_sliding_window=True,
                                                            sliding_window=WINDOW, max_window_layers=1)),
    "mistral-sliding": lambda v: MistralForCausalLM(MistralConfig(vocab_size=v, **VARIANT_SIZES,
                                                                  sliding_window=WINDOW)),
    "gemma2": lambda v: Gemma2ForCausalLM(Gemma2Config(vocab_size=v, **VARIANT_SIZES, head_dim=8,
                                                       sliding_window=WINDOW)),
    "gemma3": lambda v: Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=v, **VARIANT_SIZES, head_dim=8,
                                                           sliding_window=WINDOW, sliding_window_pattern=2)),
}


@pytest.mark.parametrize("parked", [0, 10_000], ids=["re-prefilled", "parked-caches"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_attention_variant_samples_the_log_probs_of_the_models_own_forward(variant: str, parked: int) -> None:
    """Left padding, padding between a parked cache and its new tokens, merges, row selection and a shared system
    turn's cache: a sliding window must still cut what the model's own forward on the whole row cuts. The defect:
    transformers measured windows in the batch's cache columns (Mistral 0.06-0.11 off) and its own cache kept only a
    sliding layer's last window (Qwen2, Gemma 2 and 3 crashed, Mistral with parked caches)."""
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = VARIANTS[variant](len(tok)).eval()
    model.generation_config.eos_token_id = None
    system = tok("<|im_start|>system\nThe quick brown fox jumps over the lazy dog 0123456789.<|im_end|>\n")["input_ids"]
    questions = [tok(q)["input_ids"] for q in ("What is 6 * 7?", "0123", "capital of Australia", "a b")]
    seqs = _system_turn_rows(tok, system, questions[:2], shared=True) + [_seq(q) for q in questions[2:]]
    for i, seq in enumerate(seqs):
        seq.rng.manual_seed(i)
    outputs = [tok(t)["input_ids"] for t in ("<output>42</output>", "<output>error: x</output> more", "ok")]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_policy_tokens=6, max_total_tokens=512)
    stats = HFDecoder(model, tok, params, max_batch=2, max_parked_kv_tokens=parked).run(
        ToolRoundsScheduler(seqs, rounds=3, outputs=outputs))
    assert stats.reused_tokens > 0  # the system turn's cache (and parked caches) served
    for seq in seqs:
        with torch.no_grad():
            logits = model(torch.tensor([seq.context_ids])).logits[0].log_softmax(-1)
        n = len(seq.prompt_ids)
        sampled = [i for i, m in enumerate(seq.loss_mask) if m]
        assert len(sampled) == 6 + 3
        expected = torch.tensor([logits[n - 1 + i, seq.response_ids[i]].item() for i in sampled])
        torch.testing.assert_close(torch.tensor([seq.logprobs[i] for i in sampled]), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("config", "named"), [
    (lambda: _with_kernel(MistralConfig(vocab_size=48, **VARIANT_SIZES, sliding_window=WINDOW), "flash_attention_2"),
     "attention kernel 'flash_attention_2'"),
    (lambda: Llama4TextConfig(vocab_size=48, **VARIANT_SIZES, attention_chunk_size=WINDOW), "chunked_attention"),
])
def test_a_model_whose_windows_the_decoder_cannot_mask_is_refused_at_set_up(config, named: str) -> None:
    model = SimpleNamespace(config=config())
    with pytest.raises(ValueError, match=f"rollout.backend 'hf' cannot decode this model exactly.*{named}"):
        HFBackend(model, tiny_tokenizer(), RolloutConfig())
    no_window = MistralConfig(vocab_size=48, **VARIANT_SIZES, sliding_window=None)  # its default is 4096
    assert attention_windows(SimpleNamespace(config=no_window)) is None  # the model's own masks, as before


def _with_kernel(config, kernel: str):
    config._attn_implementation = kernel
    return config
