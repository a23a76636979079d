"""Paired comparison of two evaluations on the same problems: which answers flipped, and could noise explain it.

Two models scored on the same held-out problems differ by the problems one solves and the other does not. The
accuracy gap is (to right - to wrong) / n; the exact two-sided sign test over the flipped problems gives the
probability of a split at least that uneven if each flip were a fair coin (McNemar's exact test), which says
more than the gap alone when the set is small. Pure functions of per-sample records (greedy: one sample each).

Run as a command, it shows the flipped problems side by side (the SFT baseline's evaluation against the policy's,
the folders params.yaml's `evaluate` section names, unless given): wrong -> right first, then right -> wrong, each
with its question, gold answer and both models' answers, shortened responses and tool calls, and last the counts
and the sign test, the same line as the evaluation table's:

    python -m pipeline.evaluation.flips [--before DIR] [--after DIR] [--limit N] [--show fixed|broken|both]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.config import DEFAULT_PARAMS, ConfigError, load_config
from pipeline.config.evaluate import EvaluateConfig
from pipeline.evaluation.summary import is_correct

Key = tuple[str, str]  # (benchmark, problem id)
Show = Literal["fixed", "broken", "both"]
RESPONSE_CHARS = 240  # a shortened response keeps its start and its end (where the answer is)
TOOL_CHARS = 80


def parser() -> argparse.ArgumentParser:
    """The command line, built before the records' reader is imported (it imports torch: seconds), so
    `--help` answers at once."""
    built = argparse.ArgumentParser(
        prog="python -m pipeline.evaluation.flips",
        description="The problems that flipped between two evaluations, side by side: wrong -> right first, then "
                    "right -> wrong, and the sign test over the flips (the evaluation table's last line).")
    built.add_argument("--before", default=None,
                       help="the earlier evaluation's folder (default: the SFT baseline's, evaluate.baselines.sft)")
    built.add_argument("--after", default=None,
                       help="the later evaluation's folder (default: the policy's, evaluate.output_dir)")
    built.add_argument("--limit", type=int, default=0, help="show at most N problems of each direction (0 = all)")
    built.add_argument("--show", choices=("fixed", "broken", "both"), default="both",
                       help="fixed: wrong -> right; broken: right -> wrong; both (default)")
    built.add_argument("--params", default=str(DEFAULT_PARAMS), help="params file for the default folders")
    return built


if __name__ == "__main__":
    parser().parse_args()

from pipeline.evaluation.results import RUN_FILE, load_run  # noqa: E402  (after the command line: see `parser`)


@dataclass(frozen=True)
class Flips:
    before: str  # labels of the two evaluations
    after: str
    problems: int  # problems both evaluated
    to_right: int  # wrong before, right after
    to_wrong: int  # right before, wrong after
    sign_test_p: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sign_test_p(up: int, down: int) -> float:
    """Two-sided exact sign test of `up` against `down` (1.0 when nothing flipped)."""
    n = up + down
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(up, down) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def first_samples(records: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Each problem's first sample, in the records' order: what a problem's right or wrong is judged on."""
    return {(r["benchmark"], r["id"]): r for r in records if r.get("sample", 0) == 0}


def paired_flips(before: list[dict[str, Any]], after: list[dict[str, Any]], labels: tuple[str, str]) -> Flips:
    """Flips between two evaluations' records, over the (benchmark, problem) pairs both scored; a problem counts
    as right when its first sample is correct."""
    a = {k: is_correct(r) for k, r in first_samples(before).items()}
    b = {k: is_correct(r) for k, r in first_samples(after).items()}
    shared = a.keys() & b.keys()
    up = sum(b[k] and not a[k] for k in shared)
    down = sum(a[k] and not b[k] for k in shared)
    return Flips(labels[0], labels[1], len(shared), up, down, sign_test_p(up, down))


def flips_line(flips: Flips) -> str:
    """The flips in one sentence: the evaluation table's last line and the flip viewer's."""
    return (f"Flips {flips.before} -> {flips.after} on the {flips.problems} problems both evaluated: "
            f"{flips.to_right} wrong -> right, {flips.to_wrong} right -> wrong (two-sided sign test p = "
            f"{flips.sign_test_p:.3g}).")


@dataclass(frozen=True)
class Flipped:
    """One problem that changed side: both evaluations' first samples of it."""

    before: dict[str, Any]
    after: dict[str, Any]

    @property
    def fixed(self) -> bool:
        return is_correct(self.after)


