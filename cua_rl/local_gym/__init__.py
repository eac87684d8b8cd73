"""Embedded genv-compatible gym server with real X11 desktops (``cua-gym serve``).

In-process: ``with start_gym_server(port=0, max_executions=8) as gym: GenvClient(gym.url, gym.gym_id)``.
"""

from .manager import GymOptions
from .server import GymServer, create_app, start_gym_server
from .tasks import TaskDef, TaskSet, load_tasks

__all__ = ["GymOptions", "GymServer", "TaskDef", "TaskSet", "create_app", "load_tasks", "start_gym_server"]
