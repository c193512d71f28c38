"""The clips a run is known to skip before its plan is made, from the length table.

A balanced plan gives a group's positions to its clips, several each where the group is
drawn more than its size (balance.py); a clip the run then skips would lose every one of
them, and its group its quota (issue 49: a language of 100 clips drawn 4.3 times got
410 of its 427 positions). What preparation measured already says of some clips that
every run skips them, whatever producer meets them:

- no tokens: a text the producers' own encoder skips (nothing to speak, too many
  unknown characters, longer than text.max_text_len under features.on_too_long: skip),
  or could not encode (shared/corpus/lengths.py: 0 tokens);
- too long or too short by the audio header (producer/audio/decode.py check_duration):
  more than a slot holds under features.on_too_long: skip without silence trimming,
  longer than audio.max_duration_s, shorter than audio.min_duration_s. The header's
  frames are an upper bound of the decoded clip's, within one frame of the producer's
  own sum: a clip one frame over a slot is left to the producer;
- outside its language's speaking-rate band, or the plausibility bound, under
  data.outliers: skip (shared/corpus/speaking_rate.py: the stager marks them at start,
  consumer/stager/outliers.py).

:func:`known_skips` is the mask of those clips; balance.py keeps them out of the groups
(each keeps one position, skipped as before), so the quotas fall to the clips that are
delivered, and `ringfeed validate` prints those quotas. A clip that fails only when a
producer meets it (a corrupt body, silence, a user function's error) cannot be foreseen
here: docs/plans.md#balanced-epochs says what becomes of its other positions.
"""

from __future__ import annotations

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.lengths import Lengths, load_lengths
from ringfeed.shared.corpus.speaking_rate import out_of_band, rate_bands


def known_skips(cfg: Config, index: CorpusIndex) -> np.ndarray | None:
    """bool [n_items]: the clips every run of cfg skips, by the length table (module
    docstring); None where the table is not measured for every item (nothing is known:
    a run that needs the table refuses it, buckets.py length_table)."""
    table, stale = load_lengths(cfg, index)
    if stale.any():
        return None
    skipped = (table.text <= 0) | header_skips(cfg, table)
    if cfg.data.outliers == "skip" and index.has_audio:
        outside = out_of_band(cfg, index, table, rate_bands(cfg, index, table))
        skipped[[o.item for o in outside]] = True
    return skipped


def header_skips(cfg: Config, table: Lengths) -> np.ndarray:
    """bool [n_items]: the clips whose header frames the producers refuse (module
    docstring); an unreadable header (UNKNOWN) is no verdict: another decoder may read it."""
    a, f = cfg.audio, cfg.features
    frames = table.frames
    known = frames > 0
    per_s = a.sample_rate / f.hop_length  # frames a second
    # the producer's sum: 1 + samples // hop; samples <= frames x hop, so a clip of
    # `frames` frames holds fewer than frames x hop samples
    skipped = known & (frames * f.hop_length <= a.min_duration_s * a.sample_rate)
    skipped |= known & (frames - 1 > a.max_duration_s * per_s + 1)
    if f.on_too_long == "skip" and not a.trim_silence:
        skipped |= frames > f.max_frames + 1
    return skipped
