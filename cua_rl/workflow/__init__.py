"""The AReaL workflow of computer-use episodes (``config.workflow: cua_rl.workflow.CUAAgentWorkflow``).

- ``episode``: ``play_episode``, one episode (create, play, evaluate, terminate) -> ``EpisodeOutcome`` or
  ``Dropped``; ``play_on`` the same on an execution the caller made (a forked one);
- ``group``: ``CUAAgentWorkflow``, one GRPO group of episodes per task row -> training rows;
- ``tree``: a tree group instead (``tree.enabled``): roots forked at branch turns, continuations, segments;
- ``sections``: the typed sections it is built from (gym, agent service, model, episode limits, monitor; no
  defaults of their own: ``sections_from`` fills every field from a ``CUAConfig``), and ``workflow_kwargs``, the
  one mapping from a ``CUAConfig`` to them;
- ``seeding``: which instance of a task each episode plays (one per training group, held-out ones in eval);
- ``worker``: what a rollout worker process keeps across groups (the policy endpoint, the counts, the seeds);
  the counts go on disk through ``cua_rl.runs`` for the run's summary and health checks.
"""

from cua_rl.runs import DropCause

from .episode import Dropped, EpisodeSetup, play_episode
from .group import CUAAgentWorkflow
from .sections import AgentTarget, EpisodeLimits, GymTarget, ModelTarget, MonitorTarget, sections_from, workflow_kwargs

__all__ = ["AgentTarget", "CUAAgentWorkflow", "DropCause", "Dropped", "EpisodeLimits", "EpisodeSetup", "GymTarget",
           "ModelTarget", "MonitorTarget", "play_episode", "sections_from", "workflow_kwargs"]
