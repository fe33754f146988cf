"""Small adapters that harnesses load through their own plug-in points (never patches), so the
commands their agents run execute in the episode's sandbox. They run in the harness's Python,
not RUN's: standard library and the harness's own package only.
"""
