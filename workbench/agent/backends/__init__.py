"""Agent backends: strategies that choose the next tool call; the runtime loop is shared by all of them.

Found by name through backends.registry; base declares the Backend protocol and the context a backend runs in.
"""
