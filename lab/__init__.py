"""The lab: what measures or builds the studio rather than serving a request. It imports the studio; the studio never
imports it. `python -m lab COMMAND` (lab.__main__ lists the commands)."""
