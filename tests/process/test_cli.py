"""The command-line entries a user types first."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.support.paths import REPO
from tests.support.processes import CLI


def ringfeed(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_validate_prints_the_derived_sizes() -> None:
    out = ringfeed("validate", "configs/demo.yaml")
    assert out.returncode == 0, out.stderr
    assert "batch slot" in out.stdout and "rings total" in out.stdout
    assert "[800, 80]" in out.stdout  # the mel field's shape


def test_validate_names_the_key_to_change(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"ring": {"lookahead": -1}}))
    out = ringfeed("validate", str(bad))
    assert out.returncode == 2 and "ring.lookahead" in out.stderr
    huge = tmp_path / "huge.yaml"
    huge.write_text(yaml.safe_dump({"ring": {"lookahead": 100_000}}))
    out = ringfeed("validate", str(huge))
    assert out.returncode == 2 and "/dev/shm" in out.stderr and "ring.lookahead" in out.stderr


def test_validate_checks_the_default_models_kwargs(tmp_path: Path) -> None:
    """model.kwargs is free YAML for any factory; the default model's are checked before
    a run starts, not when the trainer builds the model."""
    for kwargs, key in (({"d_model": 0}, "model.kwargs.d_model"), ({"d_modle": 8}, "d_modle")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump({"model": {"kwargs": kwargs}}))
        out = ringfeed("validate", str(bad))
        assert out.returncode == 2 and key in out.stderr, out.stderr
    from ringfeed.consumer.trainer.model_kwargs import DEFAULT_FACTORY
    from ringfeed.shared.config import Config

    assert Config().model.factory == DEFAULT_FACTORY


@pytest.mark.parametrize(
    "args, says",
    [
        (["--bogus"], "run has no option --bogus"),
        (["--run-id"], "run --run-id needs a value"),
        (["--worker"], "run --worker needs a value"),
        (["--run-id", "../../etc"], "a run id is up to 100 letters"),
    ],
)
def test_the_launcher_refuses_what_it_cannot_run_with_exit_2(args: list[str], says: str) -> None:
    """Nothing starts: an unknown option, an option without its value, a run id that
    would be a path (its directory would land outside run_root)."""
    out = subprocess.run(
        ["bash", "scripts/launch.sh", "run", "configs/demo.yaml", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and says in out.stderr, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "unbound variable" not in out.stderr


def test_launch_help_lists_the_verbs() -> None:
    out = subprocess.run(
        ["bash", "scripts/launch.sh", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0 and "producers CONFIG --connect" in out.stdout


def test_a_wrong_dataset_is_one_line_and_exit_2_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "nowhere.yaml"
    raw = {"data": {"path": str(tmp_path / "no-such-dir")}, "run_root": str(tmp_path)}
    bad.write_text(yaml.safe_dump(raw))
    out = ringfeed("validate", str(bad))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("config error: data.path: no metadata file at")
    t0 = time.monotonic()
    run = ringfeed("run", str(bad), "--run-id", "badpath")
    assert run.returncode == 2 and "data.path" in run.stderr, run.stderr
    assert time.monotonic() - t0 < 15 and "Traceback" not in run.stderr + run.stdout
    assert not list(Path("/dev/shm").glob("ringfeed-badpath-*"))
    assert not (tmp_path / "badpath").exists()  # no run directory either


def test_validate_reads_a_sample_of_the_audio_files(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    (data / "wavs").mkdir(parents=True)
    lines = []
    for i in range(4):
        (data / "wavs" / f"x{i}.wav").write_bytes(b"RIFF but not really a wav file")
        lines.append(f"x{i}|text {i}|text {i}")
    (data / "metadata.csv").write_text("\n".join(lines) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"path": str(data)}, "features": {"cache": False}}))
    out = ringfeed("validate", str(cfg))
    assert out.returncode == 2 and "4 of 4 sampled audio files unreadable" in out.stderr


def test_keys_of_a_non_loopback_endpoint_are_checked(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    tcp = {"kind": "tcp", "host": "0.0.0.0", "keys_dir": str(tmp_path / "keys")}
    cfg.write_text(yaml.safe_dump({"transport": tcp}))
    out = ringfeed("validate", str(cfg))
    assert out.returncode == 2 and "transport.keys_dir" in out.stderr, out.stderr


def test_stager_mels_without_a_gpu_are_a_warning(tmp_path: Path) -> None:
    from ringfeed.consumer.devices import count_gpus

    if count_gpus()[0]:
        pytest.skip("this host has a GPU")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"features": {"device": "stager", "cache": False}}))
    out = ringfeed("validate", str(cfg))
    assert out.returncode == 0, out.stderr
    assert "warning: features.device: stager, but this host has no GPU" in out.stderr
    assert "set features.device: producer" in out.stderr


def test_validate_counts_what_each_rule_skips_and_refuses_a_corpus_of_none(
    tmp_path: Path,
) -> None:
    """Every shipped clip is longer than 100 frames (1.16 s): validate used to say ok and
    the run then skipped for hours. It reads every header, names the rule and the key,
    and exits 2."""
    data = tmp_path / "ds"
    (data / "wavs").mkdir(parents=True)
    shipped = REPO / "data" / "ljspeech-mini"
    lines = (shipped / "metadata.csv").read_text().splitlines()[:3]
    for line in lines:
        name = line.split("|")[0] + ".wav"
        (data / "wavs" / name).write_bytes((shipped / "wavs" / name).read_bytes())
    (data / "metadata.csv").write_text("\n".join(lines) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"data": {"path": str(data)}, "features": {"cache": False, "max_frames": 100}}
        )
    )
    out = ringfeed("validate", str(cfg))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "usable        0 of 3 clips" in out.stdout
    assert "skip        3 longer than a slot (1.16 s): raise features.max_frames" in out.stdout
    assert "none of the 3 clips is usable" in out.stderr
    cfg.write_text(
        yaml.safe_dump(
            {"data": {"path": str(data)}, "features": {"cache": False, "max_frames": 1000}}
        )
    )
    out = ringfeed("validate", str(cfg))
    assert out.returncode == 0 and "usable        3 of 3 clips" in out.stdout, out.stderr


def test_validate_checks_a_producer_hosts_config_by_its_role(tmp_path: Path) -> None:
    """A producer host has the client bundle, not the server's secret: validate used to
    refuse its config (`server.key_secret is missing`). With --role producer it checks
    the client keys and prints the corpus digest the head's validate prints too."""
    assert ringfeed("keys", str(tmp_path / "keys"), "--client", "hostb").returncode == 0
    raw = {
        "data": {"path": str(REPO / "data" / "ljspeech-mini")},
        "features": {"cache": False},
        "transport": {
            "kind": "tcp",
            "host": "10.0.0.5",
            "keys_dir": str(tmp_path / "keys" / "for-hostb"),
        },
    }
    cfg = tmp_path / "producer.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    head = ringfeed("validate", str(cfg))
    assert head.returncode == 2 and "server.key_secret" in head.stderr
    producer = ringfeed("validate", str(cfg), "--role", "producer")
    assert producer.returncode == 0, producer.stderr
    digest = producer.stdout.split("corpus digest ")[1].split()[0]
    assert f"corpus digest {digest}" in ringfeed("validate", "configs/demo.yaml").stdout
    raw["transport"]["keys_dir"] = str(tmp_path / "nowhere")
    cfg.write_text(yaml.safe_dump(raw))
    missing = ringfeed("validate", str(cfg), "--role", "producer")
    assert missing.returncode == 2 and "client.key_secret is missing" in missing.stderr


