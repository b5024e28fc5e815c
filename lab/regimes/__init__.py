"""Memory regimes and kernels timed on transformers of real size, each call by the one clock (studio.measure.clock):
`python -m lab regimes` (lab.regimes.table) and `python -m lab kernels` (lab.regimes.kernels)."""
