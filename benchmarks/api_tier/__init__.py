"""The API tier's own cost: status reads, list pages, creates, ``/sync``, HTTP metrics."""
