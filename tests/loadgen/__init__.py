"""The load generator's pure parts (the workload file and arrival plan, the statistics),
kept in tests/ so that their unit tests import no benchmark; ``benchmarks/load/`` drives
them."""
