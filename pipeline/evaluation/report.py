"""Comparison reports across evaluated models/runs: a markdown table in TAPO Table 1's layout.

Earlier runs (`evaluate.compare_dirs`, read by `results.load_run`) go beside the current one.

Table 1's layout: one row per method, columns grouped Fact-reasoning | Math | Comprehensive, pass@1 (%) per
benchmark. Departures, so that the table states the same numbers as the logs and the headline: the overall
column is the micro average, every problem pooled (`all/accuracy`: what the stage prints, the headline and MLflow
report), and the paper's "Avg." (the mean of the benchmarks, a macro average) is labelled as such beside it; a
group's own average is shown only when the group has several benchmarks (else it repeats the benchmark's). Each
row also shows its format-error rate, and a model whose every response failed the protocol's format check is
named under the table: its accuracy measures the format, not what it knows. A second table gives tool calls per
rollout (search / code), as TAPO Figure 3 and TEPO report them, and a third the tool choice (tool-use and
right-tool rates). With two or more runs, the last two are compared problem by problem (`flips.paired_flips`:
the answers that flipped and the sign test's p-value), last in the report, which the evaluate stage prints.
`eval_compare.json` holds every run's numbers per benchmark and the flips (a plain output), and `headline` the
few that `metrics/headline/eval.json` holds for DVC (`pipeline.tracking.headline`).

The tables are padded into columns, so the same text reads in a terminal and renders as markdown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pipeline.evaluation.flips import Flips, flips_line, paired_flips
from pipeline.evaluation.plots import write_plots
from pipeline.evaluation.results import RunResult
from pipeline.jsonl import write_json

TABLE_FILE = "eval_table.md"
COMPARE_FILE = "eval_compare.json"
ACCURACY_FILE = "eval_accuracy.csv"
HEADLINE = ("accuracy", "format_error_rate", "tool_use", "right_tool", "calls_per_rollout/search",
            "calls_per_rollout/code", "n_problems")
PLOTS_DIR = "eval_plots"
CATEGORY_ORDER = ("fact", "math", "comprehensive")
CATEGORY_TITLES = {"fact": "Fact-reasoning", "math": "Math", "comprehensive": "Comprehensive"}
BASELINE_PREFIX = "acc_"  # a baseline's accuracy in the headline: acc_<its name in evaluate.baselines>


def column_groups(runs: list[RunResult]) -> list[tuple[str, list[str]]]:
    """(category, benchmark names) in Table 1's group order, benchmarks in first-seen order."""
    names: dict[str, str] = {}
    for run in runs:
        for name, category in run.benchmarks.items():
            names.setdefault(name, category)
    return [(c, [n for n, cat in names.items() if cat == c]) for c in CATEGORY_ORDER
            if any(cat == c for cat in names.values())]


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present and len(present) == len(values) else None


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    """A markdown table padded into columns (the first left-aligned, the others right-aligned)."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "|" + "|".join(("-" * (w + 2)) if i == 0 else ("-" * (w + 1) + ":") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(head), rule, *(line(r) for r in rows)])


def accuracy_table(runs: list[RunResult], metric: str = "accuracy") -> str:
    groups = column_groups(runs)
    benches = [(c, n) for c, names in groups for n in names]
    averaged = [(c, names) for c, names in groups if len(groups) > 1 and len(names) > 1]
    head = ["Method"] + [f"{CATEGORY_TITLES[c]}: {n}" for c, n in benches]
    head += [f"{CATEGORY_TITLES[c]} (macro)" for c, _ in averaged]
    head += (["Macro avg."] if len(benches) > 1 else []) + ["All (micro)", "Format errors"]
    rows = []
    for run in runs:
        cells = [run.value(n, metric) for _, n in benches]
        by_group = [_mean([run.value(n, metric) for n in names]) for _, names in averaged]
        macro = [_mean(cells)] if len(benches) > 1 else []
        pooled = [run.value("all", metric), run.value("all", "format_error_rate")]
        rows.append([run.label] + [_pct(v) for v in cells + by_group + macro + pooled])
    return markdown_table(head, rows)


def tool_calls_table(runs: list[RunResult]) -> str:
    benches = [n for _, names in column_groups(runs) for n in names]
    rows = []
    for run in runs:
        cells = []
        for n in benches:
            search, code = run.value(n, "calls_per_rollout/search"), run.value(n, "calls_per_rollout/code")
            cells.append("–" if search is None else f"{search:.2f} / {code:.2f}")
        rows.append([run.label] + cells)
    return markdown_table(["Method"] + benches, rows)


def tool_choice_table(runs: list[RunResult]) -> str:
    benches = [n for _, names in column_groups(runs) for n in names] + ["all"]
    rows = [[run.label] + [f"{_pct(run.value(n, 'tool_use'))} / {_pct(run.value(n, 'right_tool'))}" for n in benches]
            for run in runs]
    return markdown_table(["Method"] + benches, rows)


def mentions_gold(record: dict) -> bool:
    """The response contains one of the gold answers as a whole word or number (case-insensitive)."""
    return any(re.search(rf"(?<!\w){re.escape(str(g).strip())}(?!\w)", record.get("response", ""), re.IGNORECASE)
               for g in record.get("gold", ()) if str(g).strip())


def format_notes(runs: list[RunResult]) -> list[str]:
    """One line for each model that never answered in the protocol's format: its accuracy is a format failure."""
    notes = []
    for run in runs:
        if run.value("all", "format_error_rate") != 1.0 or not run.records:
            continue
        gold = sum(mentions_gold(r) for r in run.records)
        notes.append(f"{run.label}: never answered in the protocol's format (format errors 100 %: no response of "
                     f"{len(run.records)} passed the format check, so none was scored); its "
                     f"{_pct(run.value('all', 'accuracy'))} % is a format failure, not a measure of what it knows "
                     f"({gold} of its {len(run.records)} responses contain a gold answer verbatim).")
    return notes


