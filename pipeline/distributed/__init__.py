"""Data-parallel training with DeepSpeed ZeRO: the same trainer, spread over processes.

- `ds_config`: the DeepSpeed JSON, generated from `params.yaml` (never hand-edited).
- `replicas`: `DeepSpeedReplicas`, one rank as the training step's `Replicas` (`pipeline.trainer.replicas`).
- `sharding`: groups assigned to ranks whole; `ShardedRollouts`, sampled per rank and all-gathered.
- `checkpointing`: DeepSpeed checkpoints with exact resume; Hugging Face export (ZeRO-3 too).
- `weight_sync`: full weights (gathered from ZeRO-3 shards, chunk by chunk) for the vLLM rollout engine.
- `launch`: where ranks run (params' `distributed` placement) and starting them with torchrun or DeepSpeed's
  launcher (`run_ranks`, what the train stage calls); a rank's own start and end (`die_with_launcher`,
  `leave_process_group`).

Importing this package does not import DeepSpeed; the modules that need it do.
"""
