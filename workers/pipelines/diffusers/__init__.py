"""Adapters that run local diffusers pipelines one denoise step at a time.

Each adapter mirrors its pipeline's ``__call__`` with its own loop (``prepare`` → ``step``
× N → ``decode``), so the executor can cancel, report progress and enforce deadlines
between steps. diffusers' own ``interrupt`` flag is not a cancel (it still decodes and
returns a normal-looking output); stopping means not calling ``step`` again.

The served-model registry (``workers/pipelines/registry.py``) maps each family
(``diffusers.wan``, …) to its adapter; importing this package does not import diffusers.
"""
