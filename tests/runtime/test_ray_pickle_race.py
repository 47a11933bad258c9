"""Ray Serve builds each DeploymentConfig by registering its request router's module with
cloudpickle, pickling, and unregistering, in one process-wide table: two configs built on two
threads at once can make the second unregister raise ValueError. The engine builds its
deployment again instead of failing the deploy (seen once in CI, in
test_runtime_ray.py::test_autoscaling_emulation_and_health)."""

import pytest

from edgesplit.runtime import ray_engine

RACE = ValueError("<module 'ray.serve._private.request_router'> is not registered for pickle "
                  "by value")


def test_a_lost_pickle_race_is_built_again():
    calls = []

    def make():
        calls.append(1)
        if len(calls) < 3:
            raise RACE
        return "deployment"

    assert ray_engine._past_pickle_race(make) == "deployment"
    assert len(calls) == 3


def test_other_errors_and_a_race_lost_every_time_are_raised():
    def other():
        raise ValueError("num_replicas must be positive")

    with pytest.raises(ValueError, match="num_replicas"):
        ray_engine._past_pickle_race(other)
    calls = []

    def always():
        calls.append(1)
        raise RACE

    with pytest.raises(ValueError, match="pickle by value"):
        ray_engine._past_pickle_race(always, attempts=3)
    assert len(calls) == 3
