"""The numbers of a text in its language's words, each read as what it is: a phone
number, a clock time, a date, an amount of money, a percentage, a year, an ordinal,
a decimal or a count, as the language's speakers say it.

Called in producer processes by producer/text/normalize.py (:class:`NumberReader`, one
per language, made once), after NFKC and the script fixes and before lower-casing
(German capitals say which words are nouns). The words of one number come from
producer/text/number_words.py, each language's table from producer/text/number_rules.py.
Order matters: a date or a price is read whole before its parts could be read as
plain numbers. docs/languages.md has the table of what each language reads.

Some context only one language's grammar gives (:func:`grammar_rules`, applied
first). They are conservative: a number they do not recognise is left to the
generic rules (a cardinal), which is never worse than before them.

- German: a 4-digit number is a year ("neunzehnhundertachtundneunzig", not
  "eintausendneunhundert...") after "Jahr" and its forms, "anno" or a month name;
  after a preposition of time ("seit", "bis", "um", ...) unless a capitalised noun
  follows ("seit 1500 Jahren" is a count); and, from 1100 to 1999, at the start of
  a sentence before a lower-case word (a verb: "1998 gewann er"; a noun would be
  capitalised). "3." is an ordinal before a month name or after an article or a
  contracted preposition ("der 3. Platz", "am 3."); it ends in -e after der, die,
  das as a subject ("der dritte Platz") and in -en elsewhere ("am dritten Oktober",
  "in der dritten Woche"). A date without its year ("am 3.10.") only after one.
- Russian: a year before a form of "год" is an ordinal in that form's case ("в
  1998 году": "девяносто восьмом"); "г." after it reads "году" after "в", "года"
  elsewhere. A date reads its day and year in the genitive and adds "года"
  ("двадцать третьего ноября две тысячи двадцать шестого года"); "90-х" is
  "девяностых", "3-х" "трёх".
- Persian: dates year first (۱۴۰۲/۰۵/۱۲) or day first, in the solar calendar's
  months for years 1300-1499, in the Gregorian months' Persian names from 1800 on.

Every regex here is linear (no nested quantifiers; a number starts only where its
digit run starts, so a pattern that fails at the end of a long run is not retried
from each of its digits; the words before an ordinal are matched from a word
boundary); the caller bounds the raw length (producer/text/encoder.py MAX_RAW_FACTOR x
text.max_text_len).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from ringfeed.producer.text import number_words as say
from ringfeed.producer.text.number_rules import (
    CURRENCY_CODES,
    CURRENCY_SYMBOLS,
    GREGORIAN_MONTHS_FA,
    SOLAR_MONTHS,
    Rules,
)

# Day.month.year or day/month/year: the day and month as the language reads them in a
# date, the year as a year.
_DATE = r"(?<![\d.])(\d{1,2})[./](\d{1,2})[./](\d{4})\b"
# A clock time (10:30, 9:05): the hour and the minutes, not "ten:thirty".
TIME_RE = re.compile(r"(?<![\d:])([01]?\d|2[0-3]):([0-5]\d)(?![\d:])")
# A phone-like number (555-0199, 020-7946-0958): digit by digit, group by group, not
# "five hundred and fifty five-zero one nine nine". A year range (1999-2001) is not one.
PHONE_RE = re.compile(r"(?<![\d-])\d{3}(?:-\d{3,4}){1,2}(?![\d-])")
_ORDINAL_SEPARATOR = {"ru": "-", "es": r"\.?", "it": r"\.?", "pt": r"\.?"}


def number_pattern(rules: Rules) -> str:
    """A number with the language's group and decimal separators ("1.234,5"). It
    starts only where a digit run starts (the lookbehind): a
    pattern that must be followed by % or a currency would otherwise be tried from
    every digit of a long run, quadratic in its length."""
    g, d = re.escape(rules.group), re.escape(rules.decimal)
    grouped = rf"\d{{1,3}}(?:{g}\d{{3}})+(?:{d}\d+)?|" if rules.group else ""
    return rf"(?<!\d)(?:{grouped}\d+(?:{d}\d+)?)"


def _alternation(words: Iterable[str]) -> str:
    """A regex alternation of words, longest first (so "euros" wins over "euro")."""
    return "|".join(map(re.escape, sorted(words, key=len, reverse=True)))


class NumberReader:
    """One language's numbers in words (module docstring); call it on a text."""

    def __init__(self, rules: Rules) -> None:
        self.rules = r = rules
        num = number_pattern(r)
        symbols = re.escape("".join(CURRENCY_SYMBOLS))
        self.names = {**CURRENCY_CODES, **r.names}
        names = _alternation(self.names)
        self.money = re.compile(
            rf"([{symbols}])\s?({num})|({num})\s?(?:([{symbols}])|"
            rf"(?i:({names}))(?!\w))"
        )
        self.percent = re.compile(rf"({num})\s?%")
        self.date = re.compile(_DATE)
        months = _alternation(r.months)
        # A day before a month name ("1 mai", "5 мая", Italian "1° maggio").
        self.day = re.compile(rf"(?<![\d.])(\d{{1,2}})°?\s+(?=(?i:{months})\b)") if months else None
        suffixes = _alternation(r.ordinals)
        sep = _ORDINAL_SEPARATOR.get(r.code, "")
        self.ordinal = re.compile(rf"(?<!\d)(\d+){sep}({suffixes})(?!\w)") if r.ordinals else None
        self.number = re.compile(num)
        self.grammar = grammar_rules(r)

    def __call__(self, text: str) -> str:
        r = self.rules
        if not r.code:
            return text
        text = PHONE_RE.sub(self._phone, text)
        text = TIME_RE.sub(self._time, text)
        for pattern, read in self.grammar:
            text = pattern.sub(read, text)
        text = self.date.sub(self._date, text)
        text = self.money.sub(self._money, text)
        text = self.percent.sub(self._percent, text)
        if self.day is not None:
            text = self.day.sub(lambda m: f" {self.day_words(int(m[1]))} ", text)
        if self.ordinal is not None:
            text = self.ordinal.sub(self._ordinal, text)
        return self.number.sub(lambda m: f" {self.read_number(m[0])} ", text)

    def split(self, number: str) -> tuple[str, str]:
        """(whole digits, fraction digits) of a number as written in the language."""
        r = self.rules
        whole, _, frac = (number.replace(r.group, "") if r.group else number).partition(r.decimal)
        return whole, frac

    def read_number(self, number: str) -> str:
        """A count or a decimal in words ("12,50": "zwölf komma fünf null")."""
        whole, frac = self.split(number)
        return say.decimal(whole, frac, self.rules) if frac else say.integer(whole, self.rules)

    def day_words(self, day: int) -> str:
        """A date's day as the language reads it (Rules.day)."""
        r = self.rules
        if r.day == "cardinal" or (r.day == "first" and day != 1):
            return say.words(day, r)
        return say.ordinal(day, "m" if r.day in ("ordinal", "first") else r.day, r)

    def _phone(self, m: re.Match[str]) -> str:
        return " " + ", ".join(say.digits(group, self.rules) for group in m[0].split("-")) + " "

    def _time(self, m: re.Match[str]) -> str:
        hour, minutes = say.words(int(m[1]), self.rules), int(m[2])
        return f" {hour} {say.words(minutes, self.rules) if minutes else ''} "

    def _date(self, m: re.Match[str]) -> str:
        r, day, month = self.rules, int(m[1]), int(m[2])
        if not (1 <= day <= 31 and 1 <= month <= 12):
            return m[0]  # not a date: the number rules read it
        name = r.months[month - 1] if r.months else say.ordinal(month, "m", r)
        out = r.date.format(d=self.day_words(day), m=name, y=say.year(int(m[3]), r, "g"))
        return f" {out} "

    def _money(self, m: re.Match[str]) -> str:
        symbol, amount = (m[1], m[2]) if m[1] else (m[4] or m[5], m[3])
        code = CURRENCY_SYMBOLS.get(symbol) or self.names[symbol.lower()]
        whole, frac = self.split(amount)
        return f" {say.money(whole, frac, code, self.rules, symbol)} "

    def _percent(self, m: re.Match[str]) -> str:
        r, (whole, frac) = self.rules, self.split(m[1])
        forms = tuple(r.percent.split("/"))  # ru: процент/процента/процентов
        if frac or len(whole) > say.MAX_NUMBER_DIGITS:  # a decimal takes the plural (ru:
            # the genitive singular, "двенадцать целых пять десятых процента")
            return f" {self.read_number(m[1])} {forms[min(1, len(forms) - 1)]} "
        return f" {say.count(int(whole), forms, r)} "

    def _ordinal(self, m: re.Match[str]) -> str:
        return f" {say.ordinal(int(m[1]), self.rules.ordinals[m[2]], self.rules)} "


Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]

