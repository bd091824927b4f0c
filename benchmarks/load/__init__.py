"""The open-loop load generator (``python -m benchmarks.load.run``), the evidence it
gathers, the CPU soak and the embedded S3 server's memory."""
