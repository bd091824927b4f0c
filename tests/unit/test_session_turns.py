"""Several world sessions on one device (``workers/sessions/turns.py``): turns handed out
first come first served, and the number of sessions a model keeps in real time."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import redis

from models.catalog import FAMILY_SPECS
from models.registry import ServedModel
from storage.bus import EventBus
from storage.settings import Settings
from tests.unit.helios_fixtures import SEQ_LEN, SIZE, tiny_helios_pipeline
from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter
from workers.pipelines.registry import PipelineRegistry
from workers.sessions.turns import CapacityExceeded, Demand, FairTurns, RealtimeCapacity
from workers.sessions.world import WorldSessionRunner


def test_sessions_that_keep_asking_take_turns_one_step_each() -> None:
    """Two sessions stepping back to back alternate: each waits one step of the other,
    never two, however the threads are scheduled."""
    turns = FairTurns()
    order: list[str] = []
    both = threading.Barrier(2)

    def session(name: str) -> None:
        both.wait()
        for _ in range(20):
            with turns.turn():
                order.append(name)
                time.sleep(0.001)  # a step at the device

    threads = [threading.Thread(target=session, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(order) == ["a"] * 20 + ["b"] * 20
    # Before the later thread's first ticket the earlier one may run alone; from then on
    # they alternate strictly until one is done.
    joined = min(order.index("a"), order.index("b"), key=lambda i: -i)
    last_a = len(order) - 1 - order[::-1].index("a")
    last_b = len(order) - 1 - order[::-1].index("b")
    both = order[joined - 1 : min(last_a, last_b) + 1]
    assert all(x != y for x, y in itertools.pairwise(both)), order


def test_a_turn_is_released_when_its_step_raises() -> None:
    turns = FairTurns()
    with pytest.raises(RuntimeError), turns.turn():
        raise RuntimeError("the step failed")
    with turns.turn():  # not held by the failed step
        pass


SMALL = Demand(width=64, height=64, fps=24.0, steps=2)
LARGE = Demand(width=128, height=128, fps=24.0, steps=2)  # four times the work


def test_the_measured_cost_sets_how_many_sessions_of_a_shape_keep_real_time() -> None:
    cap = RealtimeCapacity(0.9, {"helios": None, "fixed": 3})
    assert cap.limit("helios", SMALL) is None  # not measured: only the slots bound it
    # one 33-frame chunk in 0.3 s: 0.3 / 1.375 s of device per second of video
    cap.measured("helios", device_s=0.3, work=SMALL.work(33))
    assert cap.load("helios", SMALL) == pytest.approx(0.3 / 1.375)
    assert cap.limit("helios", SMALL) == 4  # floor(0.9 / 0.218)
    assert cap.load("helios", LARGE) == pytest.approx(4 * 0.3 / 1.375)
    assert cap.limit("helios", LARGE) == 1  # never 0: one session is served, however slow
    cap.measured("helios", device_s=0.6, work=SMALL.work(33))  # slower now: averaged
    assert cap.load("helios", SMALL) == pytest.approx((0.3 + 0.3 * 0.3) / 1.375)
    assert cap.limit("fixed", SMALL) == 3  # the registry's max_sessions wins
    cap.measured("fixed", device_s=10.0, work=SMALL.work(1))
    assert cap.limit("fixed", LARGE) == 3


def test_the_start_up_line_says_no_session_keeps_real_time_past_one_device_second() -> None:
    """A second of video that takes 1.862 s of the device was "1 sessions of it keep
    real time"; the first session is still admitted, but none keeps real time."""
    cap = RealtimeCapacity(0.9, {"slow": None, "fast": None, "one": None})
    shape = "64x64 at 24 fps, 2 steps a chunk"
    assert cap.describe("slow", SMALL) == f"slow: a second of video ({shape}) is not measured yet"
    cap.measured("slow", device_s=1.862, work=SMALL.work(24))
    assert cap.limit("slow", SMALL) == 1  # admitted all the same
    assert cap.describe("slow", SMALL) == (
        f"slow: a second of video ({shape}) takes 1.862 s of this device: no session of it "
        "keeps real time (one at a time is served, at 0.54x real time)"
    )
    cap.measured("one", device_s=0.95, work=SMALL.work(24))  # past the headroom, not 1 s
    assert cap.describe("one", SMALL).endswith(
        "0.950 s of this device: 1 session of it keeps real time"
    )
    cap.measured("fast", device_s=0.2, work=SMALL.work(24))
    assert cap.describe("fast", SMALL).endswith(": 4 sessions of it keep real time")