# A 4-digit year, not part of a longer number (12345, 1998,5 or 1998.000).
_YEAR = r"(?<![\d.,])(\d{4})\b(?![.,]?\d)"

_DE_YEAR_WORDS = "jahr|jahre|jahres|jahrs|anno"
_DE_TIME_PREPOSITIONS = (
    "seit|bis|von|vom|ab|um|vor|nach|in|anfang|ende|mitte|frühjahr|frühling|sommer|herbst|winter"
)
# Before these a German "3." is an ordinal ("am 3.", "der 3. Platz").
_DE_ARTICLES = "der|die|das|den|dem|des|am|im|vom|zum|zur|beim|ins|ans|jeden|jedem|jeder"
# "der" after one of these is dative (in der dritten Woche): the ordinal ends in -en.
_DE_PREPOSITIONS = frozenset(
    "in an auf bei mit nach von zu aus seit vor hinter über unter "
    "neben zwischen während wegen".split()
)


def grammar_rules(rules: Rules) -> list[Rule]:
    """The grammar rules of a language (module docstring), in the order they apply:
    (pattern, reader) pairs; none for most languages."""
    if rules.code == "de":
        return _german(rules)
    if rules.code == "ru":
        return _russian(rules)
    if rules.code == "fa":
        return _persian(rules)
    return []


