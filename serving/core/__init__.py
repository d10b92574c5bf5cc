"""The vocabulary every wing of serving shares: constants, stage specs, the request schema,
artifacts and measured profiles. Imports only willump's public API.
"""
