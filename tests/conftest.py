"""What every test process, and every process a test starts, shares.

One intra-op thread for torch, OpenMP and the BLAS libraries. The suite runs in two
xdist workers on two cores, and its stacks start API and worker subprocesses beside
them; with a thread pool of one thread per core in each process, the threads spin-wait on
each other (a Helios test took 20-31 s so, 1 s on one thread), and the tensors of the
tiny test pipelines are too small to gain from more threads anyway. Set here, before
torch is imported, in the environment so that subprocesses inherit it; a value set
outside wins.
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
