"""Benchmarks: scripts that measure the stack and print JSON, by subject, each run from
the repository root as ``python -m benchmarks.<subject>.<script> [--help]``:

- ``load``: the open-loop load generator (``run``) and its parts, its workload files
  (``load/workloads/``), the evidence it gathers, the CPU soak, SeaweedFS's memory;
- ``jobs``: video jobs through the API on CPU workers (throughput, cancel, events,
  webhooks, fair share);
- ``api_tier``: the API's own cost (status reads, list pages, creates, HTTP metrics);
- ``realtime``: the realtime voice and video sessions, world-model pacing;
- ``gpu``: a Wan2.1-1.3B-architecture pipeline with random weights on a CUDA device (in
  process, through the stack, out of memory, several GPUs, the GPU metrics);
- ``device``: the shell scripts that run those on a GPU host without a package index, and
  the wheelhouse they install from.

``common`` and ``embedded_stack`` are what the scripts share. Benchmarks may use test
helpers (``tests/``); tests never import a benchmark (tests/unit/test_benchmark_layout.py).
"""
