"""A load test naming a policy or a model the service does not have stops before any load, saying which."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from app.config import BackendConfig, Settings
from app.main import create_app
from tests.support.serving import serving
from ttc_tools.fakes.backend import FakeOpenAI
from ttc_tools.fakes.service import FakeTTCService
from ttc_tools.loadtest.data import Problem
from ttc_tools.loadtest.runner import LevelSpec
from ttc_tools.loadtest.session import UnknownModel, UnknownPolicy, refuse_unknown_names, run_session

PROBLEMS = [Problem("p1", "What is 2 + 3?", "5")]


@contextlib.asynccontextmanager
async def real_service(fake: FakeOpenAI) -> AsyncIterator[str]:
    """The service itself (one fake backend behind it) under uvicorn on a loopback port."""
    async with contextlib.AsyncExitStack() as stack:
        backend = await stack.enter_async_context(serving(fake))
        settings = Settings(backends=[BackendConfig(url=backend, name="fake0")], default_model="fake-model",
                            store={"url": "sqlite+aiosqlite://"}, answers={"prestart": False})
        app = create_app(settings)
        await stack.enter_async_context(app.router.lifespan_context(app))
        yield await stack.enter_async_context(serving(app))


def level(url: str, policy: object, model: str | None = None) -> LevelSpec:
    return LevelSpec(url=url, policy=str(policy), mode="closed", load=1, duration_s=30.0, ttc={"policy": policy},
                     model=model)


async def test_an_unknown_policy_name_is_refused_before_any_request() -> None:
    fake = FakeOpenAI(latency_s=0.0, p_correct=1.0)
    async with real_service(fake) as url:
        with pytest.raises(UnknownPolicy, match="has no policy 'no-such-policy'"):
            await run_session([level(url, "single"), level(url, "no-such-policy")], PROBLEMS)
        assert fake.calls == 0  # not even the known level ran: its 30 s would have been spent for nothing
        inline = {"allocator": "fixed", "params": {"n": 2}, "aggregator": "majority"}
        await refuse_unknown_names([level(url, "single"), level(url, "self-consistency-8"), level(url, inline)])


async def test_a_service_without_the_policies_route_is_left_to_the_run() -> None:
    async with serving(FakeTTCService(latency_s=0.0, p_correct=1.0)) as url:  # 404 without policy_not_found
        await refuse_unknown_names([level(url, "whatever")])
    with pytest.raises(ValueError, match="not loopback"):  # never probed
        await refuse_unknown_names([level("http://10.1.2.3:80", "x")])


async def test_an_unknown_model_is_refused_before_any_request_and_a_served_one_runs() -> None:
    fake = FakeOpenAI(latency_s=0.0, p_correct=1.0)
    async with real_service(fake) as url:
        with pytest.raises(UnknownModel, match="does not serve model 'no-such-model'; it serves: fake-model"):
            await run_session([level(url, "single", "fake-model"), level(url, "single", "no-such-model")], PROBLEMS)
        assert fake.calls == 0
        result = await run_session([LevelSpec(url=url, policy="single", mode="closed", load=1, duration_s=None,
                                              max_requests=2, model="fake-model", ttc={"policy": "single"})],
                                   PROBLEMS)
        assert [r.error for r in result.records] == [None, None] and fake.calls == 2
    async with serving(FakeTTCService(latency_s=0.0, p_correct=1.0)) as url:  # lists no models: left to the run
        await refuse_unknown_names([level(url, "x", "anything")])
