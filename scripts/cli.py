"""`ringfeed`: the command-line entries. Thin: each verb calls one process entry.
ringfeed prepare CONFIG                  write all a run reads about its corpus (run does first)
ringfeed validate CONFIG [--deep]        prepare, check a config, print derived sizes and the corpus
ringfeed run [CONFIG] [--run-id R]       prepare, then stager + producers + trainer (or drain)
    [--trainer tf|torch|jax] [-- COMMAND]  ... the example trainer of a framework, or yours
    [--worker K/N --cluster H:P,...]     ... as worker K of N training workers (run id R-wK)
ringfeed stager CONFIG --run-id R        the data process
ringfeed producers CONFIG --run-id R     a pool of producer processes (--ray ADDRESS: on Ray)
ringfeed trainer CONFIG --run-id R       the model process (--new-plan: resume a changed plan)
ringfeed drain CONFIG --run-id R         a consumer without a model (transport runs)
ringfeed inspect [--run-id R] [--json]   the ring inspector (--record F, --plot P --from F)
ringfeed index CONFIG                    prepare's index alone (with its id tables)
ringfeed lengths CONFIG                  prepare's lengths alone (buckets, rate bands)
ringfeed stats CONFIG [--workers N]      prepare's per-speaker pitch and energy statistics alone
ringfeed vocab CONFIG [--min-count N]    the corpus's characters (or phonemes): text.alphabet
ringfeed text CONFIG "TEXT" [--language L]  what the producers make of a text
ringfeed config [--write]                every config key: type, default, meaning
ringfeed quarantine CONFIG --run-id R    a run's quarantine by stage and cause (--clear STAGE)
ringfeed keys DIR --client NAME          CURVE keys for a producer host
ringfeed cleanup [--run-id R]            remove segments of dead runs
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time
import uuid
from pathlib import Path

from ringfeed.producer.process.threads import math_thread_env

if sys.argv[1:2] in (
    ["producers"],
    ["stager"],
):  # the pool forks workers (producer/process/pool.py);
    os.environ.update(math_thread_env(1))  # the stager has no BLAS work: pools only cost CPU

from ringfeed.scripts.cli_data import (  # noqa: E402 - after the environment above
    _config,
    add_data_verbs,
    cmd_validate,
    run_id_arg,
)
from ringfeed.shared.config.environment import code_root  # noqa: E402

# ringfeed/configs links to configs/ in a checkout, and holds its files in a wheel.
DEMO_CONFIG = code_root() / "ringfeed" / "configs" / "demo.yaml"


def cmd_run(args: argparse.Namespace) -> int:
    """A whole run on this host, watched until it ends (scripts/launch.sh calls this)."""
    from ringfeed.scripts.runner import Run
    from ringfeed.shared.run.process import StopFlag

    if cmd_validate(args, quiet=True) != 0:
        return 2  # the finding said what to change; nothing was started
    ours = args.consumer == "trainer" and not args.command  # a trainer of ours: --cluster
    share, worker_args = _worker(args, needs_cluster=ours)
    if args.worker and (not args.run_id or args.consumer == "drain"):
        print(
            "config error: --worker needs --run-id (the same on every worker) and a "
            "model process (a trainer, your command, or --consumer none)",
            file=sys.stderr,
        )
        return 2
    run_id = share.run_id(args.run_id or new_run_id())
    stop = StopFlag().install()
    from ringfeed.shared.config import load_config
    from ringfeed.shared.config.environment import run_dir

    directory = run_dir(load_config(args.config), run_id).absolute()
    resumes = directory.is_dir()  # a relaunch with its run id resumes it
    print(
        f"launch: run {run_id} with {args.config}, in {directory}"
        + (" (exists: this run resumes)" if resumes else "")
    )
    print(f"launch: watch it with {ringfeed_command()} inspect --run-id {run_id}")
    if args.consumer == "none":
        print(
            f"launch: the data side only: consume it with RingLoader({args.config!r}, "
            f"{args.run_id or run_id!r}) (ringfeed.torch, ringfeed.jax) or ring_dataset("
            f"load_config({args.config!r}), {run_id!r}) (TensorFlow); it ends when that "
            "consumer reaches the end of the plan (stager.epochs), or on Ctrl-C"
        )
    new_plan = ["--new-plan"] if args.new_plan else []
    trainer = ["--trainer", args.trainer]
    args.started = time.time()  # a command's checkpoint is a file written since
    with Run(Path(args.config), run_id) as run:
        run.prepares = False  # validate, above, prepared the corpus
        run.verb_args = {"stager": worker_args[:2], "trainer": worker_args + new_plan + trainer}
        run.start_all("none" if args.command else args.consumer)
        if args.command:  # the user's own model process (docs/loaders.md)
            run.start_command(args.command, share)
        code = run.watch(stop)
    if stop.is_set() and code in (0, *STOPPED_CODES):
        print(stopped_line(args, run_id, directory), file=sys.stderr)
        return 0  # stopped as asked, the steps kept: not a failure
    if stop.is_set():
        print(
            f"launch: stopped run {run_id}, but {run.failure[0]} exited with code {code}",
            file=sys.stderr,
        )
    elif run.failure is not None:
        print(f"launch: {run.failure[0]} exited with code {code}", file=sys.stderr)
    return code


# Exit codes of a process ended by the launcher's own stop: SIGINT and SIGTERM, shell style.
STOPPED_CODES = (130, 143)


def ringfeed_command() -> str:
    """This installation's `ringfeed`, whole, to paste anywhere (a wheel has no launch.sh):
    the console script beside this interpreter (a virtual environment's), else this
    interpreter with -m (pip --user or --target put the script elsewhere)."""
    script = Path(sys.executable).with_name("ringfeed")
    if script.is_file():
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m ringfeed.scripts.cli"


def stopped_line(args: argparse.Namespace, run_id: str, directory: Path) -> str:
    """What a stop says: where the run's last checkpoint is and the command that resumes
    it (the same command with the run id: a relaunch resumes, docs/running.md)."""
    steps = sorted(
        (int(p.stem.split("-")[-1]), p) for p in (directory / "checkpoints").glob("ckpt-*.json")
    )
    where = f"its last checkpoint is {steps[-1][1].with_suffix('')}" if steps else "no checkpoint"
    if args.command:  # the user's loop writes its checkpoints where it likes
        where = command_checkpoint(Path.cwd(), getattr(args, "started", 0.0), directory)
    # From where it was started: runs/ is found from the working directory.
    config = shlex.quote(str(Path(args.config).absolute()))
    command = (
        f"cd {shlex.quote(os.getcwd())} && {ringfeed_command()} run {config} "
        f"--run-id {args.run_id or run_id}"
    )
    if args.worker:
        command += f" --worker {args.worker} --cluster {args.cluster}"
    if args.consumer != "trainer":
        command += f" --consumer {args.consumer}"
    if args.trainer != "tf":
        command += f" --trainer {args.trainer}"
    if args.command:
        command += f" -- {shlex.join(args.command)}"
    return f"launch: stopped run {run_id}; {where}; resume it with: {command}"


# What a checkpoint a training command writes is called: a file with one of these
# suffixes, or a file or folder (orbax's) whose name holds one of these words.
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors", ".npz", ".pkl", ".bin")
CHECKPOINT_WORDS = ("ckpt", "checkpoint")
# Entries of the working directory looked at, at most: a stop must not walk a corpus.
CHECKPOINT_SCAN_LIMIT = 20_000


def command_checkpoint(root: Path, since: float, run_directory: Path) -> str:
    """What a stop says of the checkpoint the user's command wrote: the newest file or
    folder under root (its working directory) written since `since` whose name is a
    checkpoint's (CHECKPOINT_SUFFIXES, CHECKPOINT_WORDS), or that none was; hidden
    folders, the virtual environment and the runs' own folders are passed over."""
    newest: tuple[float, Path] | None = None
    seen = 0
    runs = run_directory.parent.resolve()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".") and d != "__pycache__" and Path(folder, d).resolve() != runs
        ]
        for name in [*files, *dirs]:
            seen += 1
            lower = name.lower()
            if not (
                lower.endswith(CHECKPOINT_SUFFIXES) or any(w in lower for w in CHECKPOINT_WORDS)
            ):
                continue
            path = Path(folder, name)
            try:
                mtime = path.stat().st_mtime
            except OSError:  # removed while we looked
                continue
            if mtime >= since and (newest is None or mtime > newest[0]):
                newest = (mtime, path)
        if seen > CHECKPOINT_SCAN_LIMIT:
            break
    if newest is None:
        return (
            f"your command wrote no checkpoint under {root} since it started (looked for "
            f"{', '.join('*' + s for s in CHECKPOINT_SUFFIXES)} and names with "
            f"{' or '.join(CHECKPOINT_WORDS)})"
        )
    return f"the checkpoint your command wrote last is {newest[1]}"


