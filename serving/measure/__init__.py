"""Measures the running system for planning: stage profiling, host-cost calibration, the
in-situ probe and HTTP load generation (/proc accounting is serving.core.procstat).
"""
