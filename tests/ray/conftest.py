"""One real Ray cluster for the whole session: a head with no CPUs and two one-CPU
nodes, with Ray's fast health checks (set before it starts)."""

from __future__ import annotations

import os

import pytest

FAST_HEALTH_CHECKS = {'RAY_health_check_initial_delay_ms': '0',
                      'RAY_health_check_period_ms': '200',
                      'RAY_health_check_timeout_ms': '500',
                      'RAY_health_check_failure_threshold': '3'}


# A worker node: one CPU, and a custom resource that Workers(resources=...) asks for.
NODE = dict(num_cpus=1, resources={'loadr_node': 1})


@pytest.fixture(scope='session')
def cluster():
    """``(Cluster, ray)``: up once, shut down at the end of the session."""
    ray = pytest.importorskip('ray')
    from ray.cluster_utils import Cluster

    os.environ.update(FAST_HEALTH_CHECKS)
    c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, include_dashboard=False))
    try:
        nodes = [c.add_node(**NODE) for _ in range(2)]
        ray.init(address=c.address, log_to_driver=False)
        c.wait_for_nodes()
        yield c, ray, nodes
    finally:
        ray.shutdown()
        c.shutdown()
