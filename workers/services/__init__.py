"""Background services every worker runs beside its tasks: the reconciler and the webhook
sender."""
