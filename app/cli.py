"""The ``ttc`` command line (typer). Each sub-command's help says what it does and its defaults."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

HELP_SETTINGS = {"max_content_width": 120}
"""Help is plain text (no rich panels, which cut defaults short at 80 columns), wrapped to the
terminal, at most 120 columns wide; every sub-command inherits it."""

app = typer.Typer(
    help="ttc: a test-time compute allocation service for LLMs (OpenAI-compatible gateway over vLLM).",
    no_args_is_help=True, add_completion=False, rich_markup_mode=None, context_settings=HELP_SETTINGS,
)
bench_app = typer.Typer(help="Benchmarks that print numbers.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


COMMANDS_GROUP = "ttc.commands"
"""Entry-point group of command sets installed beside the service (the operator tools' load test,
benchmarks and fakes): each names a ``register(app, bench_app)`` callable."""

OWN_COMMANDS = frozenset({"serve", "replay", "policy", "key", "export"})
"""Top-level commands of this package (not ``bench``, which the installed command sets extend)."""


def _register_feature_commands(argv: Sequence[str] = ()) -> None:
    """Commands living next to their feature (each module exposes ``register(app, bench_app)``), then
    every installed ``ttc.commands`` entry point, unless the command line ``argv`` names one of
    :data:`OWN_COMMANDS`: loading the operator tools costs about 0.25 s of imports (aiohttp, numpy,
    HdrHistogram) that ``ttc policy list`` has no use for. ``ttc --help`` and every other command load
    them all."""
    from app import admin_cli
    from app.replay import cli as replay_cli

    for module in (replay_cli, admin_cli):
        module.register(app, bench_app)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in OWN_COMMANDS:
        return
    from importlib.metadata import entry_points

    for ep in entry_points(group=COMMANDS_GROUP):
        ep.load()(app, bench_app)


@app.command(short_help="Start the service (and the demo vLLM engine when no backend is given).")
def serve(
    config: Annotated[Path | None, typer.Option(help="YAML config file (also TTC_CONFIG).")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1, or TTC_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000, or TTC_PORT; 0: any free port).")] = None,
    backend: Annotated[list[str] | None, typer.Option(
        help="Backend base URL (repeatable). None: start the embedded vLLM CPU engine.")] = None,
    model_dir: Annotated[Path | None, typer.Option(help="Model folder for the embedded engine.")] = None,
    log_level: Annotated[str, typer.Option(help="Log level (debug also logs every backend call).")] = "info",
    log_format: Annotated[str, typer.Option(
        help="text, or json: one JSON object per line (request lines carry request_id, policy, samples, rounds, "
             "stop_reason, tokens, latency_ms).")] = "text",
    workers: Annotated[int | None, typer.Option(
        help="Worker processes sharing the port (default 1, or TTC_WORKERS). With more than one, rate limits "
             "and learned statistics are per worker unless redis.url is set (batches live in the store: any "
             "worker answers for them).", min=1, max=64)] = None,
) -> None:
    """Start the service. With no backend configured it starts a local vLLM CPU engine on the bundled
    demo model (its port: TTC_ENGINE__PORT, default any free one; its output: .logs/vllm-engine.log)
    and stops it on shutdown. It says what it starts, then "ttc serving on http://HOST:PORT" with the
    console (/ui) and API docs (/docs) once ready. Every request logs one line (logger ttc.request).
    Connection limits (request-head timeout, idle keep-alive timeout, connection cap): the server
    section of the config, e.g. TTC_SERVER__HEADER_TIMEOUT_S."""
    from app import serve as serving
    from app.config import load_settings
    from app.logs import setup_logging

    if log_format not in ("text", "json"):
        raise typer.BadParameter("use text or json", param_hint="--log-format")
    setup_logging(log_level, "json" if log_format == "json" else "text")
    overrides: dict[str, object] = {}
    if host:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    if backend:
        overrides["backends"] = [{"url": u} for u in backend]
    if workers:
        overrides["workers"] = workers
    settings = load_settings(config, **overrides)
    if model_dir:
        settings.engine.model_dir = model_dir
    engine_log = Path(".logs/vllm-engine.log")
    engine_log.parent.mkdir(exist_ok=True)
    try:
        serving.run(settings, log_level=log_level, log_format="json" if log_format == "json" else "text",
                    engine_log=engine_log)
    except serving.PortTaken as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def main() -> None:
    _register_feature_commands(sys.argv[1:])
    app()
