"""Task folders (kernels/<task>/): load and validate task.toml into a Task."""

from workbench.tasks.loader import list_tasks, load_task, tasks_root
from workbench.tasks.model import PEAKS, Shape, Task, TaskError

__all__ = ["PEAKS", "Shape", "Task", "TaskError", "list_tasks", "load_task", "tasks_root"]
