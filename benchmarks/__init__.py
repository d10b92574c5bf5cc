"""The project's benchmarks: every measured figure in docs/benchmarks.md comes from one of these.

Not part of the installed library (nothing in ``willump``, ``serving``, ``drift`` or ``pipelines``
imports them). Run them from the repository root as modules::

    python -m benchmarks.workloads     # workloads against their unoptimized pipelines
    python -m benchmarks.guarantee     # the optimizer's guarantee by simulation
    python -m benchmarks.serving       # served cascade vs served baseline
    python -m benchmarks.cluster       # shared, mixed and transient resources
    python -m benchmarks.partition     # partitioned deep models (+ benchmarks.partition_report)
    python -m benchmarks.deep          # the certified deep cascade, served (--device gpu)
    python -m benchmarks.gpu_check     # the GPU check, in one process (+ benchmarks.gpu_carry)
    python -m benchmarks.dashboard     # the dashboard's cost per replica
    python -m benchmarks.drift         # the monitor: quality, speed, memory, sampled regime, peers

(``python benchmarks/serving.py`` would shadow the ``serving`` package with the file itself: use
``-m``.) Modules starting with ``_`` are the benchmarks' shared parts.
"""
