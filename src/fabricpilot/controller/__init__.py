"""The task-aware control plane: intents, a congestion map from telemetry deltas, SLA-aware
path ranking and job-aware path planning. It talks to a data plane only through
:mod:`fabricpilot.controller.southbound` and imports nothing from the simulator."""
