"""Make data/multilingual-demo: a small multilingual, multi-speaker corpus spoken by
espeak-ng, and its manifest. Run once by the maintainers (the result ships in the repo):

    .venv/bin/python -m ringfeed.scripts.make_demo_corpus [OUT_DIR]

4 languages in 3 scripts (English and German in Latin, Russian in Cyrillic, Persian
in Arabic script), 3 speakers (espeak-ng voice variants: a low male, a female and a
high male voice, each speaking every language), 10 sentences per language with
numbers, dates and currency written as digits, so the normalizers have work to do.
Each clip is espeak-ng's 22,050 Hz output resampled to 16 kHz and stored as FLAC
(about 1.5 MB in all). The manifest names speaker and language for every clip but
four, whose language is left to the detector (data.language: auto).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import soundfile as sf
import soxr

from ringfeed.producer.text.encoder import english_cleaners
from ringfeed.producer.text.normalize import normalize

OUT = Path(__file__).resolve().parent.parent / "data" / "multilingual-demo"
RATE_HZ = 16_000
# speaker name -> espeak-ng variant, and its speed (words a minute) and pitch (0-99).
SPEAKERS = {"ava": ("f2", 160, 60), "ben": ("m3", 150, 35), "cyrus": ("m1", 170, 50)}
VOICES = {"en": "en-us", "de": "de", "ru": "ru", "fa": "fa"}
SENTENCES = {
    "en": [
        "The train leaves at 7 o'clock.",
        "A ticket costs $12.50 today.",
        "We met on 5 May 1999.",
        "Prices rose by 30% this year.",
        "Call me at 9.",
        "She read 3 books in 2 days.",
        "The 2nd door is on the left.",
        "It is 21 degrees outside.",
        "He paid £40 for the coat.",
        "Open the window, please.",
    ],
    "de": [
        "Der Zug fährt um 7 Uhr ab.",
        "Das Ticket kostet 12,50 €.",
        "Wir trafen uns am 23.11.2026.",
        "Die Preise stiegen um 30 %.",
        "Ich habe 3 Katzen und 2 Hunde.",
        "Das Haus hat 12 Fenster.",
        "Es ist 21 Grad warm.",
        "Bitte schließ die Tür.",
        "Er kaufte 40 Äpfel.",
        "Guten Morgen, wie geht es dir?",
    ],
    "ru": [
        "Поезд отправляется в 7 часов.",
        "Билет стоит 500 ₽.",
        "Мы встретились 23.11.2026.",
        "Цены выросли на 30 %.",
        "У меня 3 кошки и 2 собаки.",
        "В доме 12 окон.",
        "На улице 21 градус.",
        "Закрой, пожалуйста, дверь.",
        "Он купил 40 яблок.",
        "Доброе утро, как дела?",
    ],
    "fa": [
        "قطار ساعت ۷ حرکت می‌کند.",
        "بلیت ۱۲ یورو است.",
        "ما ۳ کتاب خریدیم.",
        "قیمت‌ها ۳۰٪ بالا رفت.",
        "خانه ۱۲ پنجره دارد.",
        "هوا ۲۱ درجه است.",
        "لطفاً در را ببند.",
        "او ۴۰ سیب خرید.",
        "صبح بخیر، حالت چطور است؟",
        "من ۲ برادر دارم.",
    ],
}


def spoken(text: str, language: str) -> str:
    """What espeak-ng reads: the normalized text, so the audio says the words ringfeed's
    producers will tokenize (espeak's own number reading differs)."""
    return english_cleaners(text) if language == "en" else normalize(text, language)


def speak(text: str, voice: str, variant: str, speed: int, pitch: int, out: Path) -> None:
    with tempfile.NamedTemporaryFile(suffix=".wav") as tmp:
        subprocess.run(
            [
                "espeak-ng",
                "-v",
                f"{voice}+{variant}",
                "-s",
                str(speed),
                "-p",
                str(pitch),
                "-w",
                tmp.name,
                text,
            ],
            check=True,
            capture_output=True,
        )
        wave, rate = sf.read(tmp.name, dtype="float32")
    sf.write(out, soxr.resample(wave, rate, RATE_HZ), RATE_HZ, format="FLAC")


def main(out: Path = OUT) -> int:
    (out / "clips").mkdir(parents=True, exist_ok=True)
    lines = []
    for language, sentences in SENTENCES.items():
        for k, text in enumerate(sentences):
            name = list(SPEAKERS)[k % len(SPEAKERS)]
            variant, speed, pitch = SPEAKERS[name]
            clip = f"clips/{language}-{k:02d}-{name}.flac"
            speak(spoken(text, language), VOICES[language], variant, speed, pitch, out / clip)
            entry = {"audio": clip, "text": text, "speaker": name, "language": language}
            if k == 9:
                del entry["language"]  # detected: data.language auto
            lines.append(json.dumps(entry, ensure_ascii=False))
    (out / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{out}: {len(lines)} clips")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
