"""One rank of the matrix's data-parallel sample: for each row, `pipeline.train.set_up` with DeepSpeed ZeRO-2,
one step as `pipeline.train.run` makes it, and the matrix invariants on what this rank trains.

Usage: python -m tests.matrix.two_rank_worker CASES_JSON OUT_DIR. Each rank writes OUT_DIR/rank-R.json
listing the rows it checked; a failed invariant raises (the launcher then reports a non-zero exit).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from pipeline.config import load_config
from pipeline.train import prepared_batch, set_up, update
from pipeline.distributed.launch import leave_process_group
from tests.matrix.cases import (check_dropped_rows_of_the_batch_train_nothing, check_metrics,
                                check_tool_output_gets_no_gradient, collect_until_kept)


def one_step(tr) -> dict[str, float]:
    kept, anchored = collect_until_kept(tr)
    groups = kept + anchored
    mine, _ = tr.replicas.share(groups)
    batch, weight = prepared_batch(tr, groups)  # this rank's share, as the step builds it
    if weight:  # an idle rank's batch is a placeholder (weight 0)
        check_dropped_rows_of_the_batch_train_nothing(batch, mine, anchored)
    check_tool_output_gets_no_gradient(tr, batch, mine)
    metrics = update(tr, kept, anchored)
    check_metrics(tr.cfg, metrics)
    return metrics


def main(cases_path: Path, out: Path) -> None:
    checked = []
    for case in json.loads(cases_path.read_text()):
        cfg = load_config(case["params"])
        tr = set_up(cfg, {case["tool"]: case["url"]})
        try:
            metrics = one_step(tr)
        finally:
            tr.engine.close()
        checked.append({"row": case["row"], "loss": metrics["train/loss"], "collector": type(tr.sampler).__name__})
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(checked))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
    leave_process_group()