def flips_of(runs: list[RunResult]) -> Flips | None:
    """The last two runs compared problem by problem (the trained model against the one it started from)."""
    if len(runs) < 2:
        return None
    return paired_flips(runs[-2].records, runs[-1].records, (runs[-2].label, runs[-1].label))


def comparison(runs: list[RunResult]) -> dict:
    """Every run's headline numbers per benchmark and overall, and the flips of the last two."""
    benches = [n for _, names in column_groups(runs) for n in names] + ["all"]
    models = {run.label: {"model": run.model, "mode": run.mode,
                          **{b: {m: v for m in HEADLINE if (v := run.value(b, m)) is not None} for b in benches}}
              for run in runs}
    flips = flips_of(runs)
    return {"models": models, "order": [run.label for run in runs]} | ({"flips": flips.to_dict()} if flips else {})


def headline(runs: list[RunResult], baselines: Mapping[str, str]) -> dict[str, float]:
    """The evaluation headline (`metrics/headline/eval.json`, a DVC metric): the last run's (the evaluated
    model's) pooled `accuracy` and `right_tool`, `acc_<name>` for each earlier run read from a baseline's folder
    (`baselines`: name -> output folder), and the flips of the last two with their sign test's p-value."""
    current, flips = runs[-1], flips_of(runs)
    out = {k: v for k in ("accuracy", "right_tool") if (v := current.value("all", k)) is not None}
    folders = {Path(folder): name for name, folder in baselines.items()}
    for run in runs[:-1]:
        if run.source and Path(run.source) in folders and (accuracy := run.value("all", "accuracy")) is not None:
            out[BASELINE_PREFIX + folders[Path(run.source)]] = accuracy
    if flips is not None:
        out |= {"to_right": float(flips.to_right), "to_wrong": float(flips.to_wrong), "p_value": flips.sign_test_p}
    return out


def markdown_report(runs: list[RunResult]) -> str:
    flips = flips_of(runs)
    notes = format_notes(runs)
    return "\n".join([
        "# Evaluation", "",
        "Accuracy (%) per benchmark (pass@1; avg@k when samples > 1). All (micro): every problem pooled, the "
        "accuracy the logs, the headline and MLflow report; Macro avg.: the mean of the benchmarks (TAPO Table 1's "
        "Avg.); Format errors: responses that failed the protocol's format check.", "",
        accuracy_table(runs, "accuracy"), "",
        *([*notes, ""] if notes else []),
        "Mean tool calls per rollout (search / code).", "",
        tool_calls_table(runs), "",
        "Tool choice (%): tool use (rollouts calling a tool) / right tool (rollouts whose first call is the tool the "
        "problem needs).", "",
        tool_choice_table(runs), "",
        "Runs: " + "; ".join(f"{r.label} = {r.model} [{r.mode}]" for r in runs), "",
        *([flips_line(flips), ""] if flips else []),
    ])


def accuracy_csv(run: RunResult) -> str:
    """`benchmark,accuracy` rows (each benchmark, then all): what DVC's Vega plot compares across experiments."""
    rows = [f"{name},{run.value(name, 'accuracy'):.6f}" for name in [*run.benchmarks, "all"]]
    return "\n".join(["benchmark,accuracy", *rows]) + "\n"


def write_reports(out_dir: Path, current: RunResult, earlier: list[RunResult], *, plots: bool) -> list[Path]:
    """Write eval_table.md, eval_compare.json, eval_accuracy.csv (and the PNG plots) for the earlier runs and the
    current one; return the files."""
    runs = [*earlier, current]
    table = out_dir / TABLE_FILE
    table.write_text(markdown_report(runs), encoding="utf-8")
    write_json(out_dir / COMPARE_FILE, comparison(runs))
    curve = out_dir / ACCURACY_FILE
    curve.write_text(accuracy_csv(current), encoding="utf-8")
    written = [table, out_dir / COMPARE_FILE, curve]
    if plots:
        written += write_plots(out_dir / PLOTS_DIR, runs)
    return written
