"""The Textual front end: the only package that imports textual; build the app with factory.make_app.

Importing it sets Textual's frame cap (TEXTUAL_FPS, read once when textual is first imported) to FRAMES_PER_SECOND
unless the environment already sets it. Textual draws on a grid of 1/fps steps, and after a frame that ran long it
skips to the step after next: on the live screen a key pressed during or just after a pane's frame waited 17-33 ms
for its own at the default 60. At 240 that wait is 4-8 ms. The cap costs nothing at rest: the screen's timer runs
only while something is waiting to be drawn, and the live screen batches its redraws on its own 0.15 s tick.
"""

import os

FRAMES_PER_SECOND = 240
os.environ.setdefault("TEXTUAL_FPS", str(FRAMES_PER_SECOND))
