"""The vocabulary every wing of serving shares: constants, stage specs, the request schema,
artifacts, measured profiles, this machine's processes (/proc) and a Ray started here with
its control plane closed. Imports only willump's public API (Ray lazily, where it is used).
"""
