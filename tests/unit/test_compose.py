"""docker/compose.yaml and its config files, checked without Docker: the default services are as they
were, the ``scale`` profile has a load balancer, replicas, Postgres, Redis and Prometheus wired to one
another by service name, the replicas' environment is a valid service config, and HAProxy accepts
its config (``haproxy -c``, when installed)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import load_settings
from ttc_tools.bench.topology import MissingBinary, haproxy_config, haproxy_exe

DOCKER = Path(__file__).resolve().parents[2] / "docker"
SCALE = {"ttc-replica", "lb", "postgres", "redis", "prometheus-scale"}


def interpolate(value: str) -> str:
    """``${VAR:-default}`` / ``${VAR}`` as compose does with nothing set in the environment."""
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_default_services_are_unchanged_and_profile_free(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("vllm", "ttc", "prometheus"):
        assert "profiles" not in services[name], name
    assert services["ttc"]["ports"] == ["8000:8000"]
    assert json.loads(services["ttc"]["environment"]["TTC_BACKENDS"])[0]["url"] == "http://vllm:8001"
    assert services["prometheus"]["volumes"] == ["./prometheus.yml:/etc/prometheus/prometheus.yml:ro"]
    command = [interpolate(c) for c in services["vllm"]["command"]]
    assert command[command.index("--data-parallel-size") + 1] == "1"  # data-parallel, off by default
    assert command[command.index("--port") + 1] == "8001"
    # the trace monitor, loaded by class name from the mounted plugin folder
    processor = command[command.index("--logits-processors") + 1]
    module, _, cls = processor.partition(":")
    mount = next(v for v in services["vllm"]["volumes"] if v.startswith("../vllm_plugin:"))
    assert services["vllm"]["environment"]["PYTHONPATH"] == mount.split(":")[1]
    assert (DOCKER / "../vllm_plugin" / (module.replace(".", "/") + ".py")).is_file()
    assert f"class {cls}(" in (DOCKER / "../vllm_plugin" / (module.replace(".", "/") + ".py")).read_text()


def test_scale_profile_has_its_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    profiled = {name for name, svc in services.items() if "scale" in svc.get("profiles", [])}
    assert profiled == SCALE
    for name, svc in services.items():
        for dep in svc.get("depends_on", []):
            assert dep in services, (name, dep)
            if "profiles" not in svc:  # a default service must not need a profiled one
                assert "profiles" not in services[dep], (name, dep)
            cond = svc["depends_on"][dep]["condition"] if isinstance(svc["depends_on"], dict) else None
            if cond == "service_healthy":
                assert "healthcheck" in services[dep], (name, dep)
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DOCKER / source).is_file(), (name, source)
            elif source.startswith("../"):  # a folder of the repository (the vLLM plugin)
                assert (DOCKER / source).is_dir(), (name, source)
            elif not source.startswith(("/", "$", "~")):
                assert source in compose["volumes"], (name, source)


def test_replicas_share_store_redis_and_backend(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    replica = compose["services"]["ttc-replica"]
    assert interpolate(str(replica["deploy"]["replicas"])) == "2"
    assert "${REPLICAS" in str(replica["deploy"]["replicas"])
    assert "ports" not in replica  # N copies cannot publish one port; clients go through lb
    assert {"postgres", "redis", "vllm"} <= set(replica["depends_on"])
    assert replica["build"] == compose["services"]["ttc"]["build"]
    for key in [k for k in os.environ if k.startswith("TTC_")]:
        monkeypatch.delenv(key)
    for key, value in replica["environment"].items():
        monkeypatch.setenv(key, interpolate(str(value)))
    settings = load_settings()  # what the service in the container builds from this environment
    pg = compose["services"]["postgres"]["environment"]
    assert settings.store.resolved_url() == (
        f"postgresql+asyncpg://{pg['POSTGRES_USER']}:{interpolate(pg['POSTGRES_PASSWORD'])}@postgres:5432/"
        f"{pg['POSTGRES_DB']}")
    assert settings.redis.url == "redis://redis:6379/0"
    assert [b.url for b in settings.backends] == ["http://vllm:8001"]
    assert settings.default_model == "model"


def test_load_balancer_and_prometheus_find_the_replicas(compose: dict[str, Any]) -> None:
    services = compose["services"]
    lb = services["lb"]
    assert lb["volumes"] == ["./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro"]
    cfg = (DOCKER / "haproxy.cfg").read_text()
    template = re.search(r"^\s*server-template \S+ (\d+)-(\d+) (\S+):(\d+) (.*)$", cfg, re.M)
    assert template is not None
    assert template.group(3) == "ttc-replica" and template.group(4) == "8000"  # the service, TTC_PORT
    assert int(template.group(2)) >= 8 and "resolvers docker" in template.group(5)
    assert re.search(r"^\s*balance roundrobin$", cfg, re.M)
    assert re.search(r"^\s*http-check send meth GET uri /health$", cfg, re.M)
    bind = re.search(r"^frontend ttc\n\s*bind :(\d+)$", cfg, re.M)
    assert bind is not None and any(p.endswith(":" + bind.group(1)) for p in map(interpolate, lb["ports"]))

    prom = yaml.safe_load((DOCKER / "prometheus-scale.yml").read_text())
    jobs = {job["job_name"]: job for job in prom["scrape_configs"]}
    assert jobs["ttc"]["dns_sd_configs"] == [{"names": ["ttc-replica"], "type": "A", "port": 8000,
                                              "refresh_interval": "15s"}]
    assert jobs["haproxy"]["static_configs"][0]["targets"] == ["lb:8404"]
    assert services["prometheus-scale"]["volumes"][0].startswith("./prometheus-scale.yml:")


def _section(cfg: str, header: str) -> list[str]:
    """The directives of one section, comments and spacing dropped."""
    out, inside = [], False
    for line in cfg.splitlines():
        if line and not line[0].isspace():
            inside = line.strip() == header
            continue
        text = " ".join(line.split("#")[0].split())
        if inside and text:
            out.append(text)
    return out


def test_local_and_compose_balancers_behave_alike() -> None:
    local = haproxy_config([("r1", "127.0.0.1", 1)], 2, 3)
    docker = (DOCKER / "haproxy.cfg").read_text()
    assert _section(local, "defaults") == _section(docker, "defaults")
    check = [d for d in _section(docker, "backend replicas") if not d.startswith(("server", "default-server"))]
    assert check == [d for d in _section(local, "backend replicas") if not d.startswith(("server", "default-server"))]


@pytest.mark.parametrize("which", ["docker", "local"])
def test_haproxy_accepts_the_configs(which: str, tmp_path: Path) -> None:
    try:
        exe = haproxy_exe()
    except MissingBinary as exc:
        pytest.skip(str(exc))
    path = DOCKER / "haproxy.cfg"
    if which == "local":
        path = tmp_path / "haproxy.cfg"
        path.write_text(haproxy_config([("r1", "127.0.0.1", 1), ("r2", "127.0.0.1", 2)], 3, 4,
                                       admin_socket=tmp_path / "s.sock"))
    done = subprocess.run([exe, "-c", "-f", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
