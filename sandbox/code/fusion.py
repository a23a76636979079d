"""SandboxFusion compatibility: its `/run_code` request and response shapes.

Clients written for SandboxFusion (verl's `call_sandbox_api`, ToRL's rollout) can point at
this service unchanged. Mapping of our statuses onto its vocabulary:

    ok           -> status "Success", run_result.status "Finished", return_code 0
    timeout      -> status "Failed",  run_result.status "TimeLimitExceeded"
    anything else-> status "Failed",  run_result.status "Finished", non-zero return_code,
                    the one-line reason appended to stderr (SandboxFusion has no separate
                    memory/output-limit statuses, and its clients read stderr)

Departures: only `language: "python"` runs (others get "SandboxError" as SandboxFusion
answers for a language it cannot run); `compile_timeout` is accepted and ignored;
`memory_limit_MB: -1` means the server's maximum rather than unlimited; `files` and
`fetch_files` are bounded (see `sandbox.code.files`), and a file asked for under several
spellings of one path is returned once, under the first.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sandbox.code.messages import Outcome


class RunCodeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    code: str = Field(..., description="Program source.")
    language: str = Field(..., description="Only 'python' runs here.")
    compile_timeout: float = Field(10.0, ge=0, allow_inf_nan=False, description="Accepted for compatibility; Python has no compile step.")
    run_timeout: float = Field(10.0, gt=0, allow_inf_nan=False, description="Wall-clock limit in seconds; capped by the server.")
    memory_limit_MB: int = Field(-1, description="Memory budget; -1 = the server's maximum.")
    stdin: str | None = Field(None, description="Text fed to standard input (at most 64 KiB).")
    files: dict[str, str | None] = Field(default_factory=dict, description="Relative path -> base64 content, written before the run (at most 64 files).")
    seed: int | None = Field(None, ge=0, lt=1 << 64, strict=True, description="Our extension: seeds the snippet's random generators (as `POST /run`).")
    fetch_files: list[str] = Field(default_factory=list, description="Relative paths returned base64 after the run (at most 64; one per normalised path, 1 MiB each, 4 MiB in all).")


def response(outcome: Outcome) -> dict:
    timed_out = outcome.status == "timeout"
    stderr = outcome.stderr
    if outcome.error and not stderr.rstrip().endswith(outcome.error):
        stderr = (stderr + ("\n" if stderr and not stderr.endswith("\n") else "") + outcome.error + "\n")
    return_code = 0 if outcome.status == "ok" else (outcome.return_code if outcome.return_code not in (None, 0) else 1)
    run_result = {
        "status": "TimeLimitExceeded" if timed_out else "Finished",
        "execution_time": round(outcome.duration_ms / 1000, 6),
        "return_code": None if timed_out else return_code,
        "stdout": outcome.stdout,
        "stderr": stderr,
    }
    return {
        "status": "Success" if outcome.status == "ok" else "Failed",
        "message": "" if outcome.status == "ok" else (outcome.error or ""),
        "compile_result": None,
        "run_result": run_result,
        "executor_pod_name": None,
        "files": outcome.files,
    }


def unsupported_language(language: str) -> dict:
    return {"status": "SandboxError", "message": f"language {language!r} is not supported here (python only)",
            "compile_result": None, "run_result": None, "executor_pod_name": None, "files": {}}
