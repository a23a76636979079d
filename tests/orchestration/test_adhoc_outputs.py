"""Ad-hoc runs never write DVC's outputs, for every stage that writes (prepare_model, build_index, curate, sft,
train, evaluate): a run with another params file, a `--label`, `--out` or (evaluate) a `--model` places every path
it writes under runs/<stage>/<label>/ (or `--out`), and the stage command dvc.yaml runs writes in place.

Found with `python -m flows.curate --params other.yaml`: it rewrote data/curated in place (75 -> 68 rows), `dvc
status` then showed curate modified, and curate refused `--label`. Each stage's command line is parsed by its own
parser and resolved by its own flow module (the function its flow calls first), and what it would write is
checked against dvc.yaml; the cheap stages also run for real in a scratch workspace holding DVC outputs that must
stay as they were.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path, PurePosixPath

import pytest
import yaml

from flows.cli import COMMANDS, parser_for
from flows.outputs import RUNS_ROOT, STAGE_OUTPUTS, Placement, dvc_tracked, placement, touches
from pipeline.config import RunConfig, load_config
from tests.helpers.workspace import make_workspace, subprocess_env

REPO = Path(__file__).resolve().parents[2]
DVC = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
TRACKED = dvc_tracked(REPO / "dvc.yaml")
WRITING = sorted(m for m in COMMANDS if m not in ("services", "pipeline"))
DVC_STAGES = {m: [s for s, stage in DVC.items() if stage["cmd"].startswith(f"python -m flows.{m} ")] for m in WRITING}
FIXED = {"sft": ("metrics",), "train": ("metrics",)}  # what a stage writes that no params key names: its metrics


def dvc_outputs(stage: str) -> list[str]:
    entries = [e for kind in ("outs", "metrics", "plots") for e in DVC[stage].get(kind) or ()]
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries]


def resolved(module: str, argv: list[str]) -> tuple[RunConfig, Placement]:
    """The config a `python -m flows.<module> <argv>` run writes with, as its flow resolves it, and its placement."""
    args = vars(parser_for(module).parse_args(argv))
    flows = importlib.import_module(f"flows.{module}")
    if module == "train":  # the train flow's own first lines
        place = placement("train", args["params"], label=args["label"], out=args["out"], ad_hoc=False)
        return flows.placed_config(load_config(args["params"]), place), place
    if module == "evaluate":  # (config, stage name): it writes no fixed path
        return flows.configured(**args)[0], Placement(None, None)
    return flows.configured(**args)


def written(module: str, cfg: RunConfig, place: Placement) -> list[Path]:
    """Every path this run of `module` writes: the params keys of its outputs, its fixed paths."""
    keys = [Path(getattr(getattr(cfg, k.split(".")[0]), k.split(".")[1])) for k in STAGE_OUTPUTS[module]]
    return keys + [place.place(p) for p in FIXED.get(module, ())]


def variants(module: str, other: str) -> list[list[str]]:
    found = [["--params", other], ["--params", "params.yaml", "--label", "try 1"], ["--out", "scratch/try"]]
    if module == "evaluate":
        found += [["--model", "runs/step2"], ["--params", other, "--baseline", "base"],
                  ["--baseline", "sft", "--label", "mine"]]
    return found


@pytest.fixture()
def other_params(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(REPO)
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump({"extends": str(REPO / "params.yaml"), "run": {"seed": 1}}))
    return str(path)


@pytest.mark.parametrize("module", WRITING)
def test_the_stage_command_writes_dvcs_outputs_and_covers_every_one(module: str, other_params: str) -> None:
    """The command each dvc.yaml stage runs writes in place, and what it writes covers the stage's outs."""
    assert DVC_STAGES[module], module
    for stage in DVC_STAGES[module]:
        cfg, place = resolved(module, DVC[stage]["cmd"].split()[3:])
        paths = [PurePosixPath(p.as_posix()) for p in written(module, cfg, place)]
        assert all(touches(p, TRACKED) for p in paths), (stage, paths)
        for out in dvc_outputs(stage):
            assert any(touches(out, (p,)) for p in paths), (stage, out, paths)


