"""The job path: claim a job, run its outputs step by step, check and upload them, clean up."""
