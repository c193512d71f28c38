"""The source hook (RINGFEED_SOURCE_HOOK): how tests and benchmarks inject faults into
producers without a config key. Here in-process; tests/process/test_faults.py drives the same
hook through real producer processes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ringfeed.producer.sources import SyntheticSource, make_source
from ringfeed.shared.config import Config, load_config, replace
from ringfeed.shared.config.environment import SOURCE_HOOK_ENV
from tests.support.configs import write_config
from tests.support.fault_sources import inject_faults

SYNTHETIC = {"data": {"format": "synthetic", "synthetic_items": 8}}


def test_the_hook_wraps_the_source_with_the_faults_of_its_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SOURCE_HOOK_ENV, "")  # whatever inject_faults sets ends with the test
    cfg_path = write_config(tmp_path, SYNTHETIC)
    inject_faults(cfg_path, raise_items=[3], delay_s=0.02)
    cfg = load_config(cfg_path)
    source = make_source(cfg)
    assert source.n_items == 8
    with pytest.raises(ZeroDivisionError, match="item 3"):
        source.prepare(3)
    t0 = time.perf_counter()
    sample = source.prepare(2)
    assert time.perf_counter() - t0 >= 0.02
    assert (sample.tokens == SyntheticSource(cfg).prepare(2).tokens).all()
    # Another config (another test's runs) has no faults, though the hook is still set.
    other = replace(cfg, run_root=str(tmp_path / "other"))
    assert isinstance(make_source(other), SyntheticSource)


def test_without_the_hook_a_producer_runs_its_configs_own_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg_path = write_config(tmp_path, SYNTHETIC)
    monkeypatch.setenv(SOURCE_HOOK_ENV, "")
    inject_faults(cfg_path, raise_items=[3])
    monkeypatch.delenv(SOURCE_HOOK_ENV)
    source = make_source(load_config(cfg_path))
    assert isinstance(source, SyntheticSource)
    assert source.prepare(3).item_id == "synthetic-000003"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("tests.support.fault_sources", "write it as 'package.module:callable'"),
        ("tests.no_such_module:with_faults", "cannot import tests.no_such_module"),
        ("tests.support.fault_sources:no_such_hook", "has no callable no_such_hook"),
    ],
)
def test_a_bad_hook_says_which_variable_and_what_is_wrong(
    spec: str, needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SOURCE_HOOK_ENV, spec)
    cfg = replace(Config(), **SYNTHETIC)
    with pytest.raises(ValueError, match=f"{SOURCE_HOOK_ENV}=.*{needle}"):
        make_source(cfg)


def test_a_hook_given_as_a_file_loads_from_any_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Producers a launcher starts elsewhere (slurm.sh, Ray) cannot import `tests`."""
    hook = tmp_path / "my_hook.py"
    hook.write_text("def wrap(cfg, source):\n    source.wrapped = True\n    return source\n")
    monkeypatch.chdir(tmp_path.parent)
    monkeypatch.setenv(SOURCE_HOOK_ENV, f"{hook}:wrap")
    assert make_source(replace(Config(), **SYNTHETIC)).wrapped
    monkeypatch.setenv(SOURCE_HOOK_ENV, f"{tmp_path / 'missing.py'}:wrap")
    with pytest.raises(ValueError, match="cannot import"):
        make_source(replace(Config(), **SYNTHETIC))
