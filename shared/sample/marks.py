"""What a sample's marks say of it: one small integer of bits, set by the producer that
made it, kept with its features in the feature cache (shared/corpus/feature_cache.py) and sent in
its READY (shared/wire/grants.py), so the stager can list a clip it delivers
(consumer/stager/outliers.py) without decoding it, and knows a wave field that holds a
cached mel (MEL).

The audio marks are the producers' verdict on the decoded clip before it is
normalized (producer/audio/decode.py judge_audio): near-silent or clipped speech, which
peak normalization would otherwise hide (a clip of room tone scaled up to
audio.peak_level trains as loud noise). What a marked clip costs is data.outliers'
(keep, flag, skip; docs/corpora.md#audio-that-is-not-its-text).

The thresholds, measured on the 56 shipped clips (data/ljspeech-mini: 16 LJSpeech
recordings; data/multilingual-demo: 40 espeak-ng clips), which must all pass:
- near-silent: RMS below NEAR_SILENT_DBFS. The shipped clips' RMS is -18.1 to
  -24.9 dBFS (peaks -0.4 to -6.1 dBFS); -55 dBFS is 30 dB below the quietest,
  where a 16-bit clip's speech would sit ~40 dB above its quantization floor and a
  recording of room tone or a muted microphone lies (-60 dBFS and below).
- clipped: more than CLIPPED_SHARE of its samples at full scale (|x| >=
  FULL_SCALE, within 32 steps of a 16-bit clip's largest value). The shipped clips
  hold none there; a clip peak-normalized to exactly 1.0 holds a handful (1-4 of
  100,000 samples at its own peak in the shipped clips), 25x below the share; a
  clip driven into its limits holds flat tops of many samples each.
"""

from __future__ import annotations

# The clip was cut to fit its slot (features.on_too_long: truncate).
TRUNCATED = 1
# Its RMS before normalization is below NEAR_SILENT_DBFS.
NEAR_SILENT = 2
# More than CLIPPED_SHARE of its samples are at full scale.
CLIPPED = 4
# The marks of a clip's audio (data.outliers), as opposed to what fitting it did.
AUDIO = NEAR_SILENT | CLIPPED
# What the feature cache keeps of a clip: MEL below is the sample's, never the clip's.
ALL = TRUNCATED | AUDIO
# The sample's wave field holds its clip's log-mel, [frames, n_mels] flattened, from the
# feature cache (features.device: stager): the stager copies it into the batch as it is
# and computes no mel for it (consumer/stager/assembly.py).
MEL = 8

NEAR_SILENT_DBFS = -55.0
FULL_SCALE = 0.999
CLIPPED_SHARE = 0.001


def audio_kinds(marks: int) -> list[str]:
    """The audio marks' names: 'near-silent', 'clipped' (in that order; [] for none)."""
    return [
        name for bit, name in ((NEAR_SILENT, "near-silent"), (CLIPPED, "clipped")) if marks & bit
    ]


def describe_audio(marks: int) -> str:
    """Why the audio marks were set, in one line with the thresholds ('' for none)."""
    parts = []
    if marks & NEAR_SILENT:
        parts.append(f"near-silent (RMS below {NEAR_SILENT_DBFS:.0f} dBFS before normalization)")
    if marks & CLIPPED:
        parts.append(f"clipped (over {CLIPPED_SHARE:.1%} of its samples at full scale)")
    return " and ".join(parts)
