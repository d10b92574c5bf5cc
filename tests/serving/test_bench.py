"""serving.bench's per-process CPU accounting (pure functions; the benchmark itself is not run here)."""

from __future__ import annotations

import os

import pytest

from serving.bench import cpu_per_request, process_cpu


def test_cpu_is_split_by_deployment_load_generator_and_the_rest():
    before = {1: ("ray::ServeReplica:app:app-ingress", 1.0), 2: ("ray::ServeReplica:app:app-expensive", 2.0),
              3: ("haproxy -f cfg", 0.5), os.getpid(): ("python -m serving.bench", 4.0),
              5: ("ray::ServeReplica:app:app-ingress", 0.0)}
    after = {1: (before[1][0], 1.2), 2: (before[2][0], 2.05), 3: (before[3][0], 0.51),
             os.getpid(): (before[os.getpid()][0], 4.02), 5: (before[5][0], 0.1),
             6: ("started during the phase", 9.0)}
    cpu = cpu_per_request(before, after, requests=100)
    assert cpu["app-ingress"] == pytest.approx(3.0)  # two ingress processes: (0.2 + 0.1) s / 100
    assert cpu["app-expensive"] == pytest.approx(0.5)
    assert cpu["other"] == pytest.approx(0.1) and cpu["load generator"] == pytest.approx(0.2)
    assert cpu["total"] == pytest.approx(3.8)
    assert cpu_per_request(before, after, requests=0) == {"total": 0.0}


def test_process_cpu_sees_this_process_spend_cpu():
    if not os.path.isdir("/proc"):
        pytest.skip("no /proc on this platform")
    before = process_cpu()
    sum(i * i for i in range(2_000_000))
    after = process_cpu()
    assert after[os.getpid()][1] > before[os.getpid()][1]
