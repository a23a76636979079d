"""A tool's argument schema compiled once at start-up, and the check of a call's arguments against it: total, and
of a cost the policy does not control.

The schema comes from outside the project (an MCP server's `inputSchema`, a user tool's `parameters`) and the
arguments from the policy, so neither is trusted:

- At start-up (`compile_arguments`, called when a protocol binds its tools) a schema is refused, naming the tool
  and where it came from (`ToolSpec.origin`), when it is not a valid JSON schema (draft 2020-12); when a `$ref`
  is not a local JSON pointer (`#/$defs/...`) that resolves (nothing is fetched, at start-up or later), or the
  references form a cycle (`{"$ref": "#"}` recurses for ever; a tree-shaped recursive schema is refused too, so
  that validation is as deep as the schema, never as deep as the arguments); when it nests deeper than
  MAX_SCHEMA_DEPTH or expands, references followed, to more than MAX_SCHEMA_NODES subschemas (a chain of
  references used twice each is exponential); or when a `pattern` / `patternProperties` regex is not RE2's.
- Every regex is matched by RE2 (google-re2), in time linear in the text whatever the pattern. Chosen over the
  alternatives: jsonschema's own matching is Python's backtracking `re`, where `^(a+)+$` takes seconds on 27
  characters the policy writes; the `regex` package's timeout is wall time (a busy machine turns a legitimate
  match into a refusal, and every call can still cost the whole timeout); a hand-made "safe subset" of `re`
  would be a second regex grammar to get right. RE2 has no look-around or back-references: a pattern using
  them is refused at start-up, never matched by a backtracking engine. jsonschema calls `re` from `pattern`,
  `patternProperties` and `additionalProperties`, which are replaced here; its `unevaluatedProperties` does too,
  so a schema that has both it and `patternProperties` is refused.
- The check (`ArgumentSchema.check`) is total: arguments nested deeper than MAX_ARGUMENT_DEPTH are refused
  before jsonschema sees them (it recurses, and so do the reprs in its messages), strings are made valid Unicode
  (`tokens.valid_json`: RE2 and the tool clients take UTF-8), `uniqueItems` is checked in linear time
  (jsonschema's falls back to comparing every pair), and whatever else the validator raises refuses that call.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import unquote

import re2
from jsonschema import Draft202012Validator, SchemaError, ValidationError, validators
from jsonschema.exceptions import best_match
from referencing import Registry

from pipeline.protocols.tokens import valid_json
from pipeline.types import ToolSpec

MAX_SCHEMA_DEPTH = 32  # subschemas within subschemas, references followed
MAX_SCHEMA_NODES = 4096  # subschemas, references followed (what one validation may visit per argument value)
MAX_SCHEMA_JSON_DEPTH = 2 * MAX_SCHEMA_DEPTH + 16  # the schema as JSON (a subschema level is 2 JSON levels)
MAX_ARGUMENT_DEPTH = 64  # arrays and objects within each other in a call's arguments

# Keywords whose value is a subschema, a map of subschemas, or a list of them (draft 2020-12, and the
# draft-07 spellings jsonschema still reads: `definitions`, `dependencies`, `additionalItems`).
_ONE = ("additionalProperties", "unevaluatedProperties", "propertyNames", "items", "contains", "unevaluatedItems",
        "not", "if", "then", "else", "additionalItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_UNSUPPORTED = ("$dynamicRef", "$recursiveRef")


class ToolSchemaError(ValueError):
    """A tool's argument schema that cannot be compiled; names the tool and where it came from."""


class _Refused(Exception):
    """Why a schema is refused (raised inside the checks, reported as a ToolSchemaError)."""


@lru_cache(maxsize=4096)
def regex(pattern: str) -> re2._Regexp:
    """The RE2 program of a JSON-schema pattern (re2.error when RE2 cannot compile it)."""
    options = re2.Options()
    options.log_errors = False  # a refused pattern is reported once, by the caller
    return re2.compile(pattern, options)