def test_validate_reads_the_headers_of_clips_inside_tar_shards(tmp_path: Path) -> None:
    """It used to call sf.info on the whole .tar and refuse every shard corpus. Each
    member's header is read from its own bytes; a corrupt member is counted alone."""
    from tests.support.corpora import make_shards

    ids = make_shards(tmp_path / "shards", n_shards=2, corrupt="LJ001-0003")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "data": {"format": "shards", "path": "shards"},
                "features": {"cache": False, "max_frames": 1000},
            }
        )
    )
    out = ringfeed("validate", str(cfg))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"usable        {len(ids) - 1} of {len(ids)} clips" in out.stdout
    assert "skip        1 header unreadable" in out.stdout


def test_validate_says_which_split_of_a_hub_folder_it_reads(tmp_path: Path) -> None:
    """A dataset folder with train and test shards (tests/data/hub, as push_to_hub writes
    them) and no data.split: train is read, and validate says so, with what it found;
    data.split: test reads the test shard alone; a split it lacks lists the ones it has."""
    from tests.support.published import HUB

    def validate(**data: str) -> subprocess.CompletedProcess:
        cfg = tmp_path / "c.yaml"
        features = {"cache": False, "max_frames": 1000, "cache_dir": str(tmp_path / "cache")}
        cfg.write_text(
            yaml.safe_dump(
                {
                    "data": {"format": "parquet", "path": str(HUB), **data},
                    "audio": {"sample_rate": 16000},
                    "features": features,
                }
            )
        )
        return ringfeed("validate", str(cfg))

    out = validate()
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        "  splits        test (1 file), train (2 files): reads train (the default where a "
        "folder holds several; data.split chooses)"
    ) in out.stdout
    assert "corpus        8 clips" in out.stdout and "spk_a (4), spk_b (4)" in out.stdout
    out = validate(split="test")
    assert "reads test (data.split)" in out.stdout and "corpus        2 clips" in out.stdout
    out = validate(split="dev")
    assert out.returncode == 2 and "data.split: no split 'dev' under" in out.stderr
    assert "(its splits: test, train)" in out.stderr


def test_a_producer_host_missing_some_of_the_corpus_files_is_told_before_it_starts(
    tmp_path: Path,
) -> None:
    """Its HELLO's digest matches (same metadata), but each file it lacks would be
    quarantined for the whole run though the head has it."""
    (tmp_path / "wavs").mkdir()
    lines = (REPO / "data" / "ljspeech-mini" / "metadata.csv").read_text().splitlines()[:2]
    name = lines[0].split("|")[0] + ".wav"
    (tmp_path / "wavs" / name).write_bytes(
        (REPO / "data" / "ljspeech-mini" / "wavs" / name).read_bytes()
    )
    (tmp_path / "metadata.csv").write_text("\n".join(lines) + "\n")
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "data": {"path": "."},
                "transport": {"kind": "tcp"},
                "features": {"cache": False, "max_frames": 1000},
            }
        )
    )
    out = ringfeed("validate", str(cfg), "--role", "producer")
    assert out.returncode == 2 and "this host lacks 1 of the corpus's 2 audio files" in out.stderr
    assert "corpus digest" in out.stdout


def test_text_says_when_a_language_has_no_number_rules() -> None:
    out = ringfeed("text", "configs/demo.yaml", "Hello 42", "--language", "xx")
    assert "numbers    kept as digits: 'xx' has no number rules" in out.stdout, out.stdout
    for code in ("en", "de", "fa", "pt-br"):
        out = ringfeed("text", "configs/demo.yaml", "Hallo 42", "--language", code)
        assert "language" in out.stdout and "kept as digits" not in out.stdout, (code, out.stdout)
