"""Task folders (kernels/<task>/ and user folders on the search path): load and validate task.toml into a Task."""

from workbench.tasks.loader import (
    Found,
    add_tasks_dirs,
    discover,
    find_task,
    list_tasks,
    load_task,
    load_task_dir,
    search_path,
    tasks_root,
    user_tasks_dir,
)
from workbench.tasks.model import PEAKS, Shape, Task, TaskError

__all__ = ["PEAKS", "Found", "Shape", "Task", "TaskError", "add_tasks_dirs", "discover", "find_task", "list_tasks",
           "load_task", "load_task_dir", "search_path", "tasks_root", "user_tasks_dir"]
