"""Progress of the long stages: a bar with ETA on a terminal, plain lines when stderr is a pipe or a file."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from tests.evaluation.conftest import make_cfg
from tests.evaluation.test_evaluate import calculator, scripted_run
from tests.helpers.tiny import tiny_tokenizer


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_evaluation_bar_on_a_terminal_lines_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      terminal: bool) -> None:
    stderr = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    scripted_run(tiny_tokenizer(), make_cfg(tmp_path, samples=2, chunk_problems=1), [calculator()])
    bars = [line for line in stderr.getvalue().replace("\r", "\n").splitlines() if line.startswith("evaluate")]
    if not terminal:  # no bar redraws in a log: whole lines, the last one at the end
        assert "\r" not in stderr.getvalue() and bars and bars[-1].startswith("evaluate 8/8 samples | ")
        assert bars[-1].endswith("| ETA 0 min")
        return
    assert bars and "8/8" in bars[-1] and "sample" in bars[-1]
    assert "<" in bars[-1], f"no ETA in {bars[-1]!r}"  # tqdm's [elapsed<remaining]
