"""The tf.data pipelines benchmarks/peers.py runs against ringfeed, built from one config.

- tf_ops_dataset: the strongest cold pipeline of TensorFlow ops only (decode_wav,
  tf.signal.stft, the producers' mel matrix);
- tf_librosa_dataset: numpy_function around soundfile and librosa (the old pipeline);
- tf_cached_dataset: the cached mels, the very arrays ringfeed's feature cache holds
  (export_cached copies them out of it, with their tokens, one file each), read with
  ``read_file`` and ``decode_raw``: what a tf.data user does with mels computed once.
  One file per clip ran 2,810-3,082 samples/s here against 1,642-2,537 for one
  TFRecord file of the same mels (parse_single_example), so the faster is the peer.

Every pipeline maps with AUTOTUNE on a private pool of WORKERS threads, one intra-op
thread, pads to [BATCH, max_frames, n_mels] and prefetches. Imported by peers.py's
child processes only (TensorFlow stays out of ringfeed's processes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

BATCH = 32
WORKERS = 2


def tf_setup():
    """TensorFlow on one intra- and one inter-op thread, and tf.data options with a private
    pool of WORKERS threads. TensorFlow is imported as the trainer imports it."""
    from ringfeed.consumer.devices import import_tensorflow

    tf = import_tensorflow()

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    options = tf.data.Options()
    options.threading.private_threadpool_size = WORKERS
    options.threading.max_intra_op_parallelism = 1
    return tf, options


def _batched(ds, cfg, tf):
    """map'ed samples -> padded batches of BATCH, prefetched."""
    f = cfg.features
    shapes = {"tokens": [cfg.text.max_text_len], "mel": [f.max_frames, f.n_mels], "mel_lens": []}
    return ds.padded_batch(BATCH, padded_shapes=shapes).prefetch(tf.data.AUTOTUNE)


