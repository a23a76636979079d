"""The `vllm` rollout backend: vLLM's async engine, one coroutine per trajectory segment.

Same interface as `hf.HFDecoder` (`decoding.Decoder`: `run(scheduler) -> DecoderStats`, driven by
the rollout's episodes, `rollout.episode.Episodes`), so `rollout.engine` picks one by `rollout.backend`
and nothing else changes. vLLM does the batching (continuous batching, prefix caching: a
sequence re-admitted after a tool call reuses the KV of its context instead of
prefilling it again).

Token-exact: each segment is submitted as token ids (`TokensPrompt` of the whole
context), and the token ids vLLM sampled are appended exactly as returned, with the
log-probability vLLM reports for each (`logprobs=0`: the sampled token only). When a
stop string ends in the middle of a token, vLLM cuts its *text* after the stop string but
keeps the sampled token ids whole; we keep the ids (the protocol parser reads the
decoded ids and stops at the first stop string, as with the hf backend).

Departures from the hf backend, and why:
- entropy is not recorded (None, "unknown") for vLLM tokens: vLLM returns log-probs of the
  top-k tokens only, and asking for the full vocabulary on every token costs more than the
  sampling itself. The config check therefore refuses `reward.tepo` with this backend.
- log-probs are those of the temperature-scaled distribution over the whole vocabulary, as
  the hf backend records and the update recomputes (`pipeline.config.rollout.vllm_logprobs_mode`):
  vLLM's "processed" ones (after temperature) when top_p is 1; its "raw" ones (before any
  processing, the same at temperature 1) with a nucleus, since the processed ones are then
  renormalised over the nucleus and the step-0 importance ratio would be the nucleus mass.
  A nucleus at a temperature other than 0 or 1 has no untruncated log-probs in vLLM: the config
  check refuses it with `train.update.logprobs_source: rollout`.
- vLLM samples with its own per-request generator, seeded from (rollout seed, the sequence's
  generator seed, position): reproducible regardless of how tool latencies interleave the
  requests, but not the same draws as the hf backend for the same seed.

Weights: `update_weights(named_tensors)` loads new tensors into the running model through
a worker extension (`collective_rpc` -> the model runner's in-place `reload_weights`; with
tensor parallelism every worker takes its shard of each full tensor) and resets the prefix cache
(cached KV from the old weights must not be reused). The iterator is plain `(HF name, tensor)`:
from the model itself in one process, from `pipeline.distributed.weight_sync` under DeepSpeed
(gathered from ZeRO-3 shards). It is sent in chunks of about `push_chunk_mib`, cut only between
decoder layers: vLLM fuses a layer's projections (q/k/v, gate/up) and processes a layer once all
of it has loaded, so a layer split over two reloads would be processed half-loaded. Tensors
travel through vLLM's RPC channel: fine for one box; large GPU models would use vLLM's NCCL
weight transfer instead.

Placement (`rollout.vllm`): colocated engines take the training rank's GPU (`device_ids`) and a
memory fraction, and with sleep mode sleep between rollouts (woken for the next rollout or a
weight push); separate engines take their own GPUs, `tensor_parallel_size` of them each.

vLLM is imported only when this module is (the engine imports it only for
`backend: vllm`); a missing install raises `VLLMUnavailable` naming the fix.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from pipeline.config.rollout import VLLMConfig
from pipeline.rollout.backends.decoding import DecoderStats, SamplingParams, Scheduler
from pipeline.rollout.backends.vllm_weights import WeightSync, layer_aligned_chunks, pack_tensor
from pipeline.rollout.sequence import Sequence

INSTALL_HINT = "build its environment with scripts/setup_vllm.sh and run with .venv-vllm/bin/python"


class VLLMUnavailable(ImportError):
    """`rollout.backend: vllm` was selected but vLLM cannot be imported."""


try:
    import vllm
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM
except ImportError as err:  # pragma: no cover - exercised by the main suite's missing-vllm test
    raise VLLMUnavailable(f"rollout.backend is 'vllm' but vLLM cannot be imported ({err}); {INSTALL_HINT}") from err

# CPU builds read their KV cache size from the environment; 2 GiB serves small models.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")


def engine_device_ids(options: VLLMConfig, local_rank: int, current_device: int) -> list[int]:
    """CUDA device indices (of the visible set) for this rank's engine: its own GPU when colocated,
    its slice of `devices` when separate (never the trainer's GPU)."""
    if options.placement == "colocated":
        return [current_device]
    tp = options.tensor_parallel_size
    ids = list(options.devices[local_rank * tp:(local_rank + 1) * tp])
    if len(ids) < tp:
        raise ValueError(f"rollout.vllm.devices {list(options.devices)} has no {tp} GPU(s) for local rank {local_rank} "
                         f"(placement separate needs tensor_parallel_size = {tp} devices per rank)")
    if current_device in ids:
        raise ValueError(f"rollout.vllm.devices gives local rank {local_rank} GPU {current_device}, the one it trains on; "
                         "use placement: colocated to share it")
    return ids


def placement_args(options: VLLMConfig, cuda: bool, local_rank: int = 0, current_device: int = 0) -> dict[str, Any]:
    """AsyncEngineArgs for `rollout.vllm`. Sleep mode is checked here, before any process starts,
    so a platform without it (CPU) fails with the key to change rather than deep in vLLM."""
    if options.enable_sleep_mode and not current_platform.is_sleep_mode_available():
        raise ValueError(f"rollout.vllm.enable_sleep_mode is true but vLLM has no sleep mode on this platform "
                         f"({current_platform.device_type or 'cpu'}; CUDA, ROCm and XPU have it): set it to false")
    args: dict[str, Any] = {"tensor_parallel_size": options.tensor_parallel_size,
                            "enable_sleep_mode": options.enable_sleep_mode}
    if cuda:
        args["gpu_memory_utilization"] = options.gpu_memory_utilization
        args["device_ids"] = engine_device_ids(options, local_rank, current_device)
    return args


def model_dir(model: Any) -> str:
    """vLLM loads weights and tokenizer from a directory: take it from a path or a HF model."""
    path = model if isinstance(model, (str, Path)) else getattr(model, "name_or_path", "")
    if not path or not (Path(path) / "config.json").is_file():
        raise ValueError(f"the vllm backend needs a model saved as a Hugging Face directory; got {path!r} "
                         "(save_pretrained the model and tokenizer, and pass the directory or a model loaded from it)")
    return str(path)


def saved_dtype(path: str) -> str:
    """The dtype the model was saved in. vLLM's CPU build would otherwise cast float32 models
    to bfloat16, and the sampling log-probs would drift from the trainer's (about 0.05 nats)."""
    config = json.loads((Path(path) / "config.json").read_text())
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "auto")
    return dtype if dtype in {"float32", "bfloat16", "float16"} else "auto"


