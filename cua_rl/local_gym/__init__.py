"""Embedded genv-compatible gym with real X11 desktops (``cua-gym serve``).

As an object, no HTTP: ``async with LocalGym(GymOptions(...)) as gym: ex = await gym.reset(task_id)`` (env.py).
Served in-process: ``with start_gym_server(port=0, max_executions=8) as gym: GenvClient(gym.url, gym.gym_id)``.
"""

from .env import GymError, LocalGym
from .manager import GymOptions
from .server import GymServer, create_app, start_gym_server
from .tasks import TaskDef, TaskSet, load_tasks

__all__ = ["GymError", "GymOptions", "GymServer", "LocalGym", "TaskDef", "TaskSet", "create_app", "load_tasks",
           "start_gym_server"]
