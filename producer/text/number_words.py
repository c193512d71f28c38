"""One number in a language's words: cardinal, ordinal, year, decimal, amount of money.

Called in producer processes by producer/text/numbers.py, which finds the numbers in a
text and says what each one is. Every num2words call is guarded: its converters
raise errors of any type (producer/text/number_rules.py NUM2WORDS_CHECKED), and a
number it fails on keeps its digits, never costs the text. num2words' hyphens
("trente-quatre") become spaces: the alphabet's "-" is a prosody mark.
"""

from __future__ import annotations

import functools
from decimal import Decimal

from ringfeed.producer.text.number_rules import Rules

# Longer digit runs are read digit by digit (num2words overflows past ~10**27).
MAX_NUMBER_DIGITS = 15
# A fraction read as one number ("douze virgule cinquante") has at most this many
# digits; a longer one is read digit by digit, as speakers read 3,14159.
MAX_FRACTION_NUMBER = 3
# Persian fractions: tenths, hundredths, ... ("سه و چهارده صدم" for 3.14).
_PERSIAN_PARTS = ("دهم", "صدم", "هزارم", "ده هزارم", "صد هزارم", "میلیونیم")
# What "one" becomes before a noun ("ein Euro", "un euro", "veintiún euros"); the last
# word of the count is matched by its ending ("hunderteins" -> "hundertein").
_BEFORE_NOUN = {
    "de": {"eins": "ein"},
    "es": {"veintiuno": "veintiún", "uno": "un"},
    "it": {"uno": "un"},
}
# Feminine ordinals of the languages whose num2words has none (fr "première", it "prima").
_FEMININE_ENDINGS = {
    "fr": (("premier", "première"), ("second", "seconde")),
    "es": (("o", "a"),),
    "it": (("o", "a"),),
    "pt": (("o", "a"),),
}


def _num2words(n: int | float | Decimal, code: str, **kwargs: object) -> str | None:
    """num2words' words for n, or None when it fails (see the module docstring)."""
    from num2words import num2words  # here: ~35 ms, and a warm start's texts are cached

    try:
        return num2words(n, lang=code, **kwargs)
    except Exception:  # noqa: BLE001 - see above: the digits are kept instead
        return None


def words(n: int | float | Decimal, rules: Rules, to: str = "cardinal", **kwargs: object) -> str:
    """n in words (a cardinal when num2words has no `to` form of it; n's digits when it
    has no words at all)."""
    out = _num2words(n, rules.code, to=to, **kwargs)
    if out is None and (to != "cardinal" or kwargs):
        out = _num2words(n, rules.code)
    if out is None:
        return str(n)
    if rules.code == "ru" and out.startswith("одна тысяча"):
        out = out[5:]  # 1000-1999: "тысяча двести", as said; "одна тысяча" is for cheques
    return out.replace("-", " ")


def digits(text: str, rules: Rules) -> str:
    """A run of digits read one by one (bounded cost whatever its length)."""
    return " ".join(_digit_words(rules.code)[int(d)] for d in text)


@functools.cache
def _digit_words(code: str) -> tuple[str, ...]:
    """The words of 0..9 in a language: a long digit run costs lookups, not num2words."""
    return tuple(words(d, Rules(code)) for d in range(10))


def integer(text: str, rules: Rules, to: str = "cardinal", **kwargs: object) -> str:
    """A run of digits (no separators) in words; digit by digit past MAX_NUMBER_DIGITS."""
    if len(text) > MAX_NUMBER_DIGITS:
        return digits(text, rules)
    return words(int(text), rules, to, **kwargs)


def decimal(whole: str, frac: str, rules: Rules) -> str:
    """A number with a fractional part (whole and frac: digits) as the language says it
    (Rules.fraction)."""
    if len(whole) > MAX_NUMBER_DIGITS or len(frac) > MAX_NUMBER_DIGITS:
        return digits(whole + frac, rules)
    style = rules.fraction
    if style == "parts" and len(frac) <= len(_PERSIAN_PARTS):
        part = "نیم" if frac == "5" else f"{integer(frac, rules)} {_PERSIAN_PARTS[len(frac) - 1]}"
        return part if int(whole) == 0 else f"{integer(whole, rules)} {rules.point} {part}"
    if style == "precise":  # num2words reads what is written: 12,50 as fifty hundredths
        return words(Decimal(f"{whole}.{frac}"), rules)
    if style == "num2words" or not rules.point:
        return words(float(f"{whole}.{frac}"), rules)
    return f"{integer(whole, rules)} {rules.point} {fraction(frac, rules)}"


def fraction(frac: str, rules: Rules) -> str:
    """The digits after the decimal separator: one by one ("digits", or longer than
    MAX_FRACTION_NUMBER), or their leading zeros one by one and then one number."""
    significant = frac.lstrip("0")
    if rules.fraction == "digits" or len(frac) > MAX_FRACTION_NUMBER or not significant:
        return digits(frac, rules)
    zeros = digits(frac[: len(frac) - len(significant)], rules)
    return f"{zeros} {integer(significant, rules)}".strip()


