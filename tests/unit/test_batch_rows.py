"""Batches say which of their rows are real and where each sits in the plan (contract
12): the reserved padding ids (a loop of one's own resuming from a batch's positions
exactly: tests/process/test_batch_rows.py)."""

from __future__ import annotations

import pytest

from ringfeed.shared.config import Config, replace
from ringfeed.shared.config.loader import ConfigError
from ringfeed.shared.run.id_tables import IdTables, check_capacity, padding_ids


def test_padding_rows_take_the_last_id_of_each_table_and_no_name_does() -> None:
    cfg = replace(Config(), data={"max_speakers": 3, "max_languages": 2})
    assert padding_ids(cfg) == (2, 1)
    check_capacity(cfg, IdTables(("ann", "bob"), ("en",)))
    with pytest.raises(ConfigError, match="^data.max_speakers: the run has 3 names"):
        check_capacity(cfg, IdTables(("ann", "bob", "cy"), ("en",)))
    with pytest.raises(ConfigError, match="^data.max_languages: must be >= 2"):
        replace(Config(), data={"max_languages": 1})