def test_a_session_is_admitted_while_the_loads_fit_and_refused_naming_why() -> None:
    cap = RealtimeCapacity(0.9, {"helios": None, "fixed": 1}, wait_s=0.05)
    cap.measured("helios", device_s=0.2, work=SMALL.work(24))  # 0.2 s a second of SMALL
    with cap.session("helios", LARGE):  # 0.8: alone, and the first is always admitted
        with pytest.raises(CapacityExceeded) as refused, cap.session("helios", SMALL):
            pass  # 0.8 + 0.2 > 0.9
        message = str(refused.value)
        assert "helios cannot keep one more session in real time" in message
        assert "1 session take 0.80 s" in message and "0.20 s more" in message
        assert "64x64 at 24 fps, 2 steps a chunk" in message
        assert "CAPACITY_HEADROOM (0.9)" in message
    with cap.session("helios", SMALL), cap.session("helios", SMALL):  # 0.4 together
        pass
    with cap.session("fixed", LARGE), pytest.raises(CapacityExceeded, match="max_sessions"):  # noqa: SIM117
        with cap.session("fixed", SMALL):
            pass


def test_a_session_waits_briefly_for_one_that_is_ending() -> None:
    """The place of a session that ends within ``wait_s`` goes to the next one, which
    is not refused (a client that stops one session and starts another at once)."""
    cap = RealtimeCapacity(0.9, {"one": 1}, wait_s=10.0)
    ending = cap.session("one", SMALL)
    ending.__enter__()
    timer = threading.Timer(0.1, ending.__exit__, (None, None, None))
    timer.start()
    with cap.session("one", SMALL):  # waits for the timer, then holds the place
        assert not timer.is_alive()
    timer.join()


def test_the_start_up_probe_measures_a_world_model_and_skips_a_fixed_one() -> None:
    """``WorldSessionRunner.probe``: one chunk of each world model at its defaults sets
    its load; an entry with ``max_sessions`` is not probed (its number is fixed)."""
    spec = FAMILY_SPECS["diffusers.helios"].model_copy(
        update={"default_size": (SIZE, SIZE), "default_steps": 2}
    )
    models = {
        name: ServedModel(name=name, adapter="diffusers.helios", path="-", spec=spec, **extra)
        for name, extra in (("measured", {}), ("fixed", {"max_sessions": 2}))
    }
    registry = PipelineRegistry(models, "cpu")
    adapter = HeliosWorldAdapter(pipe=tiny_helios_pipeline(), max_sequence_length=SEQ_LEN)
    adapter.load("cpu")
    adapter.spec = spec
    for name in models:
        registry.replace(name, adapter)
    bus = EventBus(redis.Redis(), ttl_s=60)  # never connects: the probe sends nothing
    runner = WorldSessionRunner(Settings(), registry, bus, worker_id="w")
    runner.probe()
    shape = Demand(SIZE, SIZE, float(spec.default_fps), 2)
    load = runner.capacity.load("measured", shape)
    assert load is not None and load > 0
    assert runner.capacity.limit("measured", shape) == max(1, int(0.9 / load))
    assert runner.capacity.load("fixed", shape) is None
    assert runner.capacity.limit("fixed", shape) == 2
