"""The pure parts of pipeline.inference: reading a generate answer (versions per token from spans), the routing rule,
the checkpoint-layout check, the server's command line, and the config section's refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from safetensors.torch import save_file

from pipeline.config.inference import InferenceConfig, ServerLaunch
from pipeline.inference.layout import WeightLayoutError, check_layout, checkpoint_layout, file_layout
from pipeline.inference.records import ProtocolError, Sampling, parse_generation, versions_of
from pipeline.inference.routing import Router
from pipeline.inference.server import LaunchSpec, server_command, server_env


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), max_size=6))
def test_versions_per_token_follow_the_spans(runs: list[tuple[int, int]]) -> None:
    spans, start, expected = [], 0, []
    for version, length in runs:
        spans.append({"version": str(version), "start": start, "end": start + length})
        start += length
        expected += [version] * length
    assert versions_of(spans, start) == tuple(expected)
    if spans:  # any gap, overlap or short cover is the server's error, never a guess
        with pytest.raises(ProtocolError):
            versions_of(spans, start + 1)
        with pytest.raises(ProtocolError):
            versions_of([dict(spans[0], start=1)] + spans[1:], start)


def answer(ids: list[int], logprobs: list[float], spans: list[dict], finish: str = "length") -> dict:
    content = [{"token_id": t, "logprob": lp} for t, lp in zip(ids, logprobs)]
    return {"choices": [{"token_ids": ids, "logprobs": {"content": content}, "weight_versions": spans,
                         "finish_reason": finish, "stop_reason": None}],
            "usage": {"prompt_tokens_details": {"cached_tokens": 32}}}


def test_a_generate_answer_is_read_or_refused() -> None:
    g = parse_generation(answer([5, 6, 7], [-0.1, -0.2, -0.3], [{"version": "0", "start": 0, "end": 1},
                                                                 {"version": "1", "start": 1, "end": 3}]), "s0")
    assert (g.token_ids, g.versions, g.cached_prompt_tokens, g.server) == ((5, 6, 7), (0, 1, 1), 32, "s0")
    spans = [{"version": "0", "start": 0, "end": 2}]
    for bad in (answer([5, 6], [-0.1, -9999.0], spans),  # a token without its log-prob
                answer([5, 6], [-0.1, -0.2], spans, finish="abort"),  # aborted (a pause in mode abort, a shutdown)
                answer([5, 6], [-0.1, -0.2], [{"version": "default", "start": 0, "end": 2}]),  # never given a version
                {"choices": []}, {"error": "x"}, [], None):
        with pytest.raises(ProtocolError):
            parse_generation(bad)
    mismatched = answer([5, 6], [-0.1, -0.2], spans)
    mismatched["choices"][0]["logprobs"]["content"][1]["token_id"] = 9
    with pytest.raises(ProtocolError, match="not those of the returned tokens"):
        parse_generation(mismatched)


def test_the_request_asks_for_tokens_not_text() -> None:
    body = Sampling(max_tokens=8, stop=("</code>",), stop_token_ids=(2,), seed=7).body([1, 2, 3], "r1")
    assert body["output_mode"] == "tokens" and body["token_ids"] == [1, 2, 3]
    params = body["sampling_params"]
    assert params["logprobs"] == 0 and params["seed"] == 7 and params["stop"] == ["</code>"]
    assert params["include_stop_str_in_output"] and not params["skip_special_tokens"]
    with pytest.raises(ValueError):
        Sampling(max_tokens=0)


ROUTER_OPS = st.lists(st.tuples(st.sampled_from(["send", "end", "forget", "down", "up"]), st.integers(0, 7)),
                      max_size=80)


@settings(max_examples=200, deadline=None)
@given(ROUTER_OPS)
def test_routing_is_sticky_while_the_server_is_up_and_least_loaded_otherwise(ops: list[tuple[str, int]]) -> None:
    servers = ["a", "b", "c"]
    up, router, flying = set(servers), Router(), []
    for op, n in ops:
        available = [s for s in servers if s in up]
        key = f"k{n}"
        if op == "send" and available:
            home = router.home.get(key)
            least = min(router.in_flight[s] for s in available)
            chosen = router.choose(key, available)
            if home in available:
                assert chosen == home
            else:
                assert router.in_flight[chosen] == least
            router.started(chosen)
            flying.append(chosen)
        elif op == "end" and flying:
            router.ended(flying.pop(n % len(flying)))
        elif op == "forget":
            router.forget(key)
        elif op == "down":
            up.discard(servers[n % 3])
        elif op == "up":
            up.add(servers[n % 3])
        assert sum(router.in_flight.values()) == len(flying)
        assert sum(router._held.values()) == len(router.home)
    with pytest.raises(LookupError):
        router.choose("k", [])


def test_a_push_must_have_the_checkpoints_names_and_shapes(tmp_path: Path) -> None:
    save_file({"a.weight": torch.zeros(2, 3), "b.bias": torch.zeros(4, dtype=torch.bfloat16)},
              str(tmp_path / "model-1.safetensors"), metadata={"tapo_version": "3"})
    save_file({"c.weight": torch.zeros(1)}, str(tmp_path / "model-2.safetensors"))
    layout = checkpoint_layout(tmp_path)
    assert layout == {"a.weight": ((2, 3), "F32"), "b.bias": ((4,), "BF16"), "c.weight": ((1,), "F32")}
    assert file_layout(tmp_path / "model-1.safetensors")[1] == {"tapo_version": "3"}
    check_layout(layout, {"a.weight": (2, 3), "b.bias": (4,), "c.weight": (1,)})  # dtypes may differ
    for pushed, why in (({"a.weight": (2, 3), "b.bias": (4,)}, "1 missing"),
                        ({"a.weight": (2, 3), "b.bias": (4,), "c.weight": (1,), "lm_head.weight": (2,)}, "not in the"),
                        ({"a.weight": (3, 2), "b.bias": (4,), "c.weight": (1,)}, "shapes differ")):
        with pytest.raises(WeightLayoutError, match=why):
            check_layout(layout, pushed)
    (tmp_path / "broken.safetensors").write_bytes((2**40).to_bytes(8, "little"))
    with pytest.raises(WeightLayoutError):
        file_layout(tmp_path / "broken.safetensors")
    with pytest.raises(WeightLayoutError, match="no safetensors"):
        checkpoint_layout(tmp_path / "nothing")


def test_the_server_command_and_environment(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32"}))
    cpu = LaunchSpec("s0", tmp_path, 8000, tmp_path, python="py", cores=(1,), kv_cache_gib=3)
    command = server_command(cpu)
    assert command[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    for flag in ("--enable-scale-out", "--enforce-eager", "--worker-extension-cls"):
        assert flag in command
    assert command[command.index("--dtype") + 1] == "float32"  # the checkpoint's, not vLLM's CPU default bfloat16
    env = server_env(cpu, {"PATH": "/bin"})
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    gpu = LaunchSpec("s1", tmp_path, 8001, tmp_path, gpus=(2, 3), nccl=True)
    command = server_command(gpu)
    assert "--enforce-eager" not in command and command[command.index("--tensor-parallel-size") + 1] == "2"
    assert json.loads(command[command.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}
    assert server_env(gpu, {})["CUDA_VISIBLE_DEVICES"] == "2,3"


@pytest.mark.parametrize(("section", "why"), [
    ({}, "either urls"),
    ({"urls": ["http://a:1"], "launch": {}}, "either urls"),
    ({"urls": ["ftp://a:1"]}, "base URL"),
    ({"urls": ["http://a:1/v1"]}, "base URL"),
    ({"urls": ["http://a:1", "http://a:1/"]}, "twice"),
    ({"launch": {"count": 2, "cores": [[0]]}}, "one per server"),
    ({"launch": {"count": 2, "cores": [[0], [0, 1]]}}, "its own"),
    ({"launch": {"count": 1, "cores": [[]]}}, "its own"),
    ({"launch": {"count": 1, "cores": [[0]], "gpus": [[0]]}}, "not both"),
    ({"launch": {"count": 1}, "max_staleness": -1}, "greater than or equal"),
])
def test_the_config_section_refuses(section: dict, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        InferenceConfig.model_validate(section)


def test_the_config_section_accepts() -> None:
    cfg = InferenceConfig.model_validate({"launch": {"count": 2, "cores": [[0], [1]]}, "max_staleness": 2})
    assert cfg.launch == ServerLaunch(count=2, cores=((0,), (1,))) and cfg.weight_transport == "file"
    assert InferenceConfig(urls=("http://node7:8000/",)).urls == ("http://node7:8000",)
