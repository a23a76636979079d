"""Math written with Unicode symbols, rewritten as the ASCII and LaTeX the numeric parsers read.

A model (or a gold file) may write `−5` (U+2212), `3 × 10⁴`, `√16`, `½`, `1¾`, `π/2` or `≈ 3.14` where the
parsers (`numeric`, `numeval`, math-verify) read `-5`, `3 \\times 10^{4}`, `\\sqrt{16}`, `\\frac{1}{2}`, `1\\frac{3}{4}`
(a mixed number), `\\pi/2` and `3.14`. Without this the same value scored differently per kind (math-verify knew
`−`, the calculator verifier did not) and some forms scored 0 everywhere.

Order matters: superscript digits and vulgar fractions are rewritten before NFKC, which would turn `2²` into `22`
and `½` into `1⁄2`; an en dash is left alone (`1–2` is a range, not minus one).
"""

from __future__ import annotations

import re
import unicodedata

_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_SUPERSCRIPT_RUN_RE = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺]+")
_SUBSCRIPTS = str.maketrans("₀₁₂₃₄₅₆₇₈₉₋₊", "0123456789-+")
_SUBSCRIPT_RUN_RE = re.compile("[₀₁₂₃₄₅₆₇₈₉₋₊]+")
_VULGAR_FRACTION_RE = re.compile("[¼½¾⅐⅑⅒⅓⅔⅕⅖⅗⅘⅙⅚⅛⅜⅝⅞↉]")
_ROOT_RE = re.compile(r"([√∛∜])\s*(\d+(?:\.\d+)?|\([^()]*\))")
_ROOT_DEGREE = {"√": "", "∛": "[3]", "∜": "[4]"}
_SYMBOLS = {
    "−": "-", "∓": "\\mp ", "±": "\\pm ", "×": "\\times ", "⋅": "\\cdot ", "·": "\\cdot ", "÷": "\\div ",
    "π": "\\pi ", "∞": "\\infty ", "≤": "\\le ", "≥": "\\ge ", "≠": "\\ne ", "√": "\\sqrt ",
}  # fmt: skip
_SYMBOL_RE = re.compile("|".join(map(re.escape, _SYMBOLS)))
_APPROXIMATELY_RE = re.compile(r"^\s*[≈≃~]\s*|(?<=\S)\s*[≈≃]\s*")


def _fraction(match: re.Match[str]) -> str:
    top, _, bottom = unicodedata.normalize("NFKC", match.group()).partition("⁄")
    return f"\\frac{{{top}}}{{{bottom}}}"


def _root(match: re.Match[str]) -> str:
    radicand = match.group(2)
    radicand = radicand[1:-1] if radicand.startswith("(") else radicand
    return f"\\sqrt{_ROOT_DEGREE[match.group(1)]}{{{radicand}}}"


def ascii_math(text: str) -> str:
    """`text` with Unicode math notation rewritten as ASCII/LaTeX (see the module); ASCII text is returned as is."""
    if text.isascii():
        return text
    text = _SUPERSCRIPT_RUN_RE.sub(lambda m: "^{" + m.group().translate(_SUPERSCRIPTS) + "}", text)
    text = _SUBSCRIPT_RUN_RE.sub(lambda m: "_{" + m.group().translate(_SUBSCRIPTS) + "}", text)
    text = _VULGAR_FRACTION_RE.sub(_fraction, text)
    text = unicodedata.normalize("NFKC", text)
    text = _APPROXIMATELY_RE.sub(lambda m: "" if m.start() == 0 else " = ", text)
    text = _ROOT_RE.sub(_root, text)
    return _SYMBOL_RE.sub(lambda m: _SYMBOLS[m.group()], text).strip()
