"""``python -m bench``: the throughput benchmark of issue 9 (see ``bench/harness.py``).

    python -m bench run                                  # everything available, full matrix
    python -m bench run --concurrency 1,16 --reps 1 --tokens 200     # a quick look
    python -m bench run --target naive --target naive-c16 --write-results
    python -m bench run --rounds 3 --reps 1 --concurrency 256 --token-delay-ms 10 --tokens 200
                                                         # ratios paired round by round (a noisy VM)
    python -m bench run --profile /tmp/prof --target naive --target ledger-postgres --concurrency 256 \
        --token-delay-ms 10 --tokens 200 --reps 1     # where each server's CPU goes (bench.cpu_split)
    python -m bench run --sample /tmp/samples ...        # the same, sampled by py-spy, in the
                                                         # server's own µs a token (bench.samples)
    python -m bench targets                              # what can run here, and why not

Each server's workdir (SQLite's database among it) is made under ``$TMPDIR``, and the
PostgreSQL target uses the cluster on port ``$BENCH_POSTGRES_PORT`` (default 5432): ``TMPDIR=/dev/shm``
and a cluster of one's own on a RAM disk take the disk's flushes out of the figures.
``$BENCH_POSTGRES_SOCKET`` (a directory) reaches that cluster over its Unix socket there.

The load generator and the naive peer also run on their own: ``python -m bench.loadgen --help``,
``python -m bench.naive --help``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from bench import cpu_split, samples, turns
from bench.harness import (
    MatrixConfig,
    machine_info,
    render_markdown,
    render_table,
    run_matrix,
    summarize,
    to_json,
)
from bench.targets import DEFAULT_SELECTION, default_targets

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def _cpus(text: str) -> str | None:
    return None if text.lower() in ("", "none", "no") else text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the benchmark matrix and print a markdown table")
    names = [t.name for t in default_targets()]
    run.add_argument(
        "--target",
        action="append",
        choices=names,
        dest="targets",
        help=f"repeatable; default: {', '.join(DEFAULT_SELECTION)} (when available)",
    )
    run.add_argument(
        "--concurrency",
        type=_ints,
        default=(1, 16, 64, 256),
        help="comma-separated stream counts (default 1,16,64,256)",
    )
    run.add_argument("--reps", type=int, default=3, help="measured runs per cell (median)")
    run.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the whole matrix this many times, every cell in turn with a fresh server "
        "(a slow spell of a shared machine then hits every target of a round); the ratio is "
        "then the median of each round's ratio to the naive peer",
    )
    run.add_argument("--tokens", type=int, default=1000, help="output tokens per stream")
    run.add_argument(
        "--token-delay-ms",
        type=float,
        default=0.0,
        help="pace the engines (the ledger's scripted engine and the naive peer): one token per stream per step of this many ms, all streams stepping together (default 0: as fast as they can)",
    )
    run.add_argument(
        "--total-tokens",
        type=int,
        default=400_000,
        help="about this many tokens per run (each of the C workers runs "
        "ceil(total / (C * tokens)) streams, at least one)",
    )
    run.add_argument(
        "--max-run-seconds",
        type=float,
        default=20.0,
        help="a run stops starting new streams after this long (0: never); default 20",
    )
    run.add_argument(
        "--no-latency",
        action="store_true",
        help="do not ask servers for token times (no latency figures)",
    )
    run.add_argument("--server-cpus", type=_cpus, default="0", help="taskset list, or 'none'")
    run.add_argument("--loadgen-cpus", type=_cpus, default="1", help="taskset list, or 'none'")
    run.add_argument("--loadgen-loop", default="auto", choices=["auto", "asyncio", "uvloop"])
    run.add_argument(
        "--nice",
        type=int,
        default=None,
        help="run the server and load generator at this nice value (e.g. -20 as root, on a "
        "shared machine)",
    )
    run.add_argument("--no-warmup", action="store_true")
    run.add_argument(
        "--history",
        type=int,
        default=0,
        help="the ledger's database holds this many finished responses (ANALYZE-d) before its "
        "server starts: the costs that grow with what a server in service has stored",
    )
    run.add_argument(
        "--stagger",
        action="store_true",
        help="paced runs: spread the streams' starts over one stream's duration (tokens x "
        "token-delay-ms), so they end and start one by one as on a live server rather than all "
        "together; tokens/s then includes the ramp, so read the latency",
    )
    run.add_argument(
        "--open-loop",
        action="store_true",
        help="paced runs: the streams arrive as a Poisson process, C a stream's duration (C in "
        "flight on average), whatever the server's pace, as a public service's requests do; a "
        "server that falls behind then holds more streams. The latency counts the streams "
        "after the first duration (the run starts empty)",
    )
    run.add_argument(
        "--quiet-timeout",
        type=float,
        default=30.0,
        help="wait up to this long for an idle machine before each run",
    )
    run.add_argument("--startup-timeout", type=float, default=120.0)
    run.add_argument("--keep-workdirs", action="store_true", help="keep server logs and databases")
    run.add_argument("--json", type=Path, help="also write every run and summary as JSON here")
    run.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="profile each measured run's server under cProfile (its CPU figures are then "
        "inflated), keep the profiles in DIR and print where the CPU went (bench.cpu_split)",
    )
    run.add_argument(
        "--sample",
        type=Path,
        metavar="DIR",
        help="sample each measured run's server with py-spy (its figures stay its own), keep "
        "the stacks in DIR and print where the CPU went, in µs a token (bench.samples)",
    )
    run.add_argument(
        "--turns",
        type=Path,
        metavar="DIR",
        help="time each measured run's event-loop turns and group commits in the server (on "
        "asyncio's loop, not uvloop), keep them in DIR with the deltas' latency and print where "
        "the slow deltas were (bench.turns)",
    )
    run.add_argument(
        "--write-results",
        nargs="?",
        type=Path,
        const=RESULTS,
        default=None,
        metavar="PATH",
        help=f"write the report to PATH (default {RESULTS.name})",
    )
    sub.add_parser("targets", help="list the targets and whether they can run here")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "run" and args.stagger and not args.token_delay_ms:
        parser.error(
            "--stagger needs --token-delay-ms: only a paced stream has a duration to spread the starts over"
        )
    if args.command == "run" and args.open_loop and not args.token_delay_ms:
        parser.error(
            "--open-loop needs --token-delay-ms: the arrival rate is C a paced stream's duration"
        )
    if args.command == "run" and args.open_loop and args.stagger:
        parser.error("--open-loop and --stagger: one or the other (an open loop has no workers)")
    if args.command == "run":
        # --profile and --turns run the server under a wrapper (cProfile; asyncio's loop instead
        # of uvloop, and timers): what another of the three would then measure is the wrapper
        keepers = {"--profile": args.profile, "--sample": args.sample, "--turns": args.turns}
        given = [flag for flag, directory in keepers.items() if directory is not None]
        if len(given) > 1:
            parser.error(
                f"{' and '.join(given)}: one at a time (each changes what the other measures)"
            )
    if args.command == "run" and (args.rounds < 1 or args.reps < 1):
        parser.error("--rounds and --reps take 1 or more")
    targets = default_targets()
    if args.command == "targets":
        for t in targets:
            reason = t.unavailable()
            print(
                f"{t.name:16} {'ok' if not reason else 'unavailable: ' + reason}\n"
                f"{'':16} {t.description}"
            )
        return 0

    wanted = args.targets or list(DEFAULT_SELECTION)
    selected = [t for t in targets if t.name in wanted]
    config = MatrixConfig(
        concurrency=args.concurrency,
        reps=args.reps,
        rounds=args.rounds,
        tokens=args.tokens,
        token_delay_ms=args.token_delay_ms,
        total_tokens=args.total_tokens,
        max_run_seconds=args.max_run_seconds or None,
        latency=not args.no_latency,
        server_cpus=args.server_cpus,
        loadgen_cpus=args.loadgen_cpus,
        loadgen_loop=args.loadgen_loop,
        nice=args.nice,
        startup_timeout_s=args.startup_timeout,
        quiet_timeout_s=args.quiet_timeout,
        warmup=not args.no_warmup,
        stagger=args.stagger,
        open_loop=args.open_loop,
        keep_workdirs=args.keep_workdirs,
        profile_dir=args.profile,
        sample_dir=args.sample,
        turns_dir=args.turns,
        history=args.history,
    )
    command = shlex.join(["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)])
    results = run_matrix(selected, config)
    summaries = summarize(results)
    info = machine_info()
    print(render_table(summaries))
    for module, directory in (
        (cpu_split, args.profile),
        (samples, args.sample),
        (turns, args.turns),
    ):
        kept = module.load_dir(directory) if directory is not None else []
        if kept:
            print()
            print(module.render(kept))
    if args.json:
        args.json.write_text(to_json(results, summaries, config, command, info))
    if args.write_results:
        ran = [t for t in selected if any(s.target == t.name for s in summaries)]
        args.write_results.write_text(render_markdown(summaries, config, command, ran, info))
        print(f"wrote {args.write_results}", file=sys.stderr)
    failed = any(s.failure or s.errors for s in summaries)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