@pytest.mark.parametrize("module", WRITING)
def test_an_ad_hoc_run_of_any_stage_writes_under_runs_never_into_dvcs_outputs(module: str, other_params: str) -> None:
    for argv in variants(module, other_params):
        cfg, place = resolved(module, argv)
        for path in written(module, cfg, place):
            assert not touches(path, TRACKED), (module, argv, path)
            root = Path("scratch/try") if "--out" in argv else RUNS_ROOT / module
            assert root.absolute() in path.absolute().parents, (module, argv, path)


def test_every_stage_command_takes_a_label_and_an_out(other_params: str) -> None:
    for module in WRITING:
        args = vars(parser_for(module).parse_args(["--label", "x", "--out", "y"]))
        assert (args["label"], args["out"]) == ("x", "y"), module


# One process runs the stage commands one after another (the imports and Prefect's server once), as a shell would.
DRIVER = textwrap.dedent("""
    import json, sys
    from flows.cli import main
    codes = []
    for module, *argv in json.loads(sys.argv[1]):
        try:
            main(module, argv)
        except SystemExit as done:
            codes.append([module, *argv, done.code])
    print("codes", json.dumps(codes), flush=True)
""")
CHEAP = {"model": {"path": "tiny-model"}, "sft": {"enabled": False, "init_model": "tiny-model"},
         "curate": {"calculator": {"n_train": 3, "n_test": 2}, "wiki_facts": {"enabled": False}},
         "search": {"corpus_path": "corpus.jsonl", "corpus_format": "jsonl"},
         "run": {"tracking_uri": "sqlite:///mlruns.db", "torch_threads": 1}}


@pytest.mark.slow
def test_ad_hoc_runs_of_the_cheap_stages_leave_dvcs_outputs_as_they_were(tmp_path: Path, repo_root: Path,
                                                                         prefect_server: str) -> None:
    ws = make_workspace(tmp_path / "ws", repo_root, CHEAP)
    (ws / "corpus.jsonl").write_text(json.dumps({"id": "a", "title": "Algeria", "text": "Its capital is Algiers."}))
    (ws / "other.yaml").write_text(yaml.safe_dump({"extends": "params.yaml", "curate": {"seed": 3}}))
    before = {}
    for out in ("data/curated/train.jsonl", "data/search/index/x", "models/base/x", "models/sft/x", "metrics/sft.json"):
        (ws / out).parent.mkdir(parents=True, exist_ok=True)
        (ws / out).write_text("DVC's own output\n")
        before[out] = (ws / out).read_bytes()
    runs = [["curate", "--params", "other.yaml"], ["curate", "--label", "mine"], ["build_index", "--label", "mine"],
            ["prepare_model", "--params", "other.yaml"], ["sft", "--label", "mine"]]
    env = {**subprocess_env(prefect_server, tmp_path / "prefect"), "PYTHONPATH": str(ws)}
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(runs)], cwd=ws, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    codes = json.loads(done.stdout.split("codes ", 1)[1])
    assert [c[-1] for c in codes] == [0] * len(runs), (codes, done.stderr[-3000:])
    assert {out: (ws / out).read_bytes() for out in before} == before  # DVC's outputs as they were
    assert len((ws / "runs/curate/other/data/curated/train.jsonl").read_text().splitlines()) == 3
    assert (ws / "runs/curate/mine/data/curated/report.json").is_file()
    assert (ws / "runs/build_index/mine/data/search/index").is_dir()
    assert (ws / "runs/prepare_model/other/models/base/config.json").is_file()
    assert (ws / "runs/sft/mine/models/sft/config.json").is_file()
    assert json.loads((ws / "runs/sft/mine/metrics/sft.json").read_text()) == {"sft/traces": 0.0}
    assert not os.path.exists(repo_root / "runs" / "build_index" / "mine")  # not beside the code either
