"""Our trainer on AReaL: the run's own logic around AReaL's ``PPOTrainer`` (the trainer process's room).

- ``trainer``: ``Trainer`` (AReaL's trainer with our start-up and between-step additions; every private AReaL
  name we use is there) and the helpers ``cua_rl.train`` composes around it;
- ``health``: the run's health checks after every step and between steps, and the clean stop on garbage;
- ``resume``: atomic recover points and each stream item trained (or dropped) once;
- ``weight_probe``: whether the model servers took each weight update;
- ``warm_up``: the servers' first image request before the first step;
- ``model_watch``: a dead model server stops the run with its cause.

What runs inside AReaL's worker processes is ``cua_rl.areal_ext``. Kept import-free: the launcher imports
``health`` and ``resume`` without AReaL (its logging set-up comes first), so importing this package must not
import ``trainer``.
"""