def _months(rules: Rules) -> str:
    return "|".join(map(re.escape, rules.months))


def _german(rules: Rules) -> list[Rule]:
    months = _months(rules)

    def year(m: re.Match[str]) -> str:
        return f"{m[1]}{say.year(int(m[2]), rules)}"

    def ordinal(m: re.Match[str]) -> str:
        """Groups: 1 the words before it (or None), 2 the last of them, 3 n."""
        return f"{m[1] or ''}{_german_ordinal(int(m[3]), m[1] or '', rules)} "

    def date(m: re.Match[str]) -> str:
        """Groups: 1 and 2 as in ordinal, 3 day, 4 month, 5 year (or None)."""
        day, month = int(m[3]), int(m[4])
        if not (1 <= day <= 31 and 1 <= month <= 12):
            return m[0]
        day_words = _german_ordinal(day, m[1] or "", rules)
        year = f"{say.year(int(m[5]), rules)} " if m[5] else ""
        return f"{m[1] or ''}{day_words} {rules.months[month - 1]} {year}"

    # One or two words before an ordinal: its ending depends on them (_german_ordinal).
    before = r"((?:\b\w+\s+)?\b(\w+)\s+)?"
    article = rf"((?:\b\w+\s+)?\b(?i:({_DE_ARTICLES}|bis|ab|seit))\s+)"
    day_month = r"(?<![\d.])(\d{1,2})\.(\d{1,2})\."
    return [
        (re.compile(rf"{before}{day_month}(\d{{4}})\b"), date),
        # Without its year only after an article ("am 3.10."): "Abschnitt 2.3." is no date.
        (re.compile(rf"{article}{day_month}()(?!\d)"), date),
        (re.compile(rf"(?i:(\b(?:{_DE_YEAR_WORDS}|{months})\.?\s+)){_YEAR}"), year),
        (re.compile(rf"(?i:(\b(?:{_DE_TIME_PREPOSITIONS})\s+)){_YEAR}(?!\s*[A-ZÄÖÜ])"), year),
        (re.compile(r"((?:^|(?<=[.!?]\s))\s*)(1[1-9]\d\d)\b(?=\s+[a-zäöüß])"), year),
        (re.compile(rf"{before}(?<![\d.])(\d{{1,2}})\.\s*(?=(?i:{months})\b)"), ordinal),
        (re.compile(rf"{article}(\d{{1,3}})\.(?=\s+\w)"), ordinal),
    ]


