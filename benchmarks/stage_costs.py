"""`benchmarks/peers.py --stages`: the cold path's CPU per sample, stage by stage, for one
ringfeed producer and for tfdata-ops, on the same clips.

- ringfeed: each stage of a producer's cold sample called in turn on every clip, in
  one process on one thread, its CPU time summed per stage: reading and judging the
  audio (producer/audio/decode.py load_judged: decode, the truncation and NaN checks, the
  marks, normalization), the STFT magnitude and the mel with its log
  (producer/features/mel.py), the tokens (texts cleaned for real), the feature-cache
  write, and the copy into a slot with the READY's checksum; and the whole
  SamplePipeline on an empty cache.
- tfdata-ops: tf.data cannot be stopped between ops, so the pipeline of
  peer_pipelines.tf_ops_dataset is run cut after each stage (read and decode, + STFT
  magnitude, + mel and log, + tokens, + padded batches), each over every clip, one
  clip at a time (with AUTOTUNE's threads the cuts' differences were noise, a stage
  at -0.7 ms), and a stage's cost is the difference between its cut and the one
  before (the process's CPU time, all of tf.data's threads). tf.data's own cost per
  clip falls in the first stage; the small stages stay within ~0.2 ms of noise on a
  shared machine, the whole within a few percent.

Each is timed over PASSES passes (ringfeed's after one untimed pass that grows the
work buffers; the cuts alternated), and the median counts.

Each runs in a child process of peers.py (TensorFlow stays out of ringfeed's).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

# Passes over the clips; each stage's median counts (the machine is shared).
PASSES = 3


def _cpu_s() -> float:
    """This process's CPU seconds, all threads (os.times() counts 10 ms ticks)."""
    return time.process_time()


def ringfeed_stages(cfg, paths: list[str], texts: list[str]) -> dict[str, float]:
    """CPU ms per clip of each stage of a producer's cold sample (module docstring)."""
    from ringfeed.producer.process.threads import pin_math_threads
    from ringfeed.producer.sources import DatasetSource
    from ringfeed.producer.text.encoder import TextEncoder
    from ringfeed.shared.config import replace
    from ringfeed.shared.corpus.feature_cache import FeatureCache
    from ringfeed.shared.corpus.open import open_corpus

    pin_math_threads(1)
    # No persistent text cache: the tokens' cost is a cold run's, in every pass.
    encoder = TextEncoder(replace(cfg, features={"cache": False}))
    cache = FeatureCache(cfg)
    _ringfeed_pass(cfg, paths, texts, encoder, cache)  # grows the work buffers: untimed
    passes = [_ringfeed_pass(cfg, paths, texts, encoder, cache) for _ in range(PASSES)]
    out = {
        stage: 1e3 * statistics.median(p[stage] for p in passes) / len(paths) for stage in passes[0]
    }
    whole = []
    for k in range(PASSES):
        empty = replace(cfg, features={"cache_dir": f"{cfg.features.cache_dir}-{k}"})
        fresh = DatasetSource(empty, open_corpus(empty))  # its index prepared, cold cache
        fresh.warm_up()
        t0 = _cpu_s()
        for item in range(fresh.n_items):
            fresh.prepare(item)
        whole.append(1e3 * (_cpu_s() - t0) / fresh.n_items)
    return out | {"whole SamplePipeline": statistics.median(whole)}


def _ringfeed_pass(cfg, paths: list[str], texts: list[str], encoder, cache) -> dict[str, float]:
    """CPU seconds of each stage over every clip (the encoder's caches emptied first)."""
    from ringfeed.producer.audio.decode import load_clip
    from ringfeed.producer.features import mel as F
    from ringfeed.shared.corpus.clips import ClipReader
    from ringfeed.shared.corpus.entry import Entry
    from ringfeed.shared.memory.row_pass import check_fields
    from ringfeed.shared.sample.mel_definition import used_bins

    bins = used_bins(cfg.audio.sample_rate, cfg.features)
    slot = np.zeros((cfg.features.max_frames, cfg.features.n_mels), np.float32)
    clips = ClipReader(cfg)
    encoder.clean.cache_clear()
    encoder._encoded.cache_clear()
    spent = dict.fromkeys(
        (
            "audio read, decode, normalize",
            "STFT |X|",
            "mel + log",
            "tokens",
            "cache write",
            "slot copy + checksum",
        ),
        0.0,
    )
    for path, text in zip(paths, texts, strict=True):
        t0 = _cpu_s()
        entry = Entry("", path, text)
        wave, _ = F.fit_length(load_clip(clips, entry, cfg)[0], cfg, path)
        t1 = _cpu_s()
        magnitude = F._magnitude(wave, cfg.features, bins)
        t2 = _cpu_s()
        mel = F._to_log_mel(magnitude, cfg)
        t3 = _cpu_s()
        tokens, _ = encoder.encode(text, path)
        t4 = _cpu_s()
        cache.put(cache.key(entry), mel, 0)
        t5 = _cpu_s()
        check_fields(
            ["tokens", "mel"], [tokens, mel], cfg.vocab_size, [np.empty_like(tokens), slot]
        )
        t6 = _cpu_s()
        times = (t0, t1, t2, t3, t4, t5, t6)
        for stage, start, end in zip(spent, times, times[1:], strict=False):
            spent[stage] += end - start
    return spent