def flipped(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> tuple[list[Flipped], list[Flipped]]:
    """(wrong -> right, right -> wrong): the problems both scored whose first sample changed side, in the later
    evaluation's order (benchmark, then problem); the same problems `paired_flips` counts."""
    a, b = first_samples(before), first_samples(after)
    changed = [Flipped(a[k], r) for k, r in b.items() if k in a and is_correct(a[k]) != is_correct(r)]
    return [f for f in changed if f.fixed], [f for f in changed if not f.fixed]


def shorten(text: str, limit: int) -> str:
    """`text` on one line, at most about `limit` characters: its start and its end, the middle elided."""
    flat = " ".join(str(text).split())
    if len(flat) <= limit:
        return flat
    half = (limit - 5) // 2
    return f"{flat[:half]} ... {flat[-half:]}"


def tool_line(call: dict[str, Any]) -> str:
    status = call.get("status") or ("ok" if call.get("ok") else "failed")
    return (f"{call.get('tool', '?')}({shorten(call.get('input', ''), TOOL_CHARS)}) -> "
            f"{shorten(call.get('output', ''), TOOL_CHARS)!r} [{status}]")


def side(label: str, record: dict[str, Any]) -> list[str]:
    """One model's view of a problem: its answer (right or wrong), its tool calls, its shortened response."""
    verdict = "right" if is_correct(record) else "wrong"
    answer = "no answer in the protocol's format" if record.get("predicted") is None else repr(record["predicted"])
    calls = record.get("tool_calls", [])
    lines = [f"  {label}: {verdict}, answered {answer}, {len(calls)} tool call{'s' * (len(calls) != 1)}"]
    lines += [f"    {i}. {tool_line(c)}" for i, c in enumerate(calls, 1)]
    lines.append(f"    response: {shorten(record.get('response', ''), RESPONSE_CHARS)}")
    return lines


def problem_block(flip: Flipped, labels: tuple[str, str]) -> list[str]:
    r = flip.after
    gold = " | ".join(str(g) for g in r.get("gold", ())) or "-"
    return [f"[{r['benchmark']}/{r['id']}] {shorten(r.get('question', ''), 2 * RESPONSE_CHARS)}", f"  gold: {gold}",
            *side(labels[0], flip.before), *side(labels[1], flip.after), ""]


def render(before: list[dict[str, Any]], after: list[dict[str, Any]], labels: tuple[str, str], *,
           show: Show = "both", limit: int = 0) -> str:
    """The flip viewer's text: the chosen flips (at most `limit` of each direction; 0 = all), then the counts."""
    fixed, broken = flipped(before, after)
    sections = [("fixed", "wrong -> right", fixed), ("broken", "right -> wrong", broken)]
    lines: list[str] = []
    for name, title, flips in sections:
        if show not in (name, "both"):
            continue
        shown = flips[:limit] if limit > 0 else flips
        more = f", the first {len(shown)} shown" if len(shown) < len(flips) else ""
        lines += [f"== {title}: {len(flips)} problem{'s' * (len(flips) != 1)}{more} ==", ""]
        for flip in shown:
            lines += problem_block(flip, labels)
    return "\n".join([*lines, flips_line(paired_flips(before, after, labels))])


def how_to_produce(folder: Path, ec: EvaluateConfig | None) -> str:
    """The command that writes an evaluation into `folder`: its DVC stage when params.yaml names the folder."""
    if ec is not None:
        if folder == Path(ec.output_dir):
            return "`dvc repro evaluate`"
        for name, baseline in ec.baselines.items():
            if folder == Path(baseline.output_dir):
                return f"`dvc repro evaluate-{name}`"
    return "`python -m flows.evaluate --model MODEL --out DIR`"


def missing_message(role: str, folder: Path, ec: EvaluateConfig | None) -> str | None:
    missing = [n for n in (RUN_FILE, "eval.json", "eval_samples.jsonl") if not (folder / n).is_file()]
    if not missing:
        return None
    what = "does not exist" if not folder.is_dir() else f"holds no evaluation (no {', '.join(missing)})"
    return f"flips: --{role} {folder} {what}; produce it with {how_to_produce(folder, ec)}"


def folders(args: argparse.Namespace) -> tuple[Path, Path, EvaluateConfig | None]:
    """The two folders: as given, else params.yaml's SFT baseline's and policy's (ConfigError when unreadable)."""
    if args.before and args.after:
        return Path(args.before), Path(args.after), None
    ec = load_config(Path(args.params)).evaluate
    if not args.before and "sft" not in ec.baselines:
        raise ConfigError(f"{args.params}: evaluate.baselines has no 'sft' to compare with; pass --before DIR")
    before = Path(args.before or ec.baselines["sft"].output_dir)
    return before, Path(args.after or ec.output_dir), ec


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        before, after, ec = folders(args)
    except ConfigError as err:
        print(f"flips: {err}", file=sys.stderr)
        return 1
    for role, folder in (("before", before), ("after", after)):
        if (message := missing_message(role, folder, ec)) is not None:
            print(message, file=sys.stderr)
            return 1
    a, b = load_run(before), load_run(after)
    print(render(a.records, b.records, (a.label, b.label), show=args.show, limit=args.limit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
