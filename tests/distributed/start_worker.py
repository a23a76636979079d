"""One rank that joins a DeepSpeed process group on gloo (building or loading its C++ op) and leaves it; it marks
OUT/started.<rank>. For `test_build_locks`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipeline.config.distributed import DistributedConfig
from pipeline.distributed.launch import leave_process_group
from pipeline.distributed.replicas import init_process_group

if __name__ == "__main__":
    init_process_group(DistributedConfig(enabled=True, collectives="gloo"))
    (Path(sys.argv[1]) / f"started.{os.environ['RANK']}").touch()
    leave_process_group()