def _worker(args: argparse.Namespace, needs_cluster: bool = True):
    """(Share, the arguments that pass it on to the stager and the trainer) of
    --worker K/N and --cluster; exits 2 when they are malformed (needs_cluster: a
    trainer of ours joins the others at --cluster's addresses)."""
    from ringfeed.shared.config import ConfigError
    from ringfeed.shared.run.share import ONE_WORKER, Share

    if not getattr(args, "worker", ""):
        return ONE_WORKER, []
    try:
        share = Share.parse(args.worker)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        sys.exit(2)
    cluster = [c for c in getattr(args, "cluster", "").split(",") if c]
    if len(cluster) != share.count and hasattr(args, "cluster") and needs_cluster:
        print(
            f"config error: --cluster names {len(cluster)} workers but --worker says "
            f"{share.count}: give every worker's host:port, in order",
            file=sys.stderr,
        )
        sys.exit(2)
    return share, ["--worker", args.worker, "--cluster", ",".join(cluster)]


def cmd_stager(args: argparse.Namespace) -> int:
    from ringfeed.consumer.stager.stager import main  # a framework: devices.stager_mel_fn

    return main(_config(args.config), args.run_id, _worker(args)[0])


def cmd_producers(args: argparse.Namespace) -> int:
    from ringfeed.producer.process.pool import main
    from ringfeed.shared.config.environment import endpoints

    cfg = _config(args.config)
    if (refused := _unprepared(cfg)) is not None:
        return refused
    if args.ray:
        from ringfeed.producer.process.ray_pool import main as ray_main

        return ray_main(cfg, args.ray, args.connect)
    endpoint = args.connect or endpoints(cfg, args.run_id).control
    workers = args.workers or cfg.producers.workers
    return main(cfg, endpoint, workers, remote=args.remote, prefix=args.name)


