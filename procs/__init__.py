"""rocketstore's processes, their clients and the ``rocketstore`` command line."""
