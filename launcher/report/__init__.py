"""``tftctl report``: a job's timeline (the types in model.py) built from its events
(timeline.py, read by sources.py), drawn as HTML with inline SVG (svg.py, page.py) or as a
Chrome trace (trace.py)."""