def _unprepared(cfg) -> int | None:
    """2, with the line that says what to run, when this host's corpus is not prepared:
    no producer prepares it (each would fail alike); None when it is."""
    from ringfeed.shared.config import ConfigError
    from ringfeed.shared.corpus.open import open_prepared

    try:
        open_prepared(cfg)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    return None


def cmd_trainer(args: argparse.Namespace) -> int:
    share, worker_args = _worker(args)
    cluster = tuple(worker_args[3].split(",")) if worker_args else ()
    if args.trainer != "tf":  # the PyTorch or JAX example trainer (docs/loaders.md)
        from ringfeed.consumer.trainer.model_loop import main as example_main

        return example_main(args.trainer, _config(args.config), args.run_id, args.new_plan, share)
    from ringfeed.consumer.devices import quiet_tensorflow

    quiet_tensorflow()  # before the trainer's modules import TensorFlow
    from ringfeed.consumer.trainer.trainer import main

    code = main(_config(args.config), args.run_id, args.new_plan, share, cluster)
    # Its checkpoint, summary and event files are written and closed (trainer.py
    # teardown): what is left is the interpreter's teardown of TensorFlow, 4-6 s of CPU
    # that a stopped run waited for, past the launcher's grace on a loaded host.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cmd_drain(args: argparse.Namespace) -> int:
    """A consumer without a model: frees each batch, optionally after --step-s; 1 if the
    stager refused it (another consumer holds the run)."""
    from ringfeed.consumer.client.batch_client import BatchClient, StagerGone, StagerRefused
    from ringfeed.shared.run.process import StopFlag

    cfg = _config(args.config)
    stop = StopFlag().install()
    client = BatchClient(cfg, args.run_id, name="drain")
    n, t0, finished = 0, time.monotonic(), False
    try:
        client.connect(timeout_s=60, stop=stop.is_set)
        while not stop.is_set() and (args.batches == 0 or n < args.batches):
            t_wait = time.monotonic()
            try:
                batch = client.next(timeout_s=1.0)
            except TimeoutError:
                continue
            wait_s = time.monotonic() - t_wait
            if batch is None:
                break
            rows, frames = batch.meta.n_valid, int(batch.arrays["mel_lens"].sum())
            client.free(batch)
            time.sleep(args.step_s)  # stands in for a train step
            client.step_stats(n, time.monotonic() - t_wait - wait_s, wait_s, 0.0, rows, frames)
            n += 1
        finished = not stop.is_set()
    except StagerRefused as exc:
        print(f"drain: {exc}", file=sys.stderr)
        return 1
    except StagerGone as exc:
        print(f"drain: {exc}", file=sys.stderr)
    finally:
        client.close(finished=finished)
    dt = time.monotonic() - t0
    rate = n * cfg.stager.batch_size / max(dt, 1e-9)
    print(f"drained {n} batches of {cfg.stager.batch_size} in {dt:.1f} s ({rate:.0f} samples/s)")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from ringfeed.consumer.tools.inspector import main

    return main(
        args.run_id,
        as_json=args.json,
        interval_s=args.interval,
        record=args.record or None,
        plot=args.plot or None,
        recording=args.recording or None,
        config_path=args.config or None,
        log_path=args.log,
    )


