"""Audio loading: decode, mix to mono, resample, trim, judge, normalize.

Called in producer processes, once per sample on a feature-cache miss. Every
way a file can be unusable ends in :class:`SkipSample` with a reason that
names the problem, so it lands in the quarantine report instead of crashing
the worker. Every decoded clip is judged before it is normalized (near-silent,
clipped: shared/sample/marks.py); what a marked clip costs is the pipeline's to
decide (data.outliers, producer/pipeline.py).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
import soundfile as sf
import soxr

from ringfeed.producer.audio.containers import shortfall
from ringfeed.producer.sample import SkipSample
from ringfeed.shared.config import Config
from ringfeed.shared.config.audio import RESAMPLE_QUALITY
from ringfeed.shared.corpus.clips import Clip, ClipError, ClipReader, Segment
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.sample import marks as m

log = logging.getLogger(__name__)

# Formats libsndfile may lack (mp3 needs libsndfile >= 1.1): these fall back to
# librosa/audioread. wav and flac never do, so a broken wav fails fast.
_FALLBACK_EXTENSIONS = (".mp3", ".m4a", ".ogg", ".opus")
# A clip that decodes this much short of its header's length is truncated (_read_whole).
SHORT_FRAMES, SHORT_SHARE = 2048, 0.02
# A segment may end this far past its file's end (durations written rounded): more is
# refused, never delivered shorter than its text.
SEGMENT_SLACK_S = 0.05


def check_duration(duration_s: float, path: str, cfg: Config, segment: Segment = None) -> None:
    """Reject from the header's duration_s (seconds) what would cost a long decode for
    nothing: longer than audio.max_duration_s, or, with features.on_too_long: skip and no
    silence trimming, longer than a slot holds (max_frames frames). A segment is judged
    by its own length."""
    if segment is not None:
        offset_s, length_s = segment
        if offset_s >= duration_s:
            raise SkipSample(
                f"segment starts at {offset_s:.2f} s, past the end of the file "
                f"({duration_s:.2f} s): fix its offset in the manifest",
                path,
            )
        if length_s and offset_s + length_s > duration_s + SEGMENT_SLACK_S:
            raise _past_end(path, segment, duration_s)
        duration_s = min(length_s or duration_s, duration_s - offset_s)
    a, f = cfg.audio, cfg.features
    if duration_s > a.max_duration_s:
        raise SkipSample(
            f"audio header says {duration_s:.1f} s > audio.max_duration_s={a.max_duration_s}"
            " (not decoded): raise audio.max_duration_s to use it",
            path,
        )
    slot_s = cfg.max_samples / a.sample_rate
    # One sample of slack: resampling may round the length either way; decode decides.
    if f.on_too_long == "skip" and not a.trim_silence and duration_s > slot_s + 1 / a.sample_rate:
        raise SkipSample(
            f"audio header says {duration_s:.2f} s >= {slot_s:.2f} s, more than "
            f"features.max_frames={f.max_frames} frames (not decoded): raise max_frames "
            "or set features.on_too_long: truncate",
            path,
        )


def _truncated(path: str, declared_s: float, held_s: float) -> SkipSample:
    return SkipSample(
        f"truncated audio file: its header says {declared_s:.2f} s, the file holds "
        f"{held_s:.2f} s (a copy cut short?): copy the file again",
        path,
    )


class Header(NamedTuple):
    """What a clip's header says: frames and samplerate (Hz) of the whole file, channels."""

    frames: int
    samplerate: int
    channels: int


def read_header(clip: Clip) -> Header:
    """The clip's header, nothing decoded (a clip read with a head of a few KiB will do);
    raises as soundfile does on a file it cannot open."""
    with sf.SoundFile(clip.source(), closefd=False) as f:
        return Header(f.frames, f.samplerate, f.channels)


