"""Operator tools around the service: load tests, benchmarks, the demo task and its model's data,
and fake backends/services for tests and demos. They use the service's public surface (``app``,
``allocators``); the service never imports them (an import-linter contract)."""
