"""Measures the running system for planning: stage profiling, host-cost calibration, the
in-situ probe, /proc accounting and HTTP load generation.
"""
