"""The tools a run offers (`rollout.tools`, one registry) and how the `chat-tools` protocol talks to the model
(`rollout.chat_tools`).

Each entry of `rollout.tools` is one tool source, by `kind`:
- code, search: the project's own services (the sandbox and search sections configure them); offered when the
  services flow started them;
- python: a Python callable (`package.module:function`, sync or async) called with the model's arguments;
- http: an endpoint that receives the arguments as a JSON POST;
- mcp: an MCP server (a stdio command, or a streamable HTTP URL) whose tools and their schemas are read when
  the run starts.
The tag protocols call only code and search; the other kinds need `rollout.protocol: chat-tools`
(`pipeline.config.combinations`). See docs/tools.md.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from jsonschema import Draft202012Validator, SchemaError
from pydantic import Field, field_validator, model_validator

from pipeline.config.base import StageConfig

MAX_ANSWER_BYTES = 1 << 20  # a tool's answer is cut to max_tool_output_chars anyway: a MiB is far more than shown
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"  # what function-calling APIs and templates accept as a name
DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Call the tools when they help. When you know the answer, reply without a tool "
    "call and put the final answer in \\boxed{}.")


def check_object_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A valid JSON schema of an object (a tool's arguments); a ValueError names what is wrong."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as err:
        raise ValueError(f"not a valid JSON schema: {err.message}") from None
    if schema.get("type") != "object":
        raise ValueError("a tool's parameters must be a JSON schema with \"type\": \"object\"")
    return schema


class CodeToolEntry(StageConfig):
    kind: Literal["code"] = Field("code", description="The project's code sandbox (the sandbox section).")


class SearchToolEntry(StageConfig):
    kind: Literal["search"] = Field("search", description="The project's search service (the search section).")


class _UserTool(StageConfig):
    name: str = Field(pattern=NAME_PATTERN, description="The tool's name, as the model calls it.")
    description: str = Field(min_length=1, description="What the tool does, as the model reads it.")
    parameters: dict[str, Any] = Field(description="The arguments, as a JSON schema of an object.")
    timeout_s: float = Field(10.0, gt=0, le=3600, description="The deadline of a whole call (an endpoint's retries "
                             "and reading all of its answer included): a call that takes longer is the tool's "
                             "failure, an outage.")
    concurrency: int = Field(4, ge=1, le=1024, description="Calls of this tool in flight at once (a sync function: "
                             "its threads).")
    max_answer_bytes: int = Field(MAX_ANSWER_BYTES, ge=1024, le=1 << 30, description="A longer answer is not read "
                                  "past this many bytes; the call is answered 'too_large' (not an outage).")

    @field_validator("parameters")
    @classmethod
    def _parameters_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_object_schema(value)


class PythonToolEntry(_UserTool):
    kind: Literal["python"] = "python"
    function: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
                          description="`package.module:function`, called with the arguments as keywords; its "
                          "return value (a string, or JSON-serialisable) is what the model reads.")


class HttpToolEntry(_UserTool):
    kind: Literal["http"] = "http"
    url: str = Field(pattern=r"^https?://", description="Receives the arguments as a JSON POST; answers with "
                     "JSON {\"output\": str} (or {\"error\": str}), or with text.")
    retries: int = Field(2, ge=0, description="Retries of a refused connection or a 429/5xx answer.")


class McpToolEntry(StageConfig):
    kind: Literal["mcp"] = "mcp"
    name: str = Field(pattern=NAME_PATTERN, description="The server's name (in errors and outage counts).")
    command: tuple[str, ...] = Field((), description="stdio transport: the server's command line.")
    url: str = Field("", description="streamable HTTP transport: the server's endpoint (e.g. http://127.0.0.1:8000/mcp).")
    tools: tuple[str, ...] = Field((), description="The server's tools to offer (empty: all of them).")
    prefix: str = Field("", description="Put before each of its tools' names (to keep two servers' names apart).")
    timeout_s: float = Field(30.0, gt=0, le=3600, description="The deadline of a whole call (waiting for a "
                             "restarting server included): a call that takes longer is an outage.")
    startup_timeout_s: float = Field(60.0, gt=0, le=3600, description="Deadline of one start: starting the server, "
                                     "`initialize` and listing its tools.")
    concurrency: int = Field(4, ge=1, le=1024, description="Calls to this server in flight at once.")
    max_answer_bytes: int = Field(MAX_ANSWER_BYTES, ge=1024, le=1 << 30, description="A longer message from the "
                                  "server is not read past this many bytes: a call's result is answered 'too_large' "
                                  "(not an outage); the tool list must fit too.")
    restarts: int = Field(3, ge=0, le=100, description="Restarts in a row (no call answered between them) of a server "
                          "that failed to start, exited, or wrote a bad line, before it is given up (its calls are "
                          "then outages). At start-up: attempts after the first.")

    @model_validator(mode="after")
    def _one_transport(self) -> McpToolEntry:
        if bool(self.command) == bool(self.url):
            raise ValueError(f"mcp tool source {self.name!r}: set exactly one of command (stdio) and url "
                             "(streamable HTTP)")
        if self.url and not re.match(r"^https?://", self.url):
            raise ValueError(f"mcp tool source {self.name!r}: url must start with http:// or https://")
        return self


ToolEntry = Annotated[CodeToolEntry | SearchToolEntry | PythonToolEntry | HttpToolEntry | McpToolEntry,
                      Field(discriminator="kind")]
USER_KINDS = ("python", "http", "mcp")  # the kinds only a chat-template protocol can call


class ChatToolsConfig(StageConfig):
    """rollout.protocol chat-tools: tools declared to the model's own chat template, calls in its family's format."""

    parser: Literal["hermes", "llama3", "mistral"] = Field(
        "hermes", description="How the model family writes calls: hermes (<tool_call> JSON: Qwen, Hermes, SmolLM3, "
        "ChatML tool templates), llama3 (a JSON turn), mistral ([TOOL_CALLS] list).")
    template: str = Field(
        "", description="The chat template: empty for the tokenizer's own, a packaged one by name (hermes: ChatML "
        "with tools, for models whose template has none, such as SmolLM2), or a path to a Jinja file.")
    answer_tool: str = Field(
        "", description="Empty: the answer is the last assistant turn without a call (its last \\boxed{} if it "
        "has one). A name: a tool of that name (one string argument, `answer`) is declared, and calling it "
        "answers.")
    system_prompt: str = Field(DEFAULT_SYSTEM_PROMPT, min_length=1, description="The system turn.")

    @field_validator("answer_tool")
    @classmethod
    def _answer_tool_name(cls, value: str) -> str:
        if value and not re.match(NAME_PATTERN, value):
            raise ValueError(f"answer_tool {value!r} is not a tool name ({NAME_PATTERN})")
        return value


def entry_name(entry: CodeToolEntry | SearchToolEntry | PythonToolEntry | HttpToolEntry | McpToolEntry) -> str:
    """The name an entry is known by: the tool's (code, search, user tools) or the MCP server's."""
    return entry.kind if isinstance(entry, (CodeToolEntry, SearchToolEntry)) else entry.name


def check_unique_names(entries: tuple) -> tuple:
    names = [entry_name(e) for e in entries]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"rollout.tools names {repeated} more than once")
    return entries
