"""The lent GPU machine: the wheelhouse its venv installs from (``wheelhouse``) and the
shell scripts (``*.sh``) that run the GPU benchmarks there."""
