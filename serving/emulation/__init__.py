"""Emulated devices for tests and benchmarks (this machine has one kind of CPU): replicas that
take a cost-table time, and the heterogeneous app built from them. Named so: nothing a
user deploys runs here.
"""
