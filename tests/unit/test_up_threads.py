"""``omniqueue up``'s share of the CPU cores for each worker process (torchrun's rule)."""

from __future__ import annotations

from cli.up import THREAD_VARS, cpu_thread_env


def test_workers_share_the_cores_as_their_intra_op_threads() -> None:
    assert cpu_thread_env({}, processes=8, cores=16) == dict.fromkeys(THREAD_VARS, "2")
    assert cpu_thread_env({}, processes=3, cores=16) == dict.fromkeys(THREAD_VARS, "5")
    assert cpu_thread_env({}, processes=4, cores=2) == dict.fromkeys(THREAD_VARS, "1")


def test_one_process_or_a_setting_from_outside_is_left_alone() -> None:
    assert cpu_thread_env({}, processes=1, cores=16) == {}
    assert cpu_thread_env({"OMP_NUM_THREADS": "12"}, processes=8, cores=16) == {}
    assert cpu_thread_env({"MKL_NUM_THREADS": "4"}, processes=8, cores=16) == {}
