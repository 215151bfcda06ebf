"""fabricpilot: a task-aware control plane and a fast digital twin for AI-training fabrics.

Data flows one way: scenario -> topology + workload -> engine (dataplane + balancing)
-> results -> report / CLI.
"""

__version__ = "0.1.0"
