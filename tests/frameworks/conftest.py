"""Fixtures for the framework tests; see framework_jobs.py."""

from framework_jobs import ml_python, start_job  # noqa: F401
