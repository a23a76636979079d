"""The Calculator generator: TAPO's Calculator-6K, rebuilt from its description.

TAPO's paper describes Calculator-6K as "simple mathematical calculation problems, generated
automatically using Python scripts with predefined templates"; the script itself is not public,
only the reward rule (numeric answer, 1e-3 absolute tolerance). This module is our version:

1. Templates cover long multiplication and division, powers and roots, percentages, compound
   interest, unit conversions, dates and durations and mixed expressions.
2. Every answer is computed exactly (`Decimal`/`Fraction`/`datetime.date`), never with floats,
   then rounded half-up to the precision the question states ("Round your answer to 4 decimal
   places." or "Give the exact integer."), so the gold string is the exact value of the stated
   rounding.
3. Difficulty levels 1-3 scale operand sizes; `meta` records the template, level and precision.
4. Output depends only on `(n, seed, levels)`: one `random.Random(seed)` drives everything and
   repeated questions are skipped, so the same call gives the same problems on every machine.
5. Ids are `calculator-<sha1 of the question>[:12]`: stable under reordering or resizing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, localcontext
from fractions import Fraction

from pipeline.types import Problem, Split

SOURCE = "calculator"
LEVELS: tuple[int, ...] = (1, 2, 3)


@dataclass(frozen=True)
class Calculation:
    """One generated question with its exact value and the decimals the answer is rounded to."""

    template: str
    question: str
    value: Fraction
    decimals: int  # 0 = integer answer
    code: str  # a Python program printing the answer (the scripted teacher's tool call)


def format_exact(value: Fraction, decimals: int) -> str:
    """Round `value` half-up to `decimals` places, exactly (no float on the way)."""
    with localcontext() as ctx:
        ctx.prec = 80
        dec = Decimal(value.numerator) / Decimal(value.denominator)
        quantum = Decimal(1).scaleb(-decimals)
        rounded = dec.quantize(quantum, rounding=ROUND_HALF_UP)
    if rounded == 0:
        rounded = abs(rounded)  # never write "-0.00"
    return f"{rounded:f}"


def _precision_text(decimals: int) -> str:
    if decimals == 0:
        return "Give the exact integer."
    return f"Round your answer to {decimals} decimal place{'s' if decimals > 1 else ''}."


def _digits(rng: random.Random, n: int) -> int:
    return rng.randint(10 ** (n - 1), 10**n - 1)


def _fmt(n: int | Fraction | Decimal) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)


def long_multiplication(rng: random.Random, level: int) -> Calculation:
    a, b = _digits(rng, 2 + level), _digits(rng, 1 + level)
    if level == 3:
        x, y = Decimal(a) / 100, Decimal(b) / 10
        return Calculation("multiplication", f"Compute {x} × {y}.", Fraction(x * y), 3, f"print(round({x} * {y}, 3))")
    return Calculation("multiplication", f"What is {_fmt(a)} multiplied by {_fmt(b)}?", Fraction(a * b), 0,
                       f"print({a} * {b})")


def long_division(rng: random.Random, level: int) -> Calculation:
    a, b = _digits(rng, 3 + 2 * level), _digits(rng, 1 + level)
    return Calculation("division", f"Divide {_fmt(a)} by {_fmt(b)}.", Fraction(a, b), 4, f"print(round({a} / {b}, 4))")


def power(rng: random.Random, level: int) -> Calculation:
    base = rng.randint(2, 9 + 10 * level)
    exp = rng.randint(3, 4 + 3 * level)
    if level >= 2 and rng.random() < 0.5:
        b = Decimal(rng.randint(101, 999)) / 100
        return Calculation("power", f"What is {b} raised to the power {exp}?", Fraction(b) ** exp, 4,
                           f"print(round({b} ** {exp}, 4))")
    return Calculation("power", f"What is {base} raised to the power {exp}?", Fraction(base**exp), 0,
                       f"print({base} ** {exp})")


def root(rng: random.Random, level: int) -> Calculation:
    n = 2 if level == 1 else rng.choice((2, 3))
    x = _digits(rng, 3 + 2 * level)
    name = "square" if n == 2 else "cube"
    # The n-th root to 40 digits, exactly rounded below at 4 decimals (Decimal has exact roots).
    with localcontext() as ctx:
        ctx.prec = 60
        value = Decimal(x).sqrt() if n == 2 else _cube_root(Decimal(x))
    code = f"print(round({x} ** 0.5, 4))" if n == 2 else f"print(round({x} ** (1 / 3), 4))"
    return Calculation("root", f"What is the {name} root of {_fmt(x)}?", Fraction(value), 4, code)


def _cube_root(x: Decimal) -> Decimal:
    # Newton's method on Decimal at the context precision; converges quadratically from a float seed.
    y = Decimal(repr(float(x) ** (1 / 3)))
    for _ in range(12):
        y = (2 * y + x / (y * y)) / 3
    return y


def percentage(rng: random.Random, level: int) -> Calculation:
    pct = Decimal(rng.randint(1, 999)) / (10 if level > 1 else 1)
    whole = Decimal(_digits(rng, 2 + level)) / (100 if level == 3 else 1)
    if rng.random() < 0.5:
        return Calculation("percentage", f"What is {pct}% of {whole}?", Fraction(pct * whole) / 100, 4,
                           f"print(round({pct} * {whole} / 100, 4))")
    old, new = _digits(rng, 2 + level), _digits(rng, 2 + level)
    change = Fraction(new - old, old) * 100
    q = f"A value changes from {_fmt(old)} to {_fmt(new)}. What is the percentage change?"
    return Calculation("percentage", q, change, 2, f"print(round(({new} - {old}) / {old} * 100, 2))")


def compound_interest(rng: random.Random, level: int) -> Calculation:
    principal = rng.randint(10, 500) * 100
    rate = Fraction(rng.randint(5, 120), 10)  # percent per year
    years = rng.randint(2, 5 + 5 * level)
    periods, label = rng.choice(((1, "annually"), (4, "quarterly"), (12, "monthly")))
    value = principal * (1 + rate / 100 / periods) ** (periods * years)
    q = (f"${_fmt(principal)} is invested at {float(rate):g}% annual interest compounded {label}. "
         f"What is the balance after {years} years, in dollars?")
    code = f"print(round({principal} * (1 + {float(rate):g} / 100 / {periods}) ** ({periods} * {years}), 2))"
    return Calculation("compound_interest", q, value, 2, code)


# Exact factors by definition (international yard and pound, US liquid gallon).
_UNITS: tuple[tuple[str, str, Fraction], ...] = (
    ("miles", "kilometers", Fraction("1.609344")),
    ("inches", "centimeters", Fraction("2.54")),
    ("pounds", "kilograms", Fraction("0.45359237")),
    ("US gallons", "liters", Fraction("3.785411784")),
    ("feet", "meters", Fraction("0.3048")),
    ("ounces", "grams", Fraction("28.349523125")),
)


def unit_conversion(rng: random.Random, level: int) -> Calculation:
    if rng.random() < 0.2:
        f = Fraction(rng.randint(-400, 2000 * level), 10)
        q = f"Convert {float(f):g} degrees Fahrenheit to degrees Celsius."
        return Calculation("unit_conversion", q, (f - 32) * Fraction(5, 9), 3,
                           f"print(round(({float(f):g} - 32) * 5 / 9, 3))")
    src, dst, factor = rng.choice(_UNITS)
    amount = Fraction(_digits(rng, 1 + level), 10 if level > 1 else 1)
    if rng.random() < 0.5:
        return Calculation("unit_conversion", f"Convert {float(amount):g} {src} to {dst}.", amount * factor, 3,
                           f"print(round({float(amount):g} * {float(factor)!r}, 3))")
    return Calculation("unit_conversion", f"Convert {float(amount):g} {dst} to {src}.", amount / factor, 3,
                       f"print(round({float(amount):g} / {float(factor)!r}, 3))")


def dates_and_durations(rng: random.Random, level: int) -> Calculation:
    start = dt.date(1900, 1, 1) + dt.timedelta(days=rng.randint(0, 50_000))
    if rng.random() < 0.6:
        end = start + dt.timedelta(days=rng.randint(30, 400 * 4**level))
        q = f"How many days are there from {start:%B} {start.day}, {start.year} to {end:%B} {end.day}, {end.year}?"
        code = (f"from datetime import date\n"
                f"print((date({end.year}, {end.month}, {end.day}) - date({start.year}, {start.month}, {start.day})).days)")
        return Calculation("dates", q, Fraction((end - start).days), 0, code)
    d, h, m, s = rng.randint(1, 40 * level), rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59)
    q = f"How many seconds are there in {d} days, {h} hours, {m} minutes and {s} seconds?"
    return Calculation("durations", q, Fraction(((d * 24 + h) * 60 + m) * 60 + s), 0,
                       f"print((({d} * 24 + {h}) * 60 + {m}) * 60 + {s})")


def _expression(rng: random.Random, depth: int) -> tuple[str, Fraction]:
    if depth == 0:
        n = rng.randint(2, 999)
        return str(n), Fraction(n)
    left, lv = _expression(rng, depth - 1 if rng.random() < 0.8 else 0)
    right, rv = _expression(rng, depth - 1 if rng.random() < 0.8 else 0)
    op = rng.choice("+-*/" if rv != 0 else "+-*")
    value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv / rv if rv else lv}[op]
    return f"({left} {op} {right})", value


def mixed_expression(rng: random.Random, level: int) -> Calculation:
    text, value = _expression(rng, level + 1)
    decimals = 0 if value.denominator == 1 else 4
    code = f"print(round({text[1:-1]}))" if decimals == 0 else f"print(round({text[1:-1]}, 4))"
    return Calculation("expression", f"Evaluate {text[1:-1]}.", value, decimals, code)


TEMPLATES: tuple[Callable[[random.Random, int], Calculation], ...] = (
    long_multiplication, long_division, power, root, percentage,
    compound_interest, unit_conversion, dates_and_durations, mixed_expression,
)


def _to_problem(calc: Calculation, level: int, split: Split) -> Problem:
    question = f"{calc.question} {_precision_text(calc.decimals)}"
    digest = hashlib.sha1(question.encode("utf-8")).hexdigest()[:12]
    return Problem(
        id=f"{SOURCE}-{digest}",
        question=question,
        answers=(format_exact(calc.value, calc.decimals),),
        type="calculator",
        source=SOURCE,
        split=split,
        meta={"template": calc.template, "level": level, "decimals": calc.decimals, "code": calc.code},
    )


def generate(n: int, seed: int = 0, split: Split = "train", levels: Sequence[int] = LEVELS,
             exclude: frozenset[str] = frozenset()) -> list[Problem]:
    """`n` distinct calculator problems, deterministic in `(n, seed, levels)`.

    `exclude` holds question texts that must not be produced again (e.g. the other split's).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    bad = [lv for lv in levels if lv not in LEVELS]
    if bad or not levels:
        raise ValueError(f"levels must be a non-empty subset of {LEVELS}, got {list(levels)}")
    rng = random.Random(seed)
    seen = set(exclude)
    problems: list[Problem] = []
    attempts = 0
    while len(problems) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise RuntimeError(f"could not generate {n} distinct problems (got {len(problems)})")
        template, level = rng.choice(TEMPLATES), rng.choice(tuple(levels))
        problem = _to_problem(template(rng, level), level, split)
        if problem.question not in seen:
            seen.add(problem.question)
            problems.append(problem)
    return problems


def generate_splits(n_train: int, n_test: int, seed: int = 0,
                    levels: Sequence[int] = LEVELS) -> tuple[list[Problem], list[Problem]]:
    """Train and test problems from one stream, so no question is in both."""
    pool = generate(n_train + n_test, seed=seed, levels=levels)
    train = pool[:n_train]
    test = [Problem(p.id, p.question, p.answers, p.type, p.source, "test", p.meta) for p in pool[n_train:]]
    return train, test
