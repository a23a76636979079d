"""The matrix's data-parallel sample: rows of the pairwise cover (`cases.distributed_rows`: one per protocol,
both sampling modes) run one step each under DeepSpeed ZeRO-2 on 2 gloo ranks, with the same invariants."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from pipeline.distributed.launch import on_this_machine, run_ranks
from tests.matrix.cases import distributed_rows, pairwise_rows, row_id
from tests.matrix.conftest import row_config
from tests.matrix.toy_protocols import TASKS

# The first start on a clean checkout compiles DeepSpeed's CPU communication op (1.5-5 min).
pytestmark = pytest.mark.timeout(900)


@pytest.mark.slow
def test_a_sample_of_the_matrix_on_two_zero2_ranks(tmp_path: Path, repo_root: Path, protocol_models: dict[str, Path],
                                                   tool_urls: dict[str, str]) -> None:
    rows = distributed_rows(pairwise_rows())
    cases = []
    for i, row in enumerate(rows):
        root = tmp_path / f"row{i}"
        root.mkdir()
        url = tool_urls[row["protocol"]]
        cfg = row_config(row, root, protocol_models[row["protocol"]], url, **{
            "distributed.enabled": True, "distributed.zero_stage": 2, "distributed.collectives": "gloo"})
        params = root / "params.yaml"
        params.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        cases.append({"row": row_id(row), "params": str(params), "tool": TASKS[row["protocol"]].tool, "url": url})
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    env = dict(os.environ) | {"PYTHONPATH": str(repo_root), "TORCH_EXTENSIONS_DIR": os.environ.get(
        "TORCH_EXTENSIONS_DIR", str(repo_root / ".cache" / "torch_extensions"))}
    result = run_ranks(["-m", "tests.matrix.two_rank_worker", str(tmp_path / "cases.json"), str(tmp_path)],
                       on_this_machine(2), log_dir=tmp_path / "rank_logs", env=env | {"OMP_NUM_THREADS": "1"},
                       timeout_s=900)
    assert result.returncode == 0, f"ranks failed (launcher exit {result.returncode}):\n{result.tail}"
    for rank in (0, 1):
        checked = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert [c["row"] for c in checked] == [c["row"] for c in cases]
        refilled = [c for c, row in zip(checked, rows, strict=True) if row["sampling"] == "refill"]
        assert refilled and all(c["collector"] == "ShardedRefilling" for c in refilled)
