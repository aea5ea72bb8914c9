"""``ttc serve --workers 2``: two processes answer on one port, metrics are summed over both, and a
background batch started by one worker is answered for by either (batches live in the shared store)."""

from __future__ import annotations

import httpx

from ttc_tools.bench import procs


def test_two_workers_share_the_port_and_the_metrics(tmp_path: object) -> None:
    with procs.fake_backend(1.0) as backend:
        port = procs.free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [procs.ttc_exe(), "serve", "--port", str(port), "--backend", backend, "--workers", "2",
               "--log-level", "warning"]
        with procs.process(cmd, url + "/ready", env={"TTC_STORE__URL": f"sqlite+aiosqlite:///{tmp_path}/w.db"}) as proc:
            with httpx.Client(base_url=url, timeout=30) as client:
                body = {"messages": [{"role": "user", "content": "What is 3 + 4?"}], "ttc": {"policy": "single"}}
                for _ in range(20):
                    client.headers["connection"] = "close"  # a new connection each time, accepted by either worker
                    assert client.post("/v1/chat/completions", json=body).status_code == 200
                metrics = client.get("/metrics").text
                batch = client.post("/v1/ttc/batches", json={"prompts": ["1", "2"], "budget": {"mean_samples": 2},
                                                             "background": True})
                assert batch.status_code == 202, batch.text
                polls = []
                while not polls or polls[-1].json()["status"] != "completed":
                    polls.append(client.get(f"/v1/ttc/batches/{batch.json()['id']}"))  # new connection: either worker
                    assert polls[-1].status_code == 200 and len(polls) < 2000, polls[-1].text
            workers = [p for p in procs.children(proc.pid) if "spawn_main" in p[1]]
    assert 'ttc_requests_total{outcome="ok",policy="single"} 20.0' in metrics
    assert polls[-1].json()["summary"]["samples_drawn"] <= 4
    assert len(workers) == 2


def test_a_taken_port_fails_at_once_with_a_message() -> None:
    import socket
    import subprocess

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # no backend given: the embedded vLLM engine would start (minutes) if the port were bound later
        done = subprocess.run([procs.ttc_exe(), "serve", "--port", str(port), "--log-level", "warning"],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr
