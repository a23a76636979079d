"""A training run's lifecycle, in one place: its folder, what identifies it, what it read, whether it resumes,
and its checkpoints.

- `folder`: where a run lives (`<train.checkpoints.dir>/<run>/`), the config it records (`run_config.json`), taking
  the folder for a fresh or resumed attempt, and refusing checkpoints of another config;
- `inputs`: the digest of what a run read besides its config (code, problems, initial model, index, libraries);
- `checkpoint`, `manifest`: a single-process checkpoint written whole or not at all, and the manifest that vouches
  for its files (a DeepSpeed checkpoint has the same layout: `pipeline.distributed.checkpointing`);
- `resume_point`: the newest checkpoint a resume can continue from exactly, or a stop naming why;
- `plan`: the `RunPlan`, made once before anything loads (`--resume`, `train.checkpoints.resume: auto` or `never`), which the
  train stage hands to the recipe and to every data-parallel rank.

The update mechanics (batches, the gradient step, `Replicas`) are `pipeline.trainer`'s; it writes and loads
checkpoints through this package, which imports nothing of it.
"""
