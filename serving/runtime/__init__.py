"""What runs inside the replicas, the request path: the ingress and its HTTP helpers, stage
calls with deadlines, coalescing, hedging, gears, records, metrics, the stage runner and the
live dashboard. Imports only :mod:`serving.core` (never planning).
"""
