"""Side-by-side benchmarks of durable_nb against a plain call, raw diskcache, DBOS and LangGraph.

Run ``python -m benchmarks`` (``--quick`` for a smoke run of seconds). Every measurement that
touches a store runs in a fresh subprocess with a fresh temporary directory, systems alternate
run by run, and results are reported as medians with min..max and as ratios taken in the
same run. The runner writes ``benchmarks/RESULTS.md`` and ``benchmarks/cost_per_step.png``.
"""
