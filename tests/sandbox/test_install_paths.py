"""The jail shows the Python installation under every spelling the interpreter uses: a virtualenv (or a home
directory) reached through a symlink keeps the link in `sys.path`, and a module first imported by a snippet must
load there as it does outside the sandbox. Shown only at its resolved path, every such import failed, so a
policy's correct code earned an error (found running the suite from a checkout whose `.venv` was a link)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.services.processes import ServiceProcess, free_port
from tests.sandbox.support import UID_BASE, Sandbox

# Modules of the allowed packages that no worker imports before a request.
FIRST_IMPORTS = {
    "numpy.ctypeslib": ("import numpy.ctypeslib; print('ok')", "ok\n"),
    "scipy.special": ("import scipy.special; print(int(scipy.special.comb(5, 2)))", "10\n"),
    "sympy.physics.units": ("import sympy.physics.units as u; print(u.meter.name)", "meter\n"),
}


@pytest.fixture(scope="module")
def linked_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    root = tmp_path_factory.mktemp("linked-install")
    link = root / "venv-link"
    link.symlink_to(Path(sys.prefix), target_is_directory=True)  # the environment, reached through a link
    python = link / "bin" / Path(sys.executable).name
    port = free_port()
    service = ServiceProcess("linked-sandbox", [str(python), "-m", "sandbox.code", "--host", "127.0.0.1", "--port",
                                                str(port), "--workers", "1", "--uid-base", str(UID_BASE + 96)],
                             port, root / "linked-sandbox.log")
    with service:
        yield Sandbox(service, "")


def test_the_server_runs_from_the_linked_spelling(linked_sandbox: Sandbox) -> None:
    out = linked_sandbox.run("import numpy; print(numpy.__file__)")
    assert out["status"] == "ok" and "/venv-link/" in out["stdout"], out


@pytest.mark.parametrize("module", list(FIRST_IMPORTS))
def test_a_first_import_loads_inside_the_jail(linked_sandbox: Sandbox, module: str) -> None:
    code, expected = FIRST_IMPORTS[module]
    out = linked_sandbox.run(code)
    assert out["status"] == "ok" and out["stdout"] == expected, out