def _german_ordinal(n: int, before: str, rules: Rules) -> str:
    """n as a German ordinal, its ending from the words before it (module docstring)."""
    words = before.lower().split()
    nominative = words[-1:] and words[-1] in ("der", "die", "das")
    if nominative and not (words[-1] == "der" and words[0] in _DE_PREPOSITIONS):
        return say.ordinal(n, "m", rules)
    return say.ordinal(n, "m", rules) + "n"


# The case of a Russian ordinal year before each form of "год".
_RU_YEAR_CASES = {"год": "n", "года": "g", "году": "p", "годом": "i", "годе": "p"}


def _russian(rules: Rules) -> list[Rule]:
    months = _months(rules)

    def date(m: re.Match[str]) -> str:
        day, month = int(m[1]), int(m[2])
        if not (1 <= day <= 31 and 1 <= month <= 12):
            return m[0]
        return (
            f" {say.ordinal(day, 'g', rules)} {rules.months[month - 1]} "
            f"{say.year(int(m[3]), rules, 'g')} года "
        )

    def year_word(m: re.Match[str]) -> str:
        """Groups: 1 "в " or None, 2 the year, 3 a form of год or "г."."""
        word = m[3].lower()
        if word == "г.":
            word = "году" if m[1] else "года"
        return f"{m[1] or ''}{say.year(int(m[2]), rules, _RU_YEAR_CASES[word])} {word}"

    def plural(m: re.Match[str]) -> str:
        n = int(m[1])
        if n >= 10 and n % 10 == 0:  # a decade: "в 90-х" is "в девяностых"
            return f" {say.ordinal(n, 'p plural', rules)} "
        return f" {say.words(n, rules, case='g')} "  # "3-х" is "трёх"

    forms = "|".join(_RU_YEAR_CASES)
    return [
        (re.compile(rf"{_DATE}(?:\s*(?:г\.|года)(?!\w))?"), date),
        (re.compile(rf"(\b(?i:в|во)\s+)?{_YEAR}\s*((?i:{forms})(?!\w)|г\.)"), year_word),
        (
            re.compile(rf"(?i:(\b(?:{months})\s+)){_YEAR}"),
            lambda m: f"{m[1]}{say.year(int(m[2]), rules, 'g')}",
        ),
        (re.compile(r"(?<![\d.,])(\d{1,15})-х(?!\w)"), plural),
    ]


def _persian(rules: Rules) -> list[Rule]:
    """Dates year first (۱۴۰۲/۰۵/۱۲) or day first (12/05/2023), in the solar calendar's
    months for years 1300-1499, in the Gregorian months' Persian names from 1800 on:
    "دوازدهم مرداد هزار و چهارصد و دو"."""

    def read(year: int, month: int, day: int, written: str) -> str:
        if not (1 <= day <= 31 and 1 <= month <= 12 and (1300 <= year < 1500 or year >= 1800)):
            return written  # not a date, or a year of neither calendar's range
        calendar = SOLAR_MONTHS if year < 1500 else GREGORIAN_MONTHS_FA
        return f" {say.ordinal(day, 'm', rules)} {calendar[month - 1]} {say.year(year, rules)} "

    return [
        (
            re.compile(r"(?<![\d/])(\d{4})/(\d{1,2})/(\d{1,2})(?![\d/])"),
            lambda m: read(int(m[1]), int(m[2]), int(m[3]), m[0]),
        ),
        (re.compile(_DATE), lambda m: read(int(m[3]), int(m[2]), int(m[1]), m[0])),
    ]
