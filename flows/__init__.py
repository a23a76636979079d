"""Prefect flows: thin wrappers that load the typed config and call the library (`pipeline/`).

Each stage is `python -m flows.<stage> --params params.yaml`, so the same code runs under
`dvc repro`, from the command line and as a Prefect deployment.
"""