def tf_ops_dataset(cfg, paths: list[str], texts: list[str]):
    """decode_wav -> peak normalize -> tf.signal.stft -> mel matrix -> log, padded batches."""
    from ringfeed.producer.features.mel import mel_filterbank
    from ringfeed.shared.sample.content import LOG_FLOOR

    tf, options = tf_setup()
    f, max_n = cfg.features, cfg.max_samples - 1
    fb = tf.constant(mel_filterbank(cfg).T)
    peak = cfg.audio.peak_level

    def load(path, text):
        wave, _ = tf.audio.decode_wav(tf.io.read_file(path), desired_channels=1)
        wave = wave[:max_n, 0]
        wave = wave * (peak / tf.reduce_max(tf.abs(wave)))
        padded = tf.pad(wave, [[f.n_fft // 2, f.n_fft // 2]])
        spec = tf.signal.stft(padded, f.win_length, f.hop_length, f.n_fft, pad_end=False)
        mel = tf.math.log(tf.maximum(tf.matmul(tf.abs(spec), fb), LOG_FLOOR))
        chars = tf.strings.unicode_decode(tf.strings.lower(text), "UTF-8")
        tokens = tf.minimum(chars[: cfg.text.max_text_len], 255)
        return {"tokens": tokens, "mel": mel, "mel_lens": tf.shape(mel)[0]}

    ds = tf.data.Dataset.from_tensor_slices((paths, texts)).with_options(options)
    return _batched(ds.map(load, num_parallel_calls=tf.data.AUTOTUNE), cfg, tf)


def tf_librosa_dataset(cfg, paths: list[str], texts: list[str]):
    """tf.numpy_function around soundfile + librosa (the old pipeline), padded batches."""
    from producer_cache import raw_mel

    from ringfeed.producer.text.encoder import TextEncoder

    tf, options = tf_setup()
    f, encoder = cfg.features, TextEncoder(cfg)
    raw_mel(paths[0], cfg)  # librosa's first call (imports, numba) is not the pipeline's

    def load(i):
        mel = raw_mel(paths[int(i)], cfg).astype(np.float32)
        tokens, _ = encoder.encode(texts[int(i)], paths[int(i)])
        return tokens.astype(np.int32), mel, np.int32(len(mel))

    def to_dict(i):
        tokens, mel, n = tf.numpy_function(load, [i], (tf.int32, tf.float32, tf.int32))
        tokens.set_shape([None])
        mel.set_shape([None, f.n_mels])
        n.set_shape([])
        return {"tokens": tokens, "mel": mel, "mel_lens": n}

    ds = tf.data.Dataset.from_tensor_slices(np.arange(len(paths))).with_options(options)
    return _batched(ds.map(to_dict, num_parallel_calls=tf.data.AUTOTUNE), cfg, tf)


def export_cached(cfg, paths: list[str], texts: list[str], out: Path) -> list[np.ndarray]:
    """Copy the log-mel of each clip in ringfeed's feature cache (filled by ringfeed-cold
    of the same round) into out/i.mel, raw float32, and its tokens into out/i.tok, int32,
    i counting the clips found; -> their mels, for the rows check. A clip the stager
    skipped (outside the speaking-rate band) is not in the cache, nor delivered by
    ringfeed-cached, so it is left out here too. Not timed: it stands for computing
    the mels once."""
    from ringfeed.producer.text.encoder import TextEncoder
    from ringfeed.shared.corpus.entry import Entry
    from ringfeed.shared.corpus.feature_cache import FeatureCache

    cache, encoder = FeatureCache(cfg), TextEncoder(cfg)
    out.mkdir(parents=True, exist_ok=True)
    mels = []
    for path, text in zip(paths, texts, strict=True):
        hit = cache.get(cache.key(Entry("", path, "")))
        if hit is None:
            continue
        stem = out / str(len(mels))
        mels.append(np.array(hit[0]))
        stem.with_suffix(".mel").write_bytes(mels[-1].tobytes())
        tokens, _ = encoder.encode(text, path)
        stem.with_suffix(".tok").write_bytes(tokens.astype(np.int32).tobytes())
    cache.close()
    if not mels:
        raise RuntimeError(f"no clip of {out} is in the feature cache: run ringfeed-cold first")
    return mels


def tf_cached_dataset(cfg, folder: Path, n: int, epochs: int):
    """The exported mels and tokens (export_cached) read back, `epochs` times, padded."""
    tf, options = tf_setup()
    n_mels, stem = cfg.features.n_mels, str(folder) + "/"

    def load(i):
        name = stem + tf.strings.as_string(i)
        mel = tf.reshape(tf.io.decode_raw(tf.io.read_file(name + ".mel"), tf.float32), [-1, n_mels])
        tokens = tf.io.decode_raw(tf.io.read_file(name + ".tok"), tf.int32)
        return {"tokens": tokens, "mel": mel, "mel_lens": tf.shape(mel)[0]}

    ds = tf.data.Dataset.range(n).with_options(options).repeat(epochs)
    return _batched(ds.map(load, num_parallel_calls=tf.data.AUTOTUNE), cfg, tf)


def tf_parity(cfg, path: str) -> float:
    """Largest |log-mel difference| of tfdata-ops against the producer where the mel is
    above 2e-4 (the two really compute the same thing)."""
    from ringfeed.producer.audio.decode import load_clip
    from ringfeed.producer.features.mel import fit_length, log_mel
    from ringfeed.shared.corpus.clips import ClipReader
    from ringfeed.shared.corpus.entry import Entry

    wave, _ = fit_length(load_clip(ClipReader(cfg), Entry("", path, ""), cfg)[0], cfg)
    ours = log_mel(wave, cfg)
    theirs = next(iter(tf_ops_dataset(cfg, [path], ["a"])))["mel"].numpy()[0, : len(ours)]
    above = ours > -8.5
    return float(np.abs(ours - theirs)[above].max())


def cached_rows_match(batch: dict, mels: list[np.ndarray]) -> bool:
    """Every row of tfdata-cached's first batch is its clip's cached mel, zero-padded."""
    rows, lens = batch["mel"].numpy(), batch["mel_lens"].numpy()
    return all(
        lens[i] == len(mel)
        and np.array_equal(rows[i, : len(mel)], mel)
        and not rows[i, len(mel) :].any()
        for i, mel in enumerate(mels[: len(rows)])
    )
