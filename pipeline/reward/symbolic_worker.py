"""Worker process of the symbolic checker: reads JSON [pred, gold] lines, writes "1"/"0" lines.

Run as a script (`python symbolic_worker.py`), not imported: it must not import the
`pipeline` package (whose records pull in torch), so a worker starts in about a second.
The parent enforces the time limit by killing this process, so math-verify's own
SIGALRM timer is switched off here.
"""

import json
import logging
import resource
import sys

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

CONFIG = [LatexExtractionConfig(), ExprExtractionConfig()]
MEMORY_LIMIT_BYTES = 2 << 30  # a pathological expression gets MemoryError ("not equivalent"), not the host's RAM


def equivalent(pred: str, gold: str) -> bool:
    gold_parsed = parse(f"${gold}$", extraction_config=CONFIG, parsing_timeout=None)
    pred_parsed = parse(f"${pred}$", extraction_config=CONFIG, parsing_timeout=None)
    return bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=None))


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    logging.disable(logging.CRITICAL)  # math-verify warns on every call without a timer
    out = sys.stdout
    # sympy imports its polynomial, set and simplification code lazily; pay for that
    # before "ready", so the first real check is not cut off by the time limit.
    equivalent("(x+1)^2", "x^2+2x+1")
    equivalent("(1,2]", "\\{1\\}")
    equivalent("\\frac{\\sqrt{2}}{2}", "\\sin(\\pi/4)")
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            pred, gold = json.loads(line)
            ok = equivalent(pred, gold)
        except Exception:  # noqa: BLE001 - a parser crash on hostile input means "not equivalent"
            ok = False
        out.write("1\n" if ok else "0\n")
        out.flush()


if __name__ == "__main__":
    main()
