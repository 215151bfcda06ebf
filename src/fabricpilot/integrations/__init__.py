"""Integrations of fabricpilot with training frameworks.

* :mod:`fabricpilot.integrations.torch` -- a PyTorch DDP communication hook that declares the
  job to the controller service and announces each gradient bucket's AllReduce (needs the
  ``torch`` extra: ``pip install 'fabricpilot[torch]'``; the module itself imports without
  torch, which is only loaded when a hook or a process group is used).
"""