def cmd_keys(args: argparse.Namespace) -> int:
    from ringfeed.shared.wire.keys import generate

    bundle = generate(Path(args.dir), args.client)
    print(f"keys in {args.dir}: the stager accepts producer '{args.client}'.")
    print(f"copy {bundle}/ to the producer host and set transport.keys_dir to it there;")
    print(f"on this host set transport.keys_dir: {args.dir}")
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    from ringfeed.shared.memory.segments import remove_dead_sockets, remove_stale_segments
    from ringfeed.shared.run.run_secret import remove_dead_run_records

    removed = remove_stale_segments(args.run_id or None)
    sockets = remove_dead_sockets(args.run_id or None)
    records = remove_dead_run_records(args.run_id or None)
    if not args.run_id:  # what preparation kept in memory when its disk was full
        from ringfeed.shared.corpus.memory_copies import memory_folder, remove_memory_copies

        if kept := remove_memory_copies():
            print(f"removed {len(kept)} prepared file(s) kept in {memory_folder()}")
    print(
        f"removed {len(removed)} stale segment(s)" + (f": {' '.join(removed)}" if removed else "")
    )
    print(
        f"removed {len(sockets)} dead socket file(s)"
        + (f": {' '.join(sockets)}" if sockets else "")
    )
    print(
        f"removed {len(records)} record(s) of stagers gone"
        + (f": {' '.join(records)}" if records else "")
    )
    return 0


class _Unbuilt:
    """Takes a verb's arguments in place of the parser not built for it (build_parser)."""

    def add_argument(self, *args: object, **kwargs: object) -> None:
        pass


