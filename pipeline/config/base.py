"""The base of every stage config: frozen, strict, documented.

Each stage owns one `StageConfig` subclass in its own module of this package, and
`params.yaml` has one section per stage that mirrors it field by field. Unknown keys,
wrong types and out-of-range values are errors that name the key and the file.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StageConfig(BaseModel):
    """Frozen, no extra keys, no silent coercion of strings into numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=False, validate_default=True)