class VLLMBackend:
    """One vLLM engine for the rollout engine's life, on its own event-loop thread.

    AsyncLLM binds itself to the event loop it first runs on, so it gets a private loop
    that outlives each rollout; `VLLMDecoder.run` (called from the rollout engine's
    decoder thread) submits work to that loop.
    """

    def __init__(self, model: Any, *, max_batch: int, max_model_len: int, seed: int = 0,
                 options: VLLMConfig | None = None, logprobs_mode: str = "processed_logprobs",
                 **engine_overrides: Any) -> None:
        self.path = model_dir(model)
        options = options or VLLMConfig()
        cuda = torch.cuda.is_available()  # CUDA graphs only where there is CUDA; the CPU build runs eagerly
        args = dict(model=self.path, tokenizer=self.path, seed=seed, enforce_eager=not cuda, dtype=saved_dtype(self.path),
                    enable_prefix_caching=True, max_num_seqs=max_batch, max_model_len=max_model_len,
                    logprobs_mode=logprobs_mode, worker_extension_cls=f"{WeightSync.__module__}.WeightSync",
                    disable_log_stats=True)
        args.update(placement_args(options, cuda, int(os.environ.get("LOCAL_RANK", "0")),
                                   torch.cuda.current_device() if cuda else 0))
        args.update(engine_overrides)
        self.sleeps = bool(args["enable_sleep_mode"])  # sleep between rollouts (colocated with training)
        self._asleep = False
        self.chunk_bytes = options.push_chunk_mib * 2**20
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()
        self.engine: AsyncLLM = self._call(self._start(AsyncEngineArgs(**args)))
        self._request_ids = itertools.count()

    async def _start(self, args: AsyncEngineArgs) -> AsyncLLM:
        return AsyncLLM.from_engine_args(args)

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def decoder(self, params: SamplingParams, seed: int) -> VLLMDecoder:
        return VLLMDecoder(self, params, seed)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load `named_tensors` (HF parameter names, full tensors) into the engine; later samples use them.

        Iterated here, on the caller's thread (under ZeRO-3 it runs collectives), and sent in
        layer-aligned chunks of about `push_chunk_mib`; one chunk is looked ahead to know whether
        a load is the whole model. Returns the number of tensors loaded."""
        self._call(self._wake())
        chunks = layer_aligned_chunks(named_tensors, self.chunk_bytes, pack=pack_tensor)
        current, first, loaded = next(chunks, None), True, 0
        while current is not None:
            following = next(chunks, None)
            loaded += self._call(self._load(current, partial=not (first and following is None)))
            current, first = following, False
        self._call(self.engine.reset_prefix_cache())  # KV computed with the old weights is stale
        return loaded

    async def _load(self, tensors: list[tuple[str, str, list[int], bytes]], partial: bool) -> int:
        counts = await self.engine.collective_rpc("tapo_load_weights", args=(tensors, partial))
        return int(counts[0])

    async def _wake(self) -> None:
        if self._asleep:
            await self.engine.wake_up()
            self._asleep = False

    async def _sleep(self) -> None:
        """Level 1: the KV cache is dropped and the weights move to host memory until `_wake`."""
        if self.sleeps and not self._asleep:
            await self.engine.sleep(level=1)
            self._asleep = True

    def close(self) -> None:
        """Stop the engine's processes and the private loop (idempotent)."""
        if self._loop.is_closed():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    async def _shutdown(self) -> None:
        self.engine.shutdown()
        del self.engine  # collected now, not at interpreter exit when its finaliser breaks
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def __enter__(self) -> VLLMBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class VLLMDecoder:
    """Generates one rollout with the shared engine; the scheduler interface of HFDecoder."""

    def __init__(self, backend: VLLMBackend, params: SamplingParams, seed: int) -> None:
        self.backend, self.params, self.seed = backend, params, seed
        self.stats = DecoderStats()
        self._active = 0
        self._busy_since = 0.0
        self._error: BaseException | None = None  # a failed request ends the rollout, loudly

    def run(self, scheduler: Scheduler) -> DecoderStats:
        """Generate until every sequence has finished; segment ends go to the scheduler."""
        return self.backend._call(self._arun(scheduler))

    async def _arun(self, scheduler: Scheduler) -> DecoderStats:
        await self.backend._wake()
        try:
            return await self._generate_all(scheduler)
        finally:
            await self.backend._sleep()  # colocated sleep mode: the trainer gets the memory back

    async def _generate_all(self, scheduler: Scheduler) -> DecoderStats:
        tasks: set[asyncio.Task] = set()
        while scheduler.unfinished() > 0:
            if self._error is not None:
                for task in tasks:  # cancelling a generate() aborts its vLLM request
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise RuntimeError("vLLM generation failed; rollout aborted") from self._error
            ready = scheduler.take_ready(1 << 30)
            for seq, stops in ready:
                self._track_busy(+1)
                task = asyncio.create_task(self._segment(seq, stops, scheduler))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if not ready:  # nothing new: wait (off this loop) for a requeue or a finish
                await asyncio.to_thread(scheduler.wait_ready, 0.02)
        if tasks:
            await asyncio.gather(*tasks)
        return self.stats

    def _track_busy(self, delta: int) -> None:
        """Busy = at least one request in vLLM; idle = every unfinished sequence waits on a tool."""
        now = time.perf_counter()
        if self._active > 0:
            self.stats.busy_s += now - self._busy_since
        elif self._busy_since:
            self.stats.idle_s += now - self._busy_since
        self._busy_since, self._active = now, self._active + delta

    async def _segment(self, seq: Sequence, stops: tuple[str, ...], scheduler: Scheduler) -> None:
        try:
            reason = await self._generate(seq, stops)
        except BaseException as err:  # the sequence would never finish: stop the loop in _arun
            self._error = err
            raise
        finally:
            self._track_busy(-1)
        try:  # the scheduler ends a row whose segment fails (`segment_ended`); what escapes it is never lost here
            scheduler.segment_ended(seq, reason)
        except BaseException as err:  # a task's exception is only logged: the row would never finish
            self._error = err
            raise

    async def _generate(self, seq: Sequence, stops: tuple[str, ...]) -> str:
        p = self.params
        room = min(p.max_policy_tokens - seq.policy_tokens, p.max_total_tokens - len(seq.context_ids))
        if room <= 0:
            return "budget"
        sampling = VLLMSamplingParams(
            n=1, temperature=p.temperature, top_p=p.top_p, max_tokens=room, stop=list(stops),
            include_stop_str_in_output=True, logprobs=0, seed=_request_seed(self.seed, seq, len(seq.response_ids)),
            output_kind=RequestOutputKind.FINAL_ONLY, skip_special_tokens=False,
        )
        context = seq.context_ids
        final = None
        request_id = f"tapo-{next(self.backend._request_ids)}"
        async for out in self.backend.engine.generate(TokensPrompt(prompt_token_ids=context), sampling, request_id):
            final = out
        assert final is not None and final.finished, f"vLLM request {request_id} ended without a final output"
        completion = final.outputs[0]
        self.stats.prefill_tokens += len(context) - (final.num_cached_tokens or 0)
        for token, logprobs in zip(completion.token_ids, completion.logprobs, strict=True):
            seq.append_sampled(token, logprobs[token].logprob, None)  # entropy unknown: see the module docstring
        self.stats.sampled_tokens += len(completion.token_ids)
        self.stats.steps += 1
        return _segment_reason(completion, room)


def _segment_reason(completion: Any, room: int) -> str:
    """Map vLLM's finish to the scheduler's reasons: eos, stop (a stop string) or budget."""
    if completion.finish_reason == "stop":
        return "stop" if isinstance(completion.stop_reason, str) else "eos"
    if completion.finish_reason == "length" or len(completion.token_ids) >= room:
        return "budget"
    raise RuntimeError(f"vLLM finished a segment for an unexpected reason: {completion.finish_reason!r}")


def _request_seed(rollout_seed: int, seq: Sequence, position: int) -> int:
    """Fixed by the rollout, the sequence (its generator's seed, set by the engine per index) and
    the position, so samples do not depend on how tool latencies order the requests."""
    return (rollout_seed * 1_000_003 + seq.rng.initial_seed() * 65_537 + position) % (2**31 - 1)


__all__ = ["VLLMBackend", "VLLMDecoder", "VLLMUnavailable", "engine_device_ids", "model_dir", "placement_args", "vllm"]
