"""Video jobs through the API on CPU workers: throughput, cancel, job events, webhooks,
fair share."""
