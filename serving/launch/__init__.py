"""Brings an app up on Ray: deploy, the Serve graph and config file, the cluster's nodes and
the HTTP front (proxy).
"""