def decode(clip: Clip, cfg: Config | None = None) -> tuple[np.ndarray, int]:
    """The clip (shared/corpus/clips.py read_clip) -> (float32 [n_samples, n_channels],
    sample_rate in Hz); only its segment (offset_s, duration_s; duration 0: to the end)
    when it has one. With cfg, the header's duration is judged before anything is
    decoded (check_duration).

    A file is opened once: its header, the check of its chunks against its length
    (producer/audio/containers.py) and the decode share one descriptor. Opening it three
    times (header, chunks, decode) cost ~0.15 ms a clip here, 3 % of a cold sample."""
    path, segment = clip.path, clip.segment
    if clip.size == 0:
        raise SkipSample("zero-byte audio file", path)
    try:
        with sf.SoundFile(clip.source(), closefd=False) as f:
            if cfg is not None and f.samplerate > 0:
                check_duration(f.frames / f.samplerate, path, cfg, segment)
            _check_whole(clip)
            return _read_whole(f, path) if segment is None else _read_segment(f, segment, path)
    except sf.LibsndfileError as exc:
        _check_whole(clip)  # a cut-short WAV that libsndfile refuses: say so
        if not clip.is_file or not path.lower().endswith(_FALLBACK_EXTENSIONS):
            raise SkipSample(
                f"unreadable audio file (soundfile: {exc.error_string})", path
            ) from None
        return _decode_fallback(path, exc, segment)


def _check_whole(clip: Clip) -> None:
    """SkipSample for a RIFF/RF64/Wave64/AIFF clip whose sample data is cut short
    (producer/audio/containers.py); any other clip passes here (decode judges the rest)."""
    short = shortfall(clip.read_at, clip.size)
    if short is not None:
        raise _truncated(clip.path, *short)


def _read_whole(f: sf.SoundFile, path: str) -> tuple[np.ndarray, int]:
    """The whole clip, refused as truncated when it decodes to less than its header
    declares (an MP3 cut short keeps its Xing header's length: 5.00 s declared, 3.84 s
    decoded); encoder padding makes a few frames either way normal."""
    declared, sr = f.frames, f.samplerate
    data = _read_frames(f)
    if sr > 0 and 0 < len(data) < declared - max(SHORT_FRAMES, SHORT_SHARE * declared):
        raise _truncated(path, declared / sr, len(data) / sr)
    return data, int(sr)


def _read_segment(
    f: sf.SoundFile, segment: tuple[float, float], path: str
) -> tuple[np.ndarray, int]:
    """The segment's frames, refused when it runs past the end of the file by more than
    SEGMENT_SLACK_S (a manifest pairing a whole text with part of its clip)."""
    sr = f.samplerate
    # At least one sample: a duration under half a sample is not "to the end".
    start, n = round(segment[0] * sr), max(1, round(segment[1] * sr)) if segment[1] else -1
    f.seek(min(start, f.frames))
    data = _read_frames(f, n)
    if segment[1] and len(data) < n - SEGMENT_SLACK_S * sr:
        raise _past_end(path, segment, (start + len(data)) / sr)
    return data, int(sr)


def _read_frames(f: sf.SoundFile, n: int = -1) -> np.ndarray:
    """f's next n frames (-1: to the end) as float32 [frames, channels] in [-1, 1].

    16-bit PCM (WAV, FLAC, AIFF, ...: most speech corpora) is read as int16 and scaled
    by 2**-15 here: the very numbers libsndfile's own float conversion gives (a power of
    two: exact; tests/unit/test_audio_features.py), in 0.12 ms instead of 0.45 ms for a
    5 s clip here, a tenth of a cold sample."""
    if f.subtype != "PCM_16":
        return f.read(n, dtype="float32", always_2d=True)
    data = f.read(n, dtype="int16", always_2d=True).astype(np.float32)
    data *= np.float32(2**-15)
    return data


def _past_end(path: str, segment: tuple[float, float], file_s: float) -> SkipSample:
    return SkipSample(
        f"segment {segment[0]:.2f}-{segment[0] + segment[1]:.2f} s runs past the end of the "
        f"file ({file_s:.2f} s): fix its offset and duration in the manifest",
        path,
    )


def _decode_fallback(
    path: str, first_error: Exception, segment: Segment = None
) -> tuple[np.ndarray, int]:
    import librosa  # deferred: only mp3-like files without libsndfile support need it

    offset_s, duration_s = segment or (0.0, 0.0)
    try:
        data, sr = librosa.load(
            path,
            sr=None,
            mono=False,
            dtype=np.float32,
            offset=offset_s,
            duration=duration_s or None,
        )
    except Exception as exc:  # audioread and its backends raise many unrelated types
        raise SkipSample(
            f"unreadable audio file (soundfile: {first_error}; audioread: {exc})", path
        ) from None
    return np.atleast_2d(data).T, int(sr)


