"""blendsim: simulate, calibrate and compare schedulers for offline batch LLM inference.

The application layer: the command line (``blendsim.cli``), the runner, sweeps, the demo and the
validation flow sit here, on top of the engine core (``sim``), the policies, workloads, calibration,
real backend and reports.
"""
