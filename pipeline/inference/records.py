"""What a generate call sends and what it returns, as the token-in/token-out route speaks it (`/inference/v1/generate`).

Token ids in, token ids out: the request carries the whole context as ids, the answer the sampled ids exactly as
sampled (`output_mode: "tokens"`: nothing is detokenised and re-tokenised), the log-prob of each sampled token
(`logprobs: 0`: the sampled token's only), and `weight_versions`, spans of output positions and the weight version
that sampled them (a request paused for a weight push and resumed has two). A stop string is found by the server on
the text it decodes for that purpose, but the ids returned are the sampled ones: a stop string ending inside a token
keeps the whole token (as the in-process vLLM backend does).

An answer that breaks the protocol (spans that do not cover the output, a log-prob missing) is a `ProtocolError`:
the server's fault, counted as a failed attempt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MISSING_LOGPROB = -9999.0  # what vLLM sends for a sampled token it has no log-prob for (or a NaN one)


class ProtocolError(ValueError):
    """An answer that is not what the protocol promises."""


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters of one request. `seed` makes it repeatable (vLLM's per-request generator)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"bad sampling parameters: {self}")

    def body(self, token_ids: Sequence[int], request_id: str) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p, "logprobs": 0,
            "stop": list(self.stop), "stop_token_ids": list(self.stop_token_ids), "include_stop_str_in_output": True,
            "skip_special_tokens": False, "ignore_eos": self.ignore_eos, "n": 1}
        if self.seed is not None:
            params["seed"] = self.seed
        return {"request_id": request_id, "token_ids": list(token_ids), "sampling_params": params,
                "output_mode": "tokens", "return_token_ids": True}


@dataclass(frozen=True)
class Generation:
    """One completed request: per sampled token its id, behaviour log-prob and the weight version that sampled it."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    finish_reason: str  # "stop" (EOS, a stop string or a stop token), "length"
    stop_reason: str | int | None  # the stop string or stop token id; None on EOS and length
    server: str = ""
    attempts: int = 1
    cached_prompt_tokens: int | None = None  # prompt tokens the server found in its prefix cache


def versions_of(spans: Sequence[Mapping[str, Any]] | None, n_tokens: int) -> tuple[int, ...]:
    """Per output position, the weight version its span names. Spans must tile [0, n_tokens) in order; versions
    are the integers the weight push sets (a server never given one says "default": ProtocolError)."""
    versions: list[int] = []
    for span in spans or ():
        start, end, label = span.get("start"), span.get("end"), str(span.get("version"))
        if start != len(versions) or not isinstance(end, int) or end < start:
            raise ProtocolError(f"weight_versions {list(spans or ())} do not tile the {n_tokens} output tokens")
        if not label.isdigit():
            raise ProtocolError(f"weight version {label!r} is not one the push set (an integer)")
        versions += [int(label)] * (end - start)
    if len(versions) != n_tokens:
        raise ProtocolError(f"weight_versions {list(spans or ())} do not tile the {n_tokens} output tokens")
    return tuple(versions)


def parse_generation(answer: Any, server: str = "", attempts: int = 1) -> Generation:
    """The `Generation` in a JSON answer of `/inference/v1/generate` (n = 1), or `ProtocolError`."""
    try:
        (choice,) = answer["choices"]
        token_ids = tuple(int(t) for t in choice["token_ids"])
        content = choice["logprobs"]["content"]
        if [int(c["token_id"]) for c in content] != list(token_ids):
            raise ProtocolError("the log-probs are not those of the returned tokens")
        logprobs = tuple(float(c["logprob"]) for c in content)
        details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        versions = versions_of(choice.get("weight_versions"), len(token_ids))
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, ProtocolError):
            raise
        raise ProtocolError(f"not a generate answer ({type(err).__name__}: {err})") from err
    if any(lp <= MISSING_LOGPROB for lp in logprobs):
        raise ProtocolError("the server has no log-prob for a token it sampled")
    finish = choice.get("finish_reason")
    if finish not in ("stop", "length"):
        raise ProtocolError(f"finish reason {finish!r}: the request did not complete")
    return Generation(token_ids, logprobs, versions, finish, choice.get("stop_reason"), server, attempts,
                      None if cached is None else int(cached))