def build_parser(named: str | None = None) -> argparse.ArgumentParser:
    """The command line; with `named` (argv's first word) only that verb's parser is
    built when it is a verb: each costs ~0.7 ms (gettext), all ~12 ms of every
    process's start (benchmarks/first_batch.py). Otherwise (help, a typo) all are."""
    parser = argparse.ArgumentParser(
        prog="ringfeed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub, built = parser.add_subparsers(dest="verb", required=True), []

    def verb(name: str, fn, needs_run: bool = True) -> argparse.ArgumentParser:
        if named is not None and name != named:
            return _Unbuilt()  # type: ignore[return-value] - only add_argument is called
        p = sub.add_parser(name)
        p.set_defaults(fn=fn)
        built.append(name)
        if needs_run:
            p.add_argument("config")
            p.add_argument("--run-id", required=True, type=run_id_arg)
        return p

    add_data_verbs(lambda name, fn: verb(name, fn, needs_run=False))
    add_run_verb(verb("run", cmd_run, needs_run=False))
    verb("stager", cmd_stager).add_argument("--worker", default="", help="serve share K/N")
    pr = verb("producers", cmd_producers)
    pr.add_argument("--workers", type=int, default=0, help="default: producers.workers")
    pr.add_argument("--connect", default="", help="the head's control endpoint (remote hosts)")
    pr.add_argument("--remote", action="store_true", help="send payloads over the socket")
    pr.add_argument("--name", default="", help="producer name prefix (default: host name)")
    pr.add_argument(
        "--ray", default="", metavar="ADDRESS", help="producers as Ray actors (with --connect)"
    )
    t = verb("trainer", cmd_trainer)
    t.add_argument(
        "--new-plan",
        action="store_true",
        help="if the dataset, seed or buckets changed since the checkpoint, start a new "
        "plan at its next epoch instead of refusing to resume",
    )
    add_worker_options(t)
    add_trainer_option(t)
    d = verb("drain", cmd_drain)
    d.add_argument("--batches", type=int, default=0, help="0: until the plan ends")
    d.add_argument("--step-s", type=float, default=0.0, help="pretend each batch takes this long")
    add_inspect_options(verb("inspect", cmd_inspect, needs_run=False))
    k = verb("keys", cmd_keys, needs_run=False)
    k.add_argument("dir", help="keys directory of the head host")
    k.add_argument("--client", required=True, help="name of the producer host to authorize")
    cleanup = verb("cleanup", cmd_cleanup, needs_run=False)
    cleanup.add_argument("--run-id", default="", type=run_id_arg)
    return parser if built or named is None else build_parser()


def add_run_verb(r: argparse.ArgumentParser) -> None:
    """`ringfeed run`: the whole run on this host (scripts/launch.sh run calls it)."""
    r.usage = "ringfeed run [CONFIG] [options] [-- COMMAND ...]"
    r.epilog = (
        "-- COMMAND ...: your own training command is the model process, in place of the "
        "trainer (e.g. -- python train.py); its ringfeed.torch or ringfeed.jax loader, or "
        "ring_dataset, finds the run in RINGFEED_CONFIG and RINGFEED_RUN_ID "
        "(docs/loaders.md#three-ways-to-run-the-model-process)"
    )
    r.add_argument("config", nargs="?", default=str(DEMO_CONFIG))
    r.add_argument(
        "--run-id", default="", type=run_id_arg, help="default: a new id; an old id resumes it"
    )
    r.add_argument(
        "--consumer",
        choices=("trainer", "drain", "none"),
        default="trainer",
        help="none: only the data side, for your own loop (docs/running.md#the-data-side-alone)",
    )
    r.add_argument(
        "--new-plan",
        action="store_true",
        help="the trainer's --new-plan: resume after the corpus, seed or buckets changed, "
        "with a new plan from the checkpoint's next epoch",
    )
    add_worker_options(r)
    add_trainer_option(r)


def add_trainer_option(p: argparse.ArgumentParser) -> None:
    what = "the model process: TensorFlow's, or the PyTorch or JAX example"
    p.add_argument("--trainer", choices=("tf", "torch", "jax"), default="tf", help=what)


def add_worker_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--worker",
        default="",
        metavar="K/N",
        help="this host is training worker K of N (MultiWorkerMirroredStrategy)",
    )
    p.add_argument(
        "--cluster",
        default="",
        metavar="HOST:PORT,...",
        help="every worker's trainer address, in worker order (with --worker)",
    )


def add_inspect_options(i: argparse.ArgumentParser) -> None:
    i.add_argument("--run-id", default="", type=run_id_arg, help="default: the newest live run")
    i.add_argument("--json", action="store_true", help="print one snapshot as JSON and exit")
    i.add_argument("--interval", type=float, default=1.0, help="refresh period, seconds")
    i.add_argument("--record", default="", help="append one JSON snapshot per refresh (jsonl)")
    i.add_argument("--plot", default="", help="render a timeline PNG of --from RECORDING")
    i.add_argument("--from", dest="recording", default="", help="a --record jsonl file")
    i.add_argument(
        "--config",
        default="",
        help="the run's config (ring.lease_s); default: runs/<run-id>/config.yaml",
    )
    i.add_argument(
        "--log",
        default="",
        help="show the last lines of this log file under the screen (launch.sh run --inspect)",
    )


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]


def main(argv: list[str] | None = None) -> int:
    from ringfeed.shared.run.process import setup_logging

    argv = sys.argv[1:] if argv is None else argv
    # `ringfeed run CONFIG -- COMMAND...`: the user's command is the model process.
    split = argv.index("--") if argv[:1] == ["run"] and "--" in argv else len(argv)
    argv, command = argv[:split], argv[split + 1 :]
    args, unknown = build_parser(argv[0] if argv else None).parse_known_args(argv)
    if unknown:  # refused by the whole command line, whose usage names every verb
        args = build_parser().parse_args(argv)
    args.command = command
    setup_logging()
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
