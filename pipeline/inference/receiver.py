"""The worker extension a launched vLLM server is started with (`--worker-extension-cls`): what the trainer's weight
push calls through `POST /collective_rpc` on every worker of the server.

- `tapo_layout()`: the names, shapes and dtypes of the checkpoint the server started from (JSON), so the trainer can
  check a push before it writes or sends anything.
- `tapo_load_file(path, version)`: load a safetensors file of full tensors (HF names) into the running model with
  the model runner's in-place `reload_weights` (as `pipeline.rollout.backends.vllm_weights.WeightSync` does for the
  in-process backend; a whole-model file needs none of its partial-chunk handling). The file is checked first, and
  a file that is not the checkpoint's, or not the version asked for, is refused without touching the model (the
  answer says why); only a failure inside the reload itself raises, and the caller then treats the server as dead.

Arguments arrive as strings (vLLM's HTTP route passes only strings) and answers are JSON. Imports nothing of vLLM
and only `pipeline.inference.layout` of this project: it runs inside vLLM's worker processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.inference.layout import Layout, as_json, check_layout, checkpoint_layout, file_layout

VERSION_KEY = "tapo_version"  # the safetensors metadata entry that names the file's weight version


class TapoReceiver:
    """Mixed into each vLLM worker; `self.model_runner` and `self.model_config` are the worker's."""

    _tapo_layout: Layout | None = None

    def tapo_layout(self) -> dict[str, list]:
        return as_json(self._checkpoint())

    def tapo_load_file(self, path: str, version: str) -> dict[str, Any]:
        refusal = self._refusal(Path(path), version)
        if refusal:
            return {"loaded": 0, "refused": refusal}
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            names = list(f.keys())
            # reload_weights, not model.load_weights: vLLM post-processes the layers after loading (see WeightSync)
            self.model_runner.reload_weights(weights_iterator=((n, f.get_tensor(n)) for n in names))  # type: ignore[attr-defined]
        return {"loaded": len(names), "refused": ""}

    def _checkpoint(self) -> Layout:
        if self._tapo_layout is None:
            self._tapo_layout = checkpoint_layout(Path(self.model_config.model))  # type: ignore[attr-defined]
        return self._tapo_layout

    def _refusal(self, path: Path, version: str) -> str:
        try:
            layout, metadata = file_layout(path)
            check_layout(self._checkpoint(), {name: shape for name, (shape, _) in layout.items()})
        except (OSError, ValueError) as err:  # WeightLayoutError is a ValueError; so is a broken header
            return f"{type(err).__name__}: {err}"
        if metadata.get(VERSION_KEY) != version:
            return f"{path} holds version {metadata.get(VERSION_KEY)!r}, not {version!r}"
        return ""
