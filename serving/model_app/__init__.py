"""A torch model served as the pipeline of stages :mod:`serving.partition` plans: its
deployments, transport calibration, CLI and load generator.
"""
