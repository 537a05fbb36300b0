"""pytest plugin (``pytest11`` entry point ``sgl_probe``): the ``sgl_probe_collector`` fixture.

Loaded into every pytest session of an environment where sgl-probe is installed, so importing
this module costs nothing beyond pytest itself: the receiver (grpcio, opentelemetry-proto) is
imported only when a test asks for the fixture. ``-p no:sgl_probe`` turns the plugin off.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

_STASH_KEY = "_sgl_probe_collector"


def pytest_addoption(parser: Any) -> None:
    parser.addini("sgl_probe_host", "loopback address the sgl_probe_collector fixture listens on",
                  default="127.0.0.1")


@pytest.fixture(scope="session")
def sgl_probe_collector(request: Any) -> Iterator[Any]:
    """An in-process OTLP receiver (gRPC and HTTP/protobuf, free loopback ports) for the session.

    ``sgl_probe_collector.launch_env({...})`` / ``.env()`` give the environment to start a server
    with (a fresh run id each call); ``wait_for_env_snapshots``, ``phase_spans``,
    ``nccl_confirmations`` query what arrived. See ``sgl_probe.testing``."""
    from sgl_probe.testing.collector import Collector

    collector = Collector(host=request.config.getini("sgl_probe_host") or "127.0.0.1")
    collector.start()
    setattr(request.config, _STASH_KEY, collector)
    try:
        yield collector
    finally:
        setattr(request.config, _STASH_KEY, None)
        collector.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.passed or report.skipped or "sgl_probe_collector" not in getattr(item, "fixturenames", ()):
        return
    collector = getattr(item.config, _STASH_KEY, None)
    if collector is None:
        return
    try:
        text = collector.describe()
    except Exception as exc:  # a report section must never turn into an error of its own
        text = f"(could not describe the collector: {exc!r})"
    report.sections.append(("sgl-probe collector", text))
