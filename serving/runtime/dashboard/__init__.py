"""The live dashboard at ``/{name}/ui``: metric history, the monitor's data, the view and
its server-side plots.
"""
