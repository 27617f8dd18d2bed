"""Agent backends: strategies that choose the next tool call; the runtime loop is shared by all of them."""

from workbench.agent.backends.base import Backend, Finish, ToolCall

__all__ = ["Backend", "Finish", "ToolCall"]
