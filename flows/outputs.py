"""Where a stage writes: the outputs dvc.yaml declares belong to `dvc repro`.

The command a dvc.yaml stage runs (`python -m flows.<stage> --params params.yaml`) writes the stage's
declared outputs. Any other run of a stage is ad hoc (another params file, `--model`, `--label`, `--out`): each
of its output paths that is, holds or lies inside a DVC-tracked output (`outs`, `metrics`, `plots` of any
stage) is placed under `runs/<stage>/<label>/` instead (`--out DIR` chooses another root, `--out .`
writes in place), so an ad-hoc run never makes `dvc status` find a stage modified. Paths that DVC does
not track are left where the params put them, and so are a stage's inputs (another stage's outputs).

Every stage that writes resolves its config here first (`placed_run`): the params keys it writes
(`STAGE_OUTPUTS`) are placed, and the stage places the fixed paths it writes (`metrics`) with the same
`Placement`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import yaml

from pipeline.config import DEFAULT_PARAMS, RunConfig

DVC_FILE = Path("dvc.yaml")
RUNS_ROOT = Path("runs")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_REGISTRY_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>[^/]+)|@(?P<alias>.+))$")
# The params keys (`section.field`) each stage writes, by its flow module's name; its fixed paths (metrics/) are
# placed by the stage itself. tests/orchestration/test_adhoc_outputs.py checks these against dvc.yaml.
STAGE_OUTPUTS: dict[str, tuple[str, ...]] = {
    "prepare_model": ("model.base_dir",),
    "build_index": ("search.index_dir",),
    "curate": ("curate.output_dir",),
    "sft": ("sft.output_dir",),
    "train": ("train.output_dir",),
    "evaluate": ("evaluate.output_dir",),
}


def dvc_tracked(dvc_file: Path = DVC_FILE) -> tuple[PurePosixPath, ...]:
    """Every path a stage of `dvc_file` declares as an output, metric or plot (none without the file)."""
    if not dvc_file.is_file():
        return ()
    stages = (yaml.safe_load(dvc_file.read_text()) or {}).get("stages") or {}
    paths = set()
    for stage in stages.values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind) or ():
                paths.add(PurePosixPath(next(iter(entry)) if isinstance(entry, dict) else entry))
    return tuple(sorted(paths))


def touches(path: str | Path, tracked: tuple[PurePosixPath, ...]) -> bool:
    """True when writing `path` (a file or a folder of outputs) would write a DVC-tracked output."""
    own = PurePosixPath(Path(path).as_posix())
    if own.is_absolute() or ".." in own.parts:
        resolved = Path(path).resolve()
        cwd = Path.cwd().resolve()
        if not resolved.is_relative_to(cwd):
            return False
        own = PurePosixPath(resolved.relative_to(cwd).as_posix())
    return any(own == t or own in t.parents or t in own.parents for t in tracked)


def label_of(text: str) -> str:
    """A label as one folder name: `models:/tapo-policy/3` -> `tapo-policy-v3`, `runs/step2` -> `step2`."""
    found = _REGISTRY_URI.match(text)
    if found:
        text = f"{found['name']}-{'v' + found['version'] if found['version'] else found['alias']}"
    elif text.startswith("runs:/"):
        text = "run-" + text.removeprefix("runs:/").replace("/", "-")
    else:
        text = Path(text.rstrip("/")).name or text
    cleaned = _UNSAFE.sub("-", text).strip("-.")
    return cleaned or "adhoc"


def is_stage_command(params: str | Path) -> bool:
    """Whether `--params` is the file dvc.yaml's stage commands read (params.yaml here)."""
    return Path(params).resolve() == DEFAULT_PARAMS.resolve()


@dataclass(frozen=True)
class Placement:
    """Where one run of a stage writes: in place (`root` None, the DVC stage) or under `root`."""

    label: str | None
    root: Path | None
    tracked: tuple[PurePosixPath, ...] = ()

    def place(self, path: str | Path) -> Path:
        """`path`, or `root/path` when this run is ad hoc and `path` is a DVC-tracked output."""
        if self.root is None or not touches(path, self.tracked):
            return Path(path)
        relative = Path(path).resolve().relative_to(Path.cwd().resolve()) if Path(path).is_absolute() else Path(path)
        return self.root / relative


def placement(stage: str, params: str | Path, *, label: str | None, out: str | None, ad_hoc: bool) -> Placement:
    """The DVC stage (the stage command, no override) writes in place; an ad-hoc run under
    `runs/<stage>/<label>/`, or `out` (`.`: in place)."""
    if out is not None and Path(out) == Path("."):
        return Placement(label, None)
    if not ad_hoc and not label and out is None and is_stage_command(params):
        return Placement(None, None)
    name = label_of(label or Path(params).stem)
    return Placement(name, Path(out) if out is not None else RUNS_ROOT / stage / name, dvc_tracked())


def placed(cfg: RunConfig, keys: tuple[str, ...], place: Placement) -> RunConfig:
    """`cfg` with each `section.field` in `keys` set to where this run writes it (`place.place`)."""
    for key in keys:
        section, name = key.split(".")
        part = getattr(cfg, section)
        where = str(place.place(getattr(part, name)))
        cfg = cfg.model_copy(update={section: part.model_copy(update={name: where})})
    return cfg


def placed_run(stage: str, params: str | Path, cfg: RunConfig, *, label: str | None, out: str | None,
               ad_hoc: bool = False) -> tuple[RunConfig, Placement]:
    """This run of `stage`: its config with the outputs it writes placed (`STAGE_OUTPUTS`), and the placement
    for the fixed paths it writes."""
    place = placement(stage, params, label=label, out=out, ad_hoc=ad_hoc)
    return placed(cfg, STAGE_OUTPUTS[stage], place), place
