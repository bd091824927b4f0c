"""``OMNIQ_WORKER__MEMORY_FRACTION``: what it accepts, and how a worker applies it (the
CUDA calls are stand-ins here; ``benchmarks/gpu/oom.py`` runs it on a GPU)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from storage.settings import Settings
from workers.common.memory import apply_memory_fraction, forget_frames
from workers.runtime.celery_app import model_devices

GIB = 2**30


@pytest.mark.parametrize(("raw", "value"), [("0.3", 0.3), ("1", 1.0), ("", None)])
def test_the_fraction_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str, value: float | None
) -> None:
    monkeypatch.setenv("OMNIQ_WORKER__MEMORY_FRACTION", raw)
    assert Settings().worker.memory_fraction == value


def test_no_fraction_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMNIQ_WORKER__MEMORY_FRACTION", raising=False)
    assert Settings().worker.memory_fraction is None


@pytest.mark.parametrize("raw", ["0", "-0.5", "1.01", "30", "nan", "a third"])
def test_a_fraction_outside_0_1_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("OMNIQ_WORKER__MEMORY_FRACTION", raw)
    with pytest.raises(ValidationError, match="OMNIQ_WORKER__MEMORY_FRACTION must be"):
        Settings()


class FakeCuda:
    """The CUDA calls ``apply_memory_fraction`` makes, on two 80 GiB devices."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[float, torch.device]] = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_device_properties", self.properties)
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", self.set_fraction)

    @staticmethod
    def properties(device: torch.device) -> Any:
        assert device.type == "cuda" and device.index is not None
        return type("Props", (), {"total_memory": 80 * GIB})()

    def set_fraction(self, fraction: float, device: torch.device) -> None:
        self.calls.append((fraction, device))


def test_each_cuda_device_is_capped_once_and_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cuda = FakeCuda(monkeypatch)
    caplog.set_level(logging.INFO, logger="workers.common.memory")
    caps = apply_memory_fraction(0.3, ["cuda:0", "cuda", "cuda:0"])
    # "cuda" is the current device (1 here); cuda:0 is named twice and capped once
    assert cuda.calls == [(0.3, torch.device("cuda:0")), (0.3, torch.device("cuda:1"))]
    assert caps == {"cuda:0": int(24 * GIB), "cuda:1": int(24 * GIB)}
    assert "cuda:0: memory fraction 0.30 of 80.0 GiB: 24.0 GiB" in caplog.text


def test_on_cpu_the_fraction_is_ignored_with_a_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cuda = FakeCuda(monkeypatch)
    caplog.set_level(logging.INFO, logger="workers.common.memory")
    assert apply_memory_fraction(0.5, ["cpu"]) == {}
    assert cuda.calls == []
    assert "memory fraction 0.50 ignored on cpu (CUDA devices only)" in caplog.text


def test_without_a_fraction_nothing_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(monkeypatch)
    assert apply_memory_fraction(None, ["cuda:0"]) == {}
    assert cuda.calls == []


def test_a_worker_caps_its_device_and_those_its_registry_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    registry = tmp_path / "models.toml"
    registry.write_text(
        '[[model]]\nname = "a"\nadapter = "reference.video"\n'
        '[[model]]\nname = "b"\nadapter = "reference.video"\ndevice = "cuda:1"\n'
    )
    monkeypatch.setenv("OMNIQ_MODEL_REGISTRY", str(registry))
    monkeypatch.setenv("OMNIQ_WORKER__DEVICE", "cuda:0")
    assert model_devices(Settings()) == ["cuda:0", "cuda:1"]


def test_forget_frames_drops_the_locals_of_a_chained_failure() -> None:
    import weakref

    def inner() -> None:
        big = torch.zeros(8)
        refs.append(weakref.ref(big))
        raise MemoryError("inner")

    def outer() -> None:
        held = torch.zeros(8)
        refs.append(weakref.ref(held))
        try:
            inner()
        except MemoryError as exc:
            raise RuntimeError("outer") from exc

    refs: list[weakref.ref[torch.Tensor]] = []
    try:
        outer()
    except RuntimeError as exc:
        kept = exc  # as a log handler that holds the record would
    assert all(r() is not None for r in refs)
    forget_frames(kept)
    assert all(r() is None for r in refs)
    assert isinstance(kept.__cause__, MemoryError)
