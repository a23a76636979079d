"""Float evaluation of LaTeX expressions (`2\\sqrt{3}`, `\\frac{\\pi}{6}+1`, `x^2+2x`), no sympy.

A small recursive-descent parser over numbers, + - * / ^, `\\frac`, `\\sqrt` (and
`\\sqrt[n]`), `\\pi`, `\\cdot`, `\\times`, `\\div`, parentheses, braces and implicit
multiplication (but not before `\\frac`: `1\\frac{1}{2}` may be a mixed number). Anything else (a variable, a set, a function name) makes it give up
(None), and so does an exponent large enough to be a denial of service (9^{9^{9^9}}):
those go to the symbolic checker under its time limit.

Used to decide answers quickly. Constants: values that differ clearly are not
equivalent; values equal to 1e-9 relative are taken as equivalent (math-verify's own
numeric fallback makes the same call). Expressions in variables: values that differ at
a fixed point prove non-equivalence; agreeing values prove nothing (the symbolic checker
decides).
"""

from __future__ import annotations

import math
import re

_TOKEN_RE = re.compile(r"\s*(\d+\.?\d*|\.\d+|\\[a-zA-Z]+|[-+*/^(){}\[\]]|[a-zA-Z])")
# e and i are constants in most answers (e^{i\pi}); reading them as variables could make
# equal expressions look different, so an expression that uses them is not evaluated.
_NOT_VARIABLES = frozenset("ei")
_MAX_EXPONENT = 1000.0
_MAX_TOKENS = 200


class _GiveUp(Exception):
    """The expression is outside what this evaluator handles."""


def _tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if match is None:
            if text[pos:].strip() == "":
                break
            raise _GiveUp
        tokens.append(match.group(1))
        pos = match.end()
    if len(tokens) > _MAX_TOKENS:
        raise _GiveUp
    return tokens


class _Parser:
    def __init__(self, tokens: list[str], point: int | None) -> None:
        self.tokens = tokens
        self.i = 0
        self.point = point  # which assignment of values to variables; None = no variables allowed

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _GiveUp
        self.i += 1
        return token

    def expr(self) -> float:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> float:
        value = self.factor()
        while True:
            token = self.peek()
            if token in ("*", "\\cdot", "\\times"):
                self.take()
                value *= self.factor()
            elif token in ("/", "\\div"):
                self.take()
                divisor = self.factor()
                if divisor == 0:
                    raise _GiveUp
                value /= divisor
            elif token == "\\frac":
                # `2\frac{1}{2}` is a mixed number to math-verify (5/2), a product to a literal reading: the
                # symbolic checker decides, so the two never disagree
                raise _GiveUp
            elif token is not None and (token[0].isalnum() or token in ("(", "{", "\\sqrt", "\\pi")):
                value *= self.factor()  # implicit multiplication: 2\sqrt{3}, 3\pi
            else:
                return value

    def factor(self) -> float:
        if self.peek() in ("-", "+"):
            return -self.factor() if self.take() == "-" else self.factor()
        base = self.atom()
        if self.peek() == "^":
            self.take()
            # `2^10` is read as 2^{10}: what the writer meant, though LaTeX would set 2^{1}0.
            exponent = self.group(whole_number=True)
            if abs(exponent) > _MAX_EXPONENT or (base == 0 and exponent < 0):
                raise _GiveUp
            try:
                value = math.pow(base, exponent)
            except (OverflowError, ValueError):
                raise _GiveUp from None
            return value
        return base

    def group(self, whole_number: bool = False) -> float:
        """A braced expression, or a single digit (LaTeX reads `\\frac12` as `\\frac{1}{2}`)."""
        token = self.peek()
        if token == "{":
            self.take()
            value = self.expr()
            self.take("}")
            return value
        if token is not None and token[0].isdigit():
            self.take()
            if whole_number:
                return float(token)
            if len(token) > 1:  # push the remaining digits back as their own token
                self.tokens.insert(self.i, token[1:])
            return float(token[0])
        return self.atom()

    def atom(self) -> float:
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            return float(token)
        if token in ("(", "{"):
            value = self.expr()
            self.take(")" if token == "(" else "}")
            return value
        if token == "\\pi":
            return math.pi
        if len(token) == 1 and token.isalpha():
            return self.variable(token)
        if token == "\\frac":
            top, bottom = self.group(), self.group()
            if bottom == 0:
                raise _GiveUp
            return top / bottom
        if token == "\\sqrt":
            return self.root()
        raise _GiveUp

    def variable(self, name: str) -> float:
        """A fixed positive value per letter (case-folded, as math-verify does) and point."""
        if self.point is None or name.lower() in _NOT_VARIABLES:
            raise _GiveUp
        return 0.5 + ((ord(name.lower()) * 0.6180339887498949 + self.point * 0.7548776662466927) % 1.0) * 2.0

    def root(self) -> float:
        degree = 2.0
        if self.peek() == "[":
            self.take()
            degree = self.expr()
            self.take("]")
        radicand = self.group()
        if radicand < 0 or degree == 0:
            raise _GiveUp
        return radicand ** (1.0 / degree)


def evaluate(text: str, point: int | None = None) -> float | None:
    """The value of an expression, or None when it is not one this parser handles.

    With `point` None only constant expressions are evaluated; with point = 0, 1, ...
    single-letter variables (except e and i) take fixed positive values, the same for both
    sides of a comparison, so two expressions that differ there are not equivalent.
    """
    try:
        parser = _Parser(_tokenize(text), point)
        value = parser.expr()
        if parser.peek() is not None:
            return None
    except (_GiveUp, RecursionError, OverflowError, ZeroDivisionError):
        return None
    return value if math.isfinite(value) else None
