"""The AReaL workflow of computer-use episodes (``config.workflow: cua_rl.workflow.CUAAgentWorkflow``).

- ``group``: ``CUAAgentWorkflow``, one GRPO group of episodes per task row -> training rows;
- ``sections``: the typed sections it is built from (gym, agent service, model, episode limits, monitor);
- ``seeding``: which instance of a task each group plays;
- ``tally``: this process's counts of episodes and policy turns, for the run's summary.
"""

from .group import CAUSES, CUAAgentWorkflow, Dropped, has_reward_variance
from .sections import AgentTarget, EpisodeLimits, GymTarget, ModelTarget, MonitorTarget

__all__ = ["CAUSES", "AgentTarget", "CUAAgentWorkflow", "Dropped", "EpisodeLimits", "GymTarget", "ModelTarget",
           "MonitorTarget", "has_reward_variance"]
