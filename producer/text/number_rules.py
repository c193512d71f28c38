"""Each language's number rules: what producer/text/numbers.py needs to read its numbers
as its speakers say them.

Called through producer/text/normalize.py in producer processes. LANGUAGES is the
allowlist of languages whose rules were written and checked here (docs/languages.md
has the table of what each reads); NUM2WORDS_CHECKED the languages whose num2words
converter was checked but that have no rules of their own (plain cardinals, digits
after the decimal separator as num2words reads them). Any other language keeps its
digits. Adding a language: a Rules line below, its examples in tests/unit/test_numbers.py,
its row in docs/languages.md, and a NORMALIZER_VERSION bump.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ringfeed.shared.language.codes import language_code

# º and ª (Spanish, Italian, Portuguese ordinals) become o and a under NFKC: marked first
# with private-use characters that NFKC keeps (producer/text/normalize.py).
MASCULINE_MARK, FEMININE_MARK = "\ue000", "\ue001"


@dataclass(frozen=True)
class Rules:
    """One language's number rules.

    code: the num2words language ("" = keep digits). decimal, group: the separators.
    point: the word said for the decimal separator, and fraction how the digits after
    it are read: "digits" one by one (de: "zwölf komma fünf null"), "number" as one
    number after its leading zeros (fr: "douze virgule cinquante"), "num2words" as its
    converter reads a decimal (a float: what the checked languages get), "precise" as
    num2words reads the written digits (ru: "двенадцать целых пятьдесят сотых"), "parts"
    as a count of tenths, hundredths, ... (fa). percent: the word after a percentage
    (ru: its three plural forms, "/" between them). units: ISO currency -> "singular
    plural / sub-unit singular plural" (ru: three forms each); money: how an amount
    with cents is said.
    names: currency words written after an amount (lower case) -> ISO code. ordinals:
    the suffix after the digits -> the ordinal's form (m, f, or a num2words case).
    months: the month names (genitive for ru); day: how a date's day is read
    ("cardinal", "ordinal", or "first": the 1st as an ordinal, the others as cardinals);
    date: the order of a date's words.
    """

    code: str
    decimal: str = "."
    group: str = ","
    point: str = ""
    fraction: str = "num2words"
    percent: str = "percent"
    units: dict[str, str] = field(default_factory=dict)
    money: str = "{major} {unit} {minor}"
    names: dict[str, str] = field(default_factory=dict)
    ordinals: dict[str, str] = field(default_factory=dict)
    fixes: dict[int, str | None] | None = None
    months: tuple[str, ...] = ()
    day: str = "cardinal"
    date: str = "{d} {m} {y}"


# Persian: Arabic yeh, alef maksura and kaf to the Persian letters; tatweel dropped.
PERSIAN_LETTERS = str.maketrans(
    {"\u064a": "\u06cc", "\u0649": "\u06cc", "\u0643": "\u06a9", "\u0640": None}
)
CURRENCY_SYMBOLS = {"€": "EUR", "$": "USD", "£": "GBP", "₽": "RUB"}
# Codes read as currency after an amount in every language ("12,50 EUR").
CURRENCY_CODES = {"eur": "EUR", "usd": "USD", "gbp": "GBP", "rub": "RUB"}

_MONTHS = {
    "de": "januar februar märz april mai juni juli august september oktober november dezember",
    "fr": "janvier février mars avril mai juin juillet août septembre octobre novembre décembre",
    "es": "enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre "
    "diciembre",
    "it": "gennaio febbraio marzo aprile maggio giugno luglio agosto settembre ottobre novembre "
    "dicembre",
    "pt": "janeiro fevereiro março abril maio junho julho agosto setembro outubro novembro "
    "dezembro",
    "ru": "января февраля марта апреля мая июня июля августа сентября октября ноября декабря",
}
_M = {code: tuple(names.split()) for code, names in _MONTHS.items()}
# Persian dates (producer/text/numbers.py): the months of the Solar Hijri calendar,
# which Iran dates by (۱۴۰۲/۰۵/۱۲, year first), and the Persian names of the Gregorian
# months. Not in Rules.months: "مه" (May) is also "fog", so a day before a month name is
# not read as a date in Persian.
SOLAR_MONTHS = tuple("فروردین اردیبهشت خرداد تیر مرداد شهریور مهر آبان آذر دی بهمن اسفند".split())
GREGORIAN_MONTHS_FA = tuple(
    "ژانویه فوریه مارس آوریل مه ژوئن ژوئیه اوت سپتامبر اکتبر نوامبر دسامبر".split()
)

# Romance ordinals: º masculine, ª feminine, with or without the dot before them (1.º).
_ROMANCE = {MASCULINE_MARK: "m", FEMININE_MARK: "f"}
# Russian: the ending after the hyphen says the ordinal's case and gender (3-го: genitive,
# "третьего"); -м is prepositional ("в 3-м классе") or instrumental, read prepositional.
_RUSSIAN = {
    "й": "n",
    "ый": "n",
    "ий": "n",
    "я": "n f",
    "ая": "n f",
    "е": "n n",
    "ое": "n n",
    "го": "g",
    "ого": "g",
    "му": "d",
    "ому": "d",
    "м": "p",
    "ом": "p",
    "ым": "i",
    "ю": "a f",
    "ую": "a f",
    "ой": "g f",
    "ей": "g f",
    "ых": "p plural",
}

LANGUAGES: dict[str, Rules] = {
    "de": Rules(
        "de",
        ",",
        ".",
        "komma",
        "digits",
        "prozent",
        {
            "EUR": "Euro Euro / Cent Cent",
            "USD": "Dollar Dollar / Cent Cent",
            "GBP": "Pfund Pfund / Penny Pence",
            "RUB": "Rubel Rubel / Kopeke Kopeken",
        },
        names={"euro": "EUR", "dollar": "USD", "rubel": "RUB"},
        months=_M["de"],
        day="ordinal",
    ),
    "fr": Rules(
        "fr",
        ",",
        ".",
        "virgule",
        "number",
        "pour cent",
        {
            "EUR": "euro euros / centime centimes",
            "USD": "dollar dollars / cent cents",
            "GBP": "livre livres / penny pence",
            "RUB": "rouble roubles / kopeck kopecks",
        },
        names={"euro": "EUR", "euros": "EUR", "dollar": "USD", "dollars": "USD"},
        ordinals={
            "er": "m",
            "re": "f",
            "ère": "f",
            "e": "m",
            "ème": "m",
            "nd": "second",
            "nde": "seconde",
        },
        months=_M["fr"],
        day="first",
    ),
    "es": Rules(
        "es",
        ",",
        ".",
        "coma",
        "number",
        "por ciento",
        {
            "EUR": "euro euros / céntimo céntimos",
            "USD": "dólar dólares / centavo centavos",
            "GBP": "libra libras / penique peniques",
            "RUB": "rublo rublos / kopek kopeks",
        },
        "{major} {unit} con {minor}",
        {"euro": "EUR", "euros": "EUR", "dólares": "USD"},
        ordinals={**_ROMANCE, "er": "apocope"},
        months=_M["es"],
        date="{d} de {m} de {y}",
    ),
    "it": Rules(
        "it",
        ",",
        ".",
        "virgola",
        "number",
        "percento",
        {
            "EUR": "euro euro / centesimo centesimi",
            "USD": "dollaro dollari / centesimo centesimi",
            "GBP": "sterlina sterline / penny penny",
            "RUB": "rublo rubli / copeco copechi",
        },
        "{major} {unit} e {minor}",
        {"euro": "EUR", "dollari": "USD"},
        ordinals=_ROMANCE,
        months=_M["it"],
        day="first",
    ),
    "pt": Rules(
        "pt",
        ",",
        ".",
        "vírgula",
        "number",
        "por cento",
        {
            "EUR": "euro euros / cêntimo cêntimos",
            "USD": "dólar dólares / cêntimo cêntimos",
            "GBP": "libra libras / péni pence",
            "RUB": "rublo rublos / copeque copeques",
        },
        "{major} {unit} e {minor}",
        {"euro": "EUR", "euros": "EUR", "dólares": "USD"},
        ordinals=_ROMANCE,
        months=_M["pt"],
        day="first",
        date="{d} de {m} de {y}",
    ),
    "ru": Rules(
        "ru",
        ",",
        ".",
        "",
        "precise",
        "процент/процента/процентов",
        {
            "EUR": "евро евро евро / цент цента центов",
            "USD": "доллар доллара долларов / цент цента центов",
            "GBP": "фунт фунта фунтов / пенни пенни пенни",
            "RUB": "рубль рубля рублей / копейка копейки копеек",
        },
        "{major} {unit} {minor} {subunit}",
        {
            "евро": "EUR",
            "рубль": "RUB",
            "рубля": "RUB",
            "рублей": "RUB",
            "руб.": "RUB",
            "доллар": "USD",
            "доллара": "USD",
            "долларов": "USD",
        },
        ordinals=_RUSSIAN,
        months=_M["ru"],
        day="g",
    ),
    "fa": Rules(
        "fa",
        ".",
        ",",
        "و",
        "parts",
        "درصد",
        {
            "EUR": "یورو یورو / سنت سنت",
            "USD": "دلار دلار / سنت سنت",
            "GBP": "پوند پوند / پنی پنی",
            "RUB": "روبل روبل / کوپک کوپک",
        },
        "{major} {unit} و {minor} {subunit}",
        ordinals={"\u200cام": "m", "ام": "m", "م": "m"},
        fixes=PERSIAN_LETTERS,
        day="ordinal",
    ),
    # Arabic: whole amounts only ("12.50 $" is read as a decimal before its unit): the
    # counted noun's case and number after 3-10 and 11-99 are beyond these rules.
    "ar": Rules(
        "ar",
        ".",
        ",",
        "فاصلة",
        "number",
        "بالمئة",
        {
            "EUR": "يورو يورو / سنت سنت",
            "USD": "دولار دولار / سنت سنت",
            "GBP": "جنيه جنيه / بنس بنس",
        },
        "",
    ),
}


# Languages whose num2words converter was checked here beyond LANGUAGES: 217 integers
# up to 10**15 as cardinal, ordinal and year, five decimals and EUR currency: every
# cardinal read in words, no call past 50 ms. Any other language keeps its digits:
# num2words 0.5.14 never returns for am (8164232) and overflows for te and kn; its
# errors elsewhere are of any type (AttributeError for a vi year, IndexError for a ro
# currency, RecursionError for es ordinals), so every call is guarded too.
NUM2WORDS_CHECKED = frozenset(
    "az be bn ca ce cs cy da eo fi he hu id is ja ko kz lt lv nl no pl ro sk sl sr sv tet "
    "tg th tr uk vi".split()
)


# Checked languages that write a decimal comma (CLDR): "3,5" is three point five, not
# the numbers 3 and 5; with a dot between digit groups ("1.500" is 1500), or with a space
# (a space between digit groups is read as two numbers: "3 500" may be two counts).
_DECIMAL_COMMA_GROUP_DOT = frozenset("az ca da id is nl ro sl sr tr vi".split())
_DECIMAL_COMMA = frozenset("be cs eo fi hu kz lt lv no pl sk sv tg uk".split())


def rules_for(language: str) -> Rules:
    """The rules of a language code ("pt-br" -> pt's, "por" -> pt's); a language off the
    allowlist (LANGUAGES and NUM2WORDS_CHECKED) gets its digits kept."""
    base = language_code(language).split("-")[0]
    if base in LANGUAGES:
        return LANGUAGES[base]
    if base not in NUM2WORDS_CHECKED:
        return Rules("")
    if base in _DECIMAL_COMMA_GROUP_DOT:
        return Rules(base, ",", ".")
    return Rules(base, ",", "") if base in _DECIMAL_COMMA else Rules(base)


def has_number_rules(language: str) -> bool:
    """Are numbers read out in this language (English by its cleaners, the others by
    rules_for), or kept as digits?"""
    base = language_code(language).split("-")[0]
    return base == "en" or bool(rules_for(language).code)