def to_mono(data: np.ndarray) -> np.ndarray:
    """[n_samples, n_channels] -> contiguous float32 [n_samples] (channel mean)."""
    if data.shape[1] == 1:
        return np.ascontiguousarray(data[:, 0])
    return data.mean(axis=1, dtype=np.float32)


def resample(wave: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """float32 [n] at sr_in Hz -> float32 [~n * sr_out / sr_in] at sr_out Hz (soxr HQ)."""
    if sr_in == sr_out:
        return wave
    return soxr.resample(wave, sr_in, sr_out, quality=RESAMPLE_QUALITY).astype(np.float32)


def judge_audio(data: np.ndarray, wave: np.ndarray) -> int:
    """The audio marks (shared/sample/marks.py) of a clip: data float32 [n_samples,
    n_channels] as decoded (flat tops are judged before resampling rounds them off),
    wave float32 [n] its mono, resampled and trimmed, not yet normalized."""
    marks = 0
    exact = wave.astype(np.float64)  # float64 squares are exact; a BLAS dot sums them in
    rms = float(np.sqrt(np.dot(exact, exact) / wave.size)) if wave.size else 0.0  # 1/2 the time
    if rms <= 0.0 or 20 * np.log10(rms) < m.NEAR_SILENT_DBFS:
        marks |= m.NEAR_SILENT
    # Counted only when a sample reaches full scale at all: two reductions without a
    # temporary instead of |data| and a mask, each as large as the clip.
    if (
        data.size
        and _peak(data) >= m.FULL_SCALE
        and (np.count_nonzero(np.abs(data) >= m.FULL_SCALE) > m.CLIPPED_SHARE * data.size)
    ):
        marks |= m.CLIPPED
    return marks


def _peak(a: np.ndarray) -> float:
    """max |a| of a non-empty array, without an |a| as large as it."""
    return max(float(a.max()), -float(a.min()))


def load_clip(clips: ClipReader, entry: Entry, cfg: Config) -> tuple[np.ndarray, int]:
    """The entry's clip read (shared/corpus/clips.py read_clip: a file, a tar member, a
    Parquet byte range, an object, a segment of any) and loaded: load_judged's (wave,
    marks). A clip that cannot be read is a SkipSample with the reader's reason."""
    try:
        clip = clips.read_clip(entry)
    except ClipError as exc:
        raise SkipSample(exc.reason, exc.path) from None
    with clip:
        return load_judged(clip, cfg)


def load_audio(clip: Clip, cfg: Config) -> np.ndarray:
    """Decode the clip -> float32 [n_samples] mono at audio.sample_rate, trimmed and
    normalized.

    Raises SkipSample for unreadable, empty, non-finite, silent or too-short audio.
    """
    return load_judged(clip, cfg)[0]


def load_judged(clip: Clip, cfg: Config) -> tuple[np.ndarray, int]:
    """(load_audio's wave, the clip's audio marks: judge_audio before normalization)."""
    path = clip.path
    a = cfg.audio
    data, sr = decode(clip, cfg)
    if data.size == 0:
        raise SkipSample("audio file has no samples", path)
    wave = to_mono(data)
    if not np.isfinite(wave).all():
        raise SkipSample("audio has NaN or infinite samples", path)
    wave = resample(wave, sr, a.sample_rate)
    if a.trim_silence:
        import librosa  # deferred: loading librosa costs ~1 s, see SamplePipeline.warm_up

        wave, _ = librosa.effects.trim(wave, top_db=a.trim_top_db)
    duration_s = len(wave) / a.sample_rate
    if duration_s < a.min_duration_s:
        raise SkipSample(
            f"audio too short: {duration_s:.3f} s < audio.min_duration_s={a.min_duration_s}",
            path,
        )
    marks = judge_audio(data, wave)
    if a.normalize == "peak":
        peak = _peak(wave)
        if peak == 0.0:
            raise SkipSample("audio is silent (peak 0)", path)
        wave = wave * np.float32(a.peak_level / peak)
    return np.ascontiguousarray(wave, dtype=np.float32), marks