def _pattern(validator, pattern: str, instance: Any, schema: dict) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator, patterns: dict, instance: Any, schema: dict) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if regex(pattern).search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator, additional: Any, instance: Any, schema: dict) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    named, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = [k for k in instance if k not in named and not any(regex(p).search(k) for p in patterns)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif additional is False and extras:
        verb = "was" if len(extras) == 1 else "were"  # jsonschema's own wording
        yield ValidationError(f"Additional properties are not allowed ({', '.join(map(repr, extras))} {verb} "
                              "unexpected)")


def _unique_items(validator, unique: Any, instance: Any, schema: dict) -> Iterator[ValidationError]:
    if unique and validator.is_type(instance, "array"):
        seen: set[str] = set()
        for item in instance:
            key = json.dumps(_canonical(item), sort_keys=True)
            if key in seen:
                yield ValidationError(f"{instance!r} has non-unique elements")
                return
            seen.add(key)


def _canonical(value: Any) -> Any:
    """Equal JSON values (as JSON Schema compares them: 1 == 1.0, true != 1) are equal here."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


_Validator = validators.extend(Draft202012Validator, {
    "pattern": _pattern, "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties, "uniqueItems": _unique_items})


@dataclass(frozen=True)
class ArgumentSchema:
    """One tool's compiled argument schema."""

    name: str
    validator: Any  # a draft 2020-12 validator whose regexes run on RE2

    def check(self, arguments: Any) -> tuple[Any, str | None]:
        """The arguments made valid (`tokens.valid_json`) and why the schema refuses them (None: it accepts
        them). Never raises."""
        if json_depth(arguments, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
            return arguments, f"the arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels"
        arguments = valid_json(arguments)
        try:
            error = best_match(self.validator.iter_errors(arguments))
        except Exception as err:  # noqa: BLE001 - whatever the validator meets, the call is refused, not the rollout
            return arguments, f"the arguments could not be checked ({type(err).__name__})"
        if error is None:
            return arguments, None
        where = "/".join(str(p) for p in error.absolute_path)
        return arguments, error.message + (f" (at {where})" if where else "")


def compile_arguments(spec: ToolSpec) -> ArgumentSchema:
    """The tool's argument schema compiled and checked (see the module docstring); a ToolSchemaError names the
    tool, where it came from and what is wrong."""
    schema = dict(spec.parameters)
    if "properties" in schema and "additionalProperties" not in schema:
        schema["additionalProperties"] = False  # an argument the schema does not name is a mistake, not an extra
    try:
        _check(schema)
    except _Refused as why:
        origin = spec.origin or "rollout.tools"
        raise ToolSchemaError(f"{origin}: tool {spec.name!r}: its argument schema cannot be used: {why}") from None
    return ArgumentSchema(spec.name, _Validator(schema, registry=Registry()))


def _check(schema: dict) -> None:
    if json_depth(schema, MAX_SCHEMA_JSON_DEPTH) > MAX_SCHEMA_JSON_DEPTH:
        raise _Refused(f"it nests deeper than {MAX_SCHEMA_JSON_DEPTH} JSON levels")
    try:
        Draft202012Validator.check_schema(schema, format_checker=None)  # its regexes are RE2's, checked below
    except SchemaError as err:
        raise _Refused(f"not a valid JSON schema: {err.message}") from None
    except RecursionError:  # not reached below the depth bound; a schema must never reach the rollout's stack
        raise _Refused("not a valid JSON schema (too deep to check)") from None
    _Expansion(schema).measure(schema, ())


class _Expansion:
    """The schema with its references followed: its depth and size, measured once per subschema (memoised), a
    cycle of references refused, every regex compiled by RE2."""

    def __init__(self, root: dict) -> None:
        self.root = root
        self.sizes: dict[int, tuple[int, int]] = {}  # id(subschema) -> (depth, nodes)
        self.nodes = 0
        self.uses_unevaluated = self.uses_patterns = False

    def measure(self, node: Any, path: tuple[str, ...]) -> tuple[int, int]:
        if not isinstance(node, dict):
            return 1, 1
        if id(node) in self.sizes:
            return self.sizes[id(node)]
        if len(path) > MAX_SCHEMA_DEPTH:
            raise _Refused(f"it nests deeper than {MAX_SCHEMA_DEPTH} subschemas (at {'/'.join(path) or '#'})")
        self.sizes[id(node)] = (MAX_SCHEMA_DEPTH + 1, MAX_SCHEMA_NODES + 1)  # on the path: reaching it again is a cycle
        self._keywords(node, path)
        children = [(child, where) for child, where in _subschemas(node)]
        if "$ref" in node:
            children.append((self._target(node["$ref"], path), "$ref"))
        depth, nodes = 1, 1
        for child, where in children:
            if isinstance(child, dict) and self.sizes.get(id(child)) == (MAX_SCHEMA_DEPTH + 1, MAX_SCHEMA_NODES + 1):
                raise _Refused(f"its references form a cycle (at {'/'.join((*path, where))})")
            d, n = self.measure(child, (*path, where))
            depth, nodes = max(depth, d + 1), nodes + n
        if depth > MAX_SCHEMA_DEPTH:
            raise _Refused(f"it nests deeper than {MAX_SCHEMA_DEPTH} subschemas, references followed")
        if nodes > MAX_SCHEMA_NODES:
            raise _Refused(f"it expands to more than {MAX_SCHEMA_NODES} subschemas, references followed")
        self.sizes[id(node)] = depth, nodes
        return depth, nodes

    def _keywords(self, node: dict, path: tuple[str, ...]) -> None:
        where = "/".join(path) or "#"
        for keyword in _UNSUPPORTED:
            if keyword in node:
                raise _Refused(f"{keyword} is not supported (at {where}); use $ref to a local definition")
        if "$id" in node and node is not self.root:
            raise _Refused(f"$id inside the schema is not supported (at {where}): references resolve from the root")
        patterns = list(node.get("patternProperties", {})) if isinstance(node.get("patternProperties"), dict) else []
        if isinstance(node.get("pattern"), str):
            patterns.append(node["pattern"])
        for pattern in patterns:
            try:
                regex(pattern)
            except re2.error as err:
                raise _Refused(f"the regex {pattern!r} (at {where}) is not RE2 syntax, which matches in linear time "
                               f"(no look-around, no back-references): {_reason(err)}") from None
        self.uses_patterns |= "patternProperties" in node
        self.uses_unevaluated |= "unevaluatedProperties" in node
        if self.uses_patterns and self.uses_unevaluated:
            raise _Refused("unevaluatedProperties together with patternProperties is not supported (jsonschema "
                           "would match property names with a backtracking regex engine)")

    def _target(self, ref: Any, path: tuple[str, ...]) -> Any:
        """The subschema a local JSON pointer reference names."""
        where = "/".join(path) or "#"
        if not isinstance(ref, str) or not ref.startswith("#") or (len(ref) > 1 and not ref.startswith("#/")):
            raise _Refused(f"$ref {ref!r} (at {where}) is not a local JSON pointer (#/...); nothing is fetched")
        node: Any = self.root
        for token in ref[2:].split("/") if len(ref) > 1 else ():
            token = unquote(token).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                raise _Refused(f"$ref {ref!r} (at {where}) does not resolve")
        if not isinstance(node, (dict, bool)):
            raise _Refused(f"$ref {ref!r} (at {where}) names no schema")
        return node


def _subschemas(node: dict) -> Iterator[tuple[Any, str]]:
    for keyword in _ONE:
        if isinstance(node.get(keyword), (dict, bool)):
            yield node[keyword], keyword
    for keyword in _MAP:
        if isinstance(node.get(keyword), dict):
            for key, child in node[keyword].items():
                if isinstance(child, (dict, bool)):
                    yield child, f"{keyword}/{key}"
    for keyword in _LIST:
        if isinstance(node.get(keyword), list):
            for i, child in enumerate(node[keyword]):
                yield child, f"{keyword}/{i}"


def _reason(err: Exception) -> str:
    message = err.args[0] if err.args else err
    return message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)


def json_depth(value: Any, limit: int) -> int:
    """How deeply arrays and objects nest in `value` (0 for a scalar), counted up to `limit + 1`; iterative,
    so any depth is measured without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if depth > limit:
            return depth
        stack.extend((child, depth + 1) for child in children)
    return deepest
