"""The ``responses-ledger`` command.

- ``serve``: run the HTTP server (migrates the database on start);
- ``db upgrade|current``: migrate the database / show its revision;
- ``events RESPONSE_ID``: the log as JSON lines (stream events, then audit records);
- ``replay RESPONSE_ID``: re-emit the SSE stream from the log, byte for byte as it was streamed;
- ``keys create|list|revoke``: API keys (see ``app.keys``; a new key is printed once).

Every ``serve`` option also has an environment variable (see ``app.settings``); the command line
wins.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
from typing import Any

from app.engines.vllm import ENGINE_OPTION_FLAGS, ENGINE_OPTION_NAMES, add_engine_arguments
from app.settings import ENGINES, Settings, SettingsError
from app.startup import DATABASE_ERRORS, StartupError, check_database_url, database_unreachable

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="responses-ledger", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP server")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--database-url", help="default sqlite+aiosqlite:///./data/responses.db")
    serve.add_argument("--engine", choices=ENGINES)
    serve.add_argument("--script", help="the scripted engine's JSON file")
    serve.add_argument("--commit-window-ms", type=float)
    serve.add_argument("--log-level")
    serve.add_argument(
        "--frontends",
        type=int,
        help="frontend processes on the one port over one engine (default 1)",
    )
    # --model, --served-model-name and the vLLM engine options (vllm is imported only when the
    # vllm engine starts, so this works without it installed)
    add_engine_arguments(serve)

    db = sub.add_parser("db", help="database migrations")
    db.add_argument("action", choices=["upgrade", "current"])
    db.add_argument("--database-url")

    for name, text in (
        ("events", "print a response's log as JSON lines"),
        ("replay", "re-emit a response's SSE stream from its log"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("response_id")
        cmd.add_argument("--database-url")

    keys = sub.add_parser("keys", help="API keys and their projects")
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser(
        "create", help="make a key and print it (once: only its hash is kept)"
    )
    create.add_argument("--project", required=True)
    create.add_argument("--role", choices=["admin", "member"], default="member")
    create.add_argument("--name", help="a label to recognise the key by")
    create.add_argument(
        "--max-streams", type=int, help="concurrent streams allowed (default: no limit)"
    )
    create.add_argument("--rpm", type=int, help="requests per minute allowed (default: no limit)")
    listing = actions.add_parser("list", help="the keys, without secrets, as JSON lines")
    listing.add_argument("--project")
    revoke = actions.add_parser("revoke", help="revoke a key by its id (key_...)")
    revoke.add_argument("key_id")
    for action in (create, listing, revoke):
        action.add_argument("--database-url")
    return parser


def _serve(args: argparse.Namespace) -> None:
    from app import logs, transport
    from app.main import create_app

    engine_options = {
        name: getattr(args, name)
        for name in ENGINE_OPTION_NAMES
        if name not in ("model", "served_model_names") and getattr(args, name, None) is not None
    }
    served = args.served_model_names
    if served:
        served = [name.strip() for item in served for name in item.split(",") if name.strip()]
    settings = Settings.from_env(
        serving=True,
        host=args.host,
        port=args.port,
        database_url=args.database_url,
        engine=args.engine,
        script=args.script,
        model=args.model,
        served_model_names=tuple(served) if served else None,
        commit_window_ms=args.commit_window_ms,
        log_level=args.log_level,
        frontends=args.frontends,
        engine_options=engine_options or None,
    )
    check_database_url(settings.database_url)
    # an option of another engine than the one that runs would be ignored
    others = ["--script"] if args.script and settings.engine != "scripted" else []
    if settings.engine != "vllm":
        others += [ENGINE_OPTION_FLAGS[name] for name in engine_options]
    if others:
        raise SettingsError(
            f"{', '.join(others)}: not an option of the {settings.engine} engine, which this"
            " server runs (--engine)"
        )
    logs.configure(settings.log_level, settings.log_format)
    for variable in settings.unused_variables():
        logging.getLogger("app.cli").warning(
            "%s is set, and the %s engine runs: it is not used", variable, settings.engine
        )
    if settings.frontends != 1:
        from app import frontends

        sys.exit(frontends.serve(settings))
    app = create_app(settings)
    transport.run(app, settings)


async def _open(url: str) -> Any:
    from persistence.sql import open_store

    return await open_store(url)


async def _events(response_id: str, url: str, *, replay: bool) -> int:
    from app.audit_log import log_lines
    from app.live import stored_frames

    store = await _open(url)
    try:
        if await store.get(response_id) is None:
            print(f"no response {response_id}", file=sys.stderr)
            return 1
        events = await store.load(response_id)
        out = sys.stdout.buffer
        if replay:
            out.write(stored_frames(events))
        else:
            out.writelines(log_lines(events, await store.load_audit(response_id)))
        out.flush()
        return 0
    finally:
        await store.close()


async def _keys(args: argparse.Namespace, url: str) -> int:
    from app.keys import create_key

    store = await _open(url)
    try:
        if args.action == "create":
            try:
                row, key = await create_key(
                    store,
                    project=args.project,
                    role=args.role,
                    name=args.name,
                    max_streams=args.max_streams,
                    requests_per_minute=args.rpm,
                )
            except ValueError as exc:
                print(f"keys create: {exc}", file=sys.stderr)
                return 2
            print(key)
            print(
                f"{row.id} ({row.role} of project {row.project}): keep the key above, it is not "
                "shown again",
                file=sys.stderr,
            )
            return 0
        if args.action == "list":
            for row in await store.list_api_keys():
                if args.project is None or row.project == args.project:
                    shown = {k: v for k, v in dataclasses.asdict(row).items() if k != "secret_hash"}
                    print(json.dumps(shown))
            return 0
        if await store.revoke_api_key(args.key_id):
            print(f"revoked {args.key_id}")
            return 0
        print(f"no unrevoked key {args.key_id}", file=sys.stderr)
        return 1
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    """The command's exit status: 0, or 2 for a setting that cannot be used (said in one line,
    before anything starts), 3 for a server that could not start (``app.startup``)."""
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (SettingsError, StartupError) as exc:
        print(f"responses-ledger: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, SettingsError) else 3


def _run(args: argparse.Namespace) -> int:
    if args.command == "serve":
        _serve(args)
        return 0
    url = Settings.from_env(database_url=args.database_url).database_url
    check_database_url(url)
    try:
        if args.command == "db":
            from persistence import migrate

            if args.action == "upgrade":
                migrate.upgrade(url)
            print(migrate.current(url) or "(empty)")
            return 0
        if args.command == "keys":
            return asyncio.run(_keys(args, url))
        return asyncio.run(_events(args.response_id, url, replay=args.command == "replay"))
    except DATABASE_ERRORS as exc:  # as ``serve`` says it: one line, the password hidden
        if isinstance(exc, BrokenPipeError):  # (its output's reader left: not the database)
            raise
        raise database_unreachable(url, exc) from exc


if __name__ == "__main__":
    raise SystemExit(main())
