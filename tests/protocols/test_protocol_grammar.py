"""Each registered protocol reads back what it writes itself, and the registry is the config's choice.

What a protocol writes (a call, ending at its stop string; the engine's wrapping of a tool output; an
answer) must pass its own format check and give the answer back: the rollout, the SFT teacher and the
scorer all speak through the one object, so a grammar edit that broke this would train on -1 rewards.
"""

from __future__ import annotations

import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config.rollout import RolloutConfig
from pipeline.paths import REPO_ROOT
from pipeline.protocols import PROTOCOL_NAMES, PROTOCOLS, ToolProtocol, protocol_for
from pipeline.reward import check_format

# Text free of every protocol's markup (tags, fences, boxes) and of the engine's output mark.
plain = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<>`\\{}\x00"),
                max_size=40)
filled = plain.filter(str.strip)


def _first_stop_end(text: str, stops: tuple[str, ...]) -> int | None:
    found = [text.find(stop) + len(stop) for stop in stops if stop in text]
    return min(found) if found else None


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
@settings(max_examples=150, deadline=None)
@given(data=st.data(), thought=plain, call_input=filled, output=plain, answer=filled)
def test_what_a_protocol_writes_it_reads_back(name: str, data: st.DataObject, thought: str, call_input: str,
                                              output: str, answer: str) -> None:
    protocol = protocol_for(name)
    tool = data.draw(st.sampled_from(protocol.tools))
    call = protocol.render_call(tool, call_input, thought)
    # The decoder stops right after the first stop string: a rendered call must end exactly there.
    assert _first_stop_end(call, protocol.stop_strings((tool,))) == len(call)
    parsed = protocol.read_segment(call, (tool,)).call
    assert parsed is not None and (parsed.tool, parsed.input, parsed.error) == (tool, call_input.strip(), None)

    final = protocol.render_answer(answer)
    assert protocol.read_segment(final, (tool,)).answered
    text = call + protocol.wrap_output(output) + final
    for strict in (True, False):
        result = check_format(text, protocol, [output], strict=strict)
        assert result.ok, result.reason
        assert protocol.extract_answer(result.model_text) == answer.strip()


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_a_model_written_output_fails_its_own_check(name: str) -> None:
    protocol = protocol_for(name)
    call = protocol.render_call(protocol.tools[0], "x", "t")
    forged = call + protocol.wrap_output("42") + protocol.render_answer("42")
    assert not check_format(forged, protocol, []).ok  # no tool ran, so the output is the model's


def test_the_registered_protocols_are_the_configs_choices() -> None:
    allowed = typing.get_args(RolloutConfig.model_fields["protocol"].annotation)
    assert set(PROTOCOL_NAMES) == set(allowed) and set(PROTOCOLS) < set(PROTOCOL_NAMES)
    assert all(isinstance(p, ToolProtocol) and p.name == name for name, p in PROTOCOLS.items())
    assert all(isinstance(protocol_for(name), ToolProtocol) and protocol_for(name).name == name
               for name in PROTOCOL_NAMES)


def test_an_unknown_protocol_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown protocol 'xml'"):
        protocol_for("xml")


def test_only_the_config_and_the_protocols_name_a_protocol() -> None:
    """No part of the library asks which protocol is configured: it calls the object it was given."""
    allowed = ("pipeline/config/", "pipeline/protocols/")
    names = [f'"{name}"' for name in PROTOCOL_NAMES] + ["protocol =="]
    naming = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "pipeline").rglob("*.py")
                    if not str(p.relative_to(REPO_ROOT)).startswith(allowed)
                    and any(n in p.read_text() for n in names))
    assert naming == [], naming


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
@settings(max_examples=50, deadline=None)
@given(call_input=filled, at=st.integers(0, 40), surrogate=st.integers(0xD800, 0xDFFF))
def test_lone_surrogate_in_a_call_is_refused_where_it_is_read(name: str, call_input: str, at: int,
                                                              surrogate: int) -> None:
    """No tool is handed text a UTF-8 writer cannot write: a call holding a lone surrogate is malformed."""
    protocol = protocol_for(name)
    tool = protocol.tools[0]
    at = at % (len(call_input) + 1)
    call = protocol.render_call(tool, call_input[:at] + chr(surrogate) + call_input[at:], "t")
    parsed = protocol.read_segment(call, (tool,)).call
    assert parsed is not None and parsed.input == "" and "lone surrogate" in parsed.error, parsed
