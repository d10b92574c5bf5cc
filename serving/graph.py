"""Serve config entry points under their first name: configs written by ``willump build``
before the wings name ``serving.graph:app_builder``; new ones name :mod:`serving.launch.graph`."""

from serving.launch.graph import app_builder, monitor_builder

__all__ = ["app_builder", "monitor_builder"]