def ordinal(n: int, form: str, rules: Rules) -> str:
    """n as an ordinal of form "m", "f", "apocope" (es: "primer", "tercer") or French
    "second"/"seconde", or for Russian a case and options ("g", "n f", "p plural":
    producer/text/number_rules.py)."""
    if rules.code == "ru":
        case, *rest = form.split()
        gender = next((g for g in rest if g in ("f", "n")), "m")
        out = _num2words(n, "ru", to="ordinal", case=case, gender=gender, plural="plural" in rest)
        return out if out is not None else words(n, rules)
    if rules.code == "fa" and words(n, rules).endswith("ی"):  # 30: "سی‌ام", not "سیم"
        return words(n, rules) + "\u200cام"
    if rules.code == "fr" and n == 2 and form in ("second", "seconde"):
        return form  # "2nd", "2nde": the second of two, as written
    out = words(n, rules, "ordinal")
    if form == "apocope" and out.endswith(("primero", "tercero")):
        return out[:-1]
    if form == "f":
        for masculine, feminine in _FEMININE_ENDINGS.get(rules.code, ()):
            out = " ".join(
                w[: -len(masculine)] + feminine if w.endswith(masculine) else w for w in out.split()
            )
    return out


def year(n: int, rules: Rules, case: str = "n") -> str:
    """n read as a year: num2words' year form (de "neunzehnhundertachtundneunzig"; in
    fr, es, it, pt, fa and ar the cardinal, which is how their speakers say years), and
    for Russian the ordinal in the case the sentence gives it ("в 1998 году": p)."""
    if rules.code == "ru":
        return ordinal(n, case, rules)
    return words(n, rules, "year")


def count(n: int, unit: tuple[str, ...], rules: Rules) -> str:
    """n with the noun it counts, in the noun's form for n (unit: its forms, singular
    first)."""
    number, noun = _count(n, unit, rules)
    return f"{number} {noun}"


def _count(n: int, unit: tuple[str, ...], rules: Rules) -> tuple[str, str]:
    """(n's words before the noun, the noun's form): a feminine Russian noun's count is
    feminine ("одна копейка"), "one" takes its form before a noun ("ein Euro")."""
    gender = {"gender": "f"} if rules.code == "ru" and unit[0].endswith(("а", "я")) else {}
    number = integer(str(n), rules, **gender)
    for ending, form in _BEFORE_NOUN.get(rules.code, {}).items():
        if number.endswith(ending):
            number = number[: -len(ending)] + form
            break
    return number, plural(n, unit, rules)


def plural(n: int, forms: tuple[str, ...], rules: Rules) -> str:
    """The form of a noun after n: singular for 1, else plural; Russian's three forms
    (1, 21: рубль; 2-4, 22: рубля; 5-20, 25: рублей)."""
    if len(forms) < 3:
        return forms[0] if n == 1 or len(forms) == 1 else forms[1]
    if n % 10 == 1 and n % 100 != 11:
        return forms[0]
    return forms[1] if 2 <= n % 10 <= 4 and not 12 <= n % 100 <= 14 else forms[2]


def units(rules: Rules, code: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(the currency's forms, its sub-unit's forms) in the language, or None."""
    spec = rules.units.get(code)
    if spec is None:
        return None
    major, minor = spec.split(" / ")
    return tuple(major.split()), tuple(minor.split())


def money(whole: str, frac: str, code: str, rules: Rules, written: str) -> str:
    """An amount of currency `code` (written as `written`: a symbol, a code, a name) as
    speakers say it (Rules.money: "zwölf euro fünfzig"); whole and frac: its digits."""
    forms = units(rules, code)
    if forms is None:  # no unit words of our own: num2words' formal reading, else as written
        out = None
        if len(whole) <= MAX_NUMBER_DIGITS and len(frac) <= MAX_NUMBER_DIGITS:
            # A Decimal, never an int: num2words reads an int as cents (5 -> "0.05 EUR").
            value = Decimal(f"{whole}.{frac or 0}")
            out = _num2words(value, rules.code, to="currency", currency=code)
        amount = decimal(whole, frac, rules) if frac else integer(whole, rules)
        return out.replace("-", " ") if out else f"{amount} {written}"
    unit, sub_unit = forms
    if len(whole) > MAX_NUMBER_DIGITS or len(frac) > 2 or (frac and not rules.money):
        amount = decimal(whole, frac, rules) if frac else integer(whole, rules)
        return f"{amount} {unit[1]}"  # a decimal takes the plural (ru: the genitive singular)
    major, cents = int(whole), int(frac.ljust(2, "0")) if frac else 0
    if not cents:
        return count(major, unit, rules)
    if not major:
        return count(cents, sub_unit, rules)
    whole_words, unit_form = _count(major, unit, rules)
    minor, sub_form = _count(cents, sub_unit, rules)
    return rules.money.format(major=whole_words, unit=unit_form, minor=minor, subunit=sub_form)
