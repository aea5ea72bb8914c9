"""The ``ttc`` command line (typer). Each sub-command's help says what it does and its defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="ttc: a test-time compute allocation service for LLMs (OpenAI-compatible gateway over vLLM).",
    no_args_is_help=True, add_completion=False,
)
bench_app = typer.Typer(help="Benchmarks that print numbers.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


COMMANDS_GROUP = "ttc.commands"
"""Entry-point group of command sets installed beside the service (the operator tools' load test,
benchmarks and fakes): each names a ``register(app, bench_app)`` callable."""


def _register_feature_commands() -> None:
    """Commands living next to their feature (each module exposes ``register(app, bench_app)``), then
    every installed ``ttc.commands`` entry point."""
    from importlib.metadata import entry_points

    from app import admin_cli
    from app.replay import cli as replay_cli

    for module in (replay_cli, admin_cli):
        module.register(app, bench_app)
    for ep in entry_points(group=COMMANDS_GROUP):
        ep.load()(app, bench_app)


@app.command()
def serve(
    config: Annotated[Path | None, typer.Option(help="YAML config file (also TTC_CONFIG).")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1, or TTC_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000, or TTC_PORT).")] = None,
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
    demo model and stops it on shutdown. Every request logs one line (logger ttc.request)."""
    from app import serve as serving
    from app.config import load_settings
    from app.logs import setup_logging

    if log_format not in ("text", "json"):
        raise typer.BadParameter("use text or json", param_hint="--log-format")
    setup_logging(log_level, "json" if log_format == "json" else "text")
    overrides: dict[str, object] = {}
    if host:
        overrides["host"] = host
    if port:
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
    _register_feature_commands()
    app()
