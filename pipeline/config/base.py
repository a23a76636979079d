"""The base of every stage config: frozen, strict, documented.

Each stage owns one `StageConfig` subclass in its own module of this package, and
`params.yaml` has one section per stage that mirrors it field by field. Unknown keys,
wrong types and out-of-range values are errors that name the key and the file.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Strict


class StageConfig(BaseModel):
    """Frozen, no extra keys, no silent coercion of strings into numbers or booleans.

    Params files are validated in pydantic's strict mode (`pipeline.config.load_config`). Configs built in
    Python keep lax mode for containers (a list is accepted for a tuple field), but every `int`, `float` and
    `bool` field of a subclass is made strict here, so `TrainConfig(steps="4")` is refused as the file is."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=False, validate_default=True)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        scalar = [f for f in cls.model_fields.values()
                  if f.annotation in (int, float, bool) and not any(isinstance(m, Strict) for m in f.metadata)]
        for field in scalar:
            field.metadata.append(Strict())
        if scalar:
            cls.model_rebuild(force=True)
