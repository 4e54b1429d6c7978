"""The ``rocketstore`` command line: ``main`` parses and dispatches, ``commands`` holds the
commands that talk to a running store, ``demo`` the main job, ``promote`` the promotion
command. The top floor: it may import every room below it, and reaches the Spark demo
through its command table (``main.LATE_COMMANDS``), never by an import.
"""
