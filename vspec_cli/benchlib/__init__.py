"""The machinery of `vspec bench` (vspec_cli/commands/bench.py is only its command line).

policies.py     policy strings -> per-policy RuntimeSpecs
runner.py       cells, the plan, one fresh engine per policy and repeat (vspec_cli.offline_run in a subprocess)
stats.py        per-cell throughput, ratios, acceptance, K histogram, equality, target checks
report.py       the versioned results document, results.json, results.md
plots.py        PNG plots
session.py      all of the above in order
"""