def tf_stages(cfg, paths: list[str], texts: list[str]) -> dict[str, float]:
    """CPU ms per clip of each stage of tfdata-ops, from its cuts (module docstring)."""
    datasets = _tf_cuts(cfg, paths, texts)
    for ds in datasets.values():
        for _ in ds.take(2):  # tracing and the first calls, untimed
            pass
    totals: dict[str, list[float]] = {stage: [] for stage in datasets}
    for _ in range(PASSES):  # the cuts alternate, so a busy moment hits them alike
        for stage, ds in datasets.items():
            t0 = _cpu_s()
            for _ in ds:
                pass
            totals[stage].append(1e3 * (_cpu_s() - t0) / len(paths))
    out, before = {}, 0.0
    for stage, each in totals.items():
        out[stage], before = statistics.median(each) - before, statistics.median(each)
    return out | {"whole pipeline": before}


def _tf_cuts(cfg, paths: list[str], texts: list[str]) -> dict:
    """Stage name -> tfdata-ops's pipeline cut after that stage (the last: all of it)."""
    import peer_pipelines as pp

    from ringfeed.producer.features.mel import mel_filterbank
    from ringfeed.shared.sample.content import LOG_FLOOR

    tf, options = pp.tf_setup()
    options.threading.private_threadpool_size = 1  # one clip at a time: cuts comparable
    f, max_n, peak = cfg.features, cfg.max_samples - 1, cfg.audio.peak_level
    fb = tf.constant(mel_filterbank(cfg).T)

    def decoded(path):
        wave, _ = tf.audio.decode_wav(tf.io.read_file(path), desired_channels=1)
        return wave[:max_n, 0] * (peak / tf.reduce_max(tf.abs(wave[:max_n, 0])))

    def magnitude(path):
        padded = tf.pad(decoded(path), [[f.n_fft // 2, f.n_fft // 2]])
        return tf.abs(tf.signal.stft(padded, f.win_length, f.hop_length, f.n_fft, pad_end=False))

    def mel(path):
        return tf.math.log(tf.maximum(tf.matmul(magnitude(path), fb), LOG_FLOOR))

    def with_tokens(path, text):
        chars = tf.strings.unicode_decode(tf.strings.lower(text), "UTF-8")
        m = mel(path)
        return {
            "tokens": tf.minimum(chars[: cfg.text.max_text_len], 255),
            "mel": m,
            "mel_lens": tf.shape(m)[0],
        }

    def first(x):  # one value of x, which needs all of it computed, at no cost of its own
        return tf.cast(tf.reshape(x, [-1])[0], tf.float32)

    def everything(path, text):
        sample = with_tokens(path, text)
        return first(sample["mel"]) + first(sample["tokens"])

    # Each cut ends in batches of one number a clip, so every cut is iterated alike.
    both = tf.data.Dataset.from_tensor_slices((paths, texts)).with_options(options)
    cuts = {
        "audio read, decode, normalize": lambda p, t: first(decoded(p)),
        "STFT |X|": lambda p, t: first(magnitude(p)),
        "mel + log": lambda p, t: first(mel(p)),
        "tokens": everything,
    }
    datasets = {k: both.map(fn).batch(pp.BATCH) for k, fn in cuts.items()}
    shapes = {"tokens": [cfg.text.max_text_len], "mel": [f.max_frames, f.n_mels], "mel_lens": []}
    datasets["padded batches"] = both.map(with_tokens).padded_batch(pp.BATCH, shapes)
    return datasets


def print_stages(ours: dict[str, float], theirs: dict[str, float]) -> None:
    """The two breakdowns side by side, with ringfeed's share of tf.data's per stage."""
    print("\n| cold path, CPU ms/sample | ringfeed producer | tfdata-ops | ratio |")
    print("|---|---:|---:|---:|")
    for stage in dict.fromkeys([*ours, *theirs]):
        a, b = ours.get(stage), theirs.get(stage)
        ratio = f"{a / b:.2f}" if a is not None and b else ""
        cells = [f"{x:.3f}" if x is not None else "" for x in (a, b)]
        print(f"| {stage} | {cells[0]} | {cells[1]} | {ratio} |")


def clips(corpus: Path) -> tuple[list[str], list[str]]:
    """The corpus's audio paths and texts, in metadata order."""
    rows = [line.split("|") for line in (corpus / "metadata.csv").read_text().splitlines()]
    return [str(corpus / "wavs" / f"{r[0]}.wav") for r in rows], [r[1] for r in rows]
