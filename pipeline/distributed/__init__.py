"""Data-parallel training with DeepSpeed ZeRO: the same trainer, spread over processes.

- `ds_config`: the DeepSpeed JSON, generated from `params.yaml` (never hand-edited).
- `backend`: `DeepSpeedBackend`, the data-parallel `GradientBackend` of `pipeline.trainer.update`.
- `sharding`: groups assigned to ranks whole; rollouts sampled per rank and all-gathered.
- `checkpointing`: DeepSpeed checkpoints with exact resume; Hugging Face export (ZeRO-3 too).
- `weight_sync`: full weights (gathered from ZeRO-3 shards, chunk by chunk) for the vLLM rollout engine.
- `trainer`: the hooks `pipeline.train` calls when `distributed.enabled`.
- `launch`: start N local ranks (`python -m pipeline.distributed.launch --nproc N -- CMD`).
- `export`: command line merging ZeRO shards on disk into a Hugging Face directory.

Importing this package does not import DeepSpeed; the modules that need it do.
"""
