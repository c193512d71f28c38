"""Audio files for tests: a file of a given length, rate, channels and content (silence,
noise, a tone, a shipped clip's speech, or samples of the test's own), in any format
soundfile writes, or its bytes; the shipped clips themselves (data/ljspeech-mini/wavs);
a file read and decoded as the producers read and decode a clip; and librosa's log-mel,
the reference the producers' and the stager's mels are held to."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from ringfeed.producer.audio.decode import decode, load_audio, load_judged
from ringfeed.shared.config import Config
from ringfeed.shared.corpus.clips import Clip, ClipReader
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.sample.content import LOG_FLOOR
from tests.support.paths import WAVS

TONE_HZ, TONE_PEAK = 220.0, 0.3  # "tone": a sine a corpus's loudness check accepts


def file_clip(path: str | Path, segment: tuple[float, float] | None = None) -> Clip:
    """A file's clip, opened as read_clip opens it (shared/corpus/clips.py); close it."""
    offset_s, duration_s = segment or (0.0, 0.0)
    entry = Entry("", str(path), "", offset_s=offset_s, duration_s=duration_s)
    return ClipReader(Config()).read_clip(entry)


def load_file(
    path: str | Path, cfg: Config, segment: tuple[float, float] | None = None
) -> np.ndarray:
    """producer/audio/decode.py load_audio of a file (or its segment)."""
    with file_clip(path, segment) as clip:
        return load_audio(clip, cfg)


def judge_file(
    path: str | Path, cfg: Config, segment: tuple[float, float] | None = None
) -> tuple[np.ndarray, int]:
    """producer/audio/decode.py load_judged of a file (or its segment): (wave, marks)."""
    with file_clip(path, segment) as clip:
        return load_judged(clip, cfg)


def decode_file(
    path: str | Path, segment: tuple[float, float] | None = None
) -> tuple[np.ndarray, int]:
    """producer/audio/decode.py decode of a file (or its segment), its header unjudged."""
    with file_clip(path, segment) as clip:
        return decode(clip)


def copy_clip(dst: Path, name: str = "LJ001-0001") -> Path:
    """A byte-for-byte copy of a shipped clip at dst (its folder made); returns dst."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(WAVS / f"{name}.wav", dst)
    return dst


def samples(content: str | Path, seconds: float | None, sample_rate: int) -> np.ndarray:
    """Mono float32 samples: "silence", "noise" (seeded) or "tone" for `seconds`, or a
    clip's speech resampled to sample_rate, cut or repeated to `seconds` if given."""
    if isinstance(content, Path):
        wave, sr = sf.read(content, dtype="float32")
        wave = soxr.resample(wave, sr, sample_rate) if sr != sample_rate else wave
        if seconds is None:
            return wave
        n = int(seconds * sample_rate)
        return np.tile(wave, -(-n // len(wave)))[:n]
    assert seconds is not None, f"how long should the {content} be?"
    n = int(seconds * sample_rate)
    if content == "silence":
        return np.zeros(n, np.float32)
    if content == "noise":
        return np.random.default_rng(0).uniform(-0.5, 0.5, n).astype(np.float32)
    if content == "tone":
        t = np.arange(n) / sample_rate
        return (TONE_PEAK * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)
    raise ValueError(f"no audio content {content!r}: silence, noise, tone, a Path or an array")


def write_audio(
    path: Path,
    content: str | Path | np.ndarray = "tone",
    seconds: float | None = None,
    sample_rate: int = 22050,
    channels: int = 1,
    subtype: str | None = None,
    format: str | None = None,
) -> Path:
    """Write an audio file (its folder made) and return its path.

    content: "silence", "noise" or "tone" (0.3 * sin 220 Hz), `seconds` long; a Path:
    that clip's speech at sample_rate (cut or repeated to `seconds` if given); an array:
    these samples ([n] or [n, channels]) as they are. channels: a mono content copied
    to that many channels. subtype, format: soundfile's (PCM_16, PCM_24, FLOAT; MP3),
    else what the file's suffix implies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _channels(content, seconds, sample_rate, channels)
    sf.write(path, data, sample_rate, subtype=subtype, format=format)
    return path


def audio_bytes(
    content: str | Path | np.ndarray = "tone",
    seconds: float | None = None,
    sample_rate: int = 22050,
    subtype: str | None = None,
    format: str = "WAV",
) -> bytes:
    """The bytes write_audio would write (mono), for a test that cuts or splices them."""
    out = io.BytesIO()
    data = _channels(content, seconds, sample_rate, 1)
    sf.write(out, data, sample_rate, subtype=subtype, format=format)
    return out.getvalue()


def _channels(
    content: str | Path | np.ndarray, seconds: float | None, sample_rate: int, channels: int
) -> np.ndarray:
    data = content if isinstance(content, np.ndarray) else samples(content, seconds, sample_rate)
    return np.stack([data] * channels, axis=1) if channels > 1 else data


def librosa_log_mel(wave: np.ndarray, cfg: Config) -> np.ndarray:
    """log-mel [frames, n_mels] of `wave` (at cfg.audio.sample_rate) by librosa, with the
    producers' settings: the reference of the parity tests and benchmarks."""
    import librosa

    f = cfg.features
    mel = librosa.feature.melspectrogram(
        y=wave,
        sr=cfg.audio.sample_rate,
        n_fft=f.n_fft,
        hop_length=f.hop_length,
        win_length=f.win_length,
        window="hann",
        center=True,
        pad_mode="constant",
        power=1.0,
        n_mels=f.n_mels,
        fmin=f.fmin,
        fmax=f.fmax,
        htk=False,
        norm="slaney",
    )
    return np.log(np.maximum(mel, LOG_FLOOR)).T
