"""Wire-level facts the twin and the controller share: RoCEv2 addressing, queue-pair source
ports and the ECMP hash a switch computes. Pure functions on numpy arrays, no state, so a
controller can evaluate exactly what a switch will do without importing the simulator."""
