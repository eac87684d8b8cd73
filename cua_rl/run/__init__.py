"""Starting a run and reporting on it, outside AReaL: ``launch`` (what ``train.sh`` execs: every start-up
decision, once), ``cli`` (its flag table), ``console`` (the trainer's output on the console) and ``summary``
(what the launcher prints when the run ends). Where a run's files go (``cua_rl.runs``) stays at the root:
the workflow needs it too, and it must not import the launcher's package."""
