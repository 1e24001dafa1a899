"""Tasks: the native task folder format, its loader and validation, and importers (docs/tasks.md)."""

from clawgym.tasks.spec import NEEDS, Session, Task, load_task, load_tasks

__all__ = ["NEEDS", "Session", "Task", "load_task", "load_tasks"]
