"""The GPU benchmarks on a GPU host without a package index: the wheelhouse their venv
installs from (``wheelhouse``, built where there is an index and copied there) and the
shell scripts (``*.sh``) that run them there."""
