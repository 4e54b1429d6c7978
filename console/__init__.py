"""The web console of a running store (``rocketstore dashboard``): what RocketMQ's
dashboard shows an operator, read as ``rocketstore status``, ``query`` and the group
commands read it.

    app.py       the Starlette application: routes, bad input answered 4xx, the live refresh
    views.py     what each page shows, read from the store (and the two writes)
    charts.py    the charts, SVG drawn by the server
    history.py   the last 15 minutes of rates, sampled from the processes' statistics
    safety.py    loopback by default, authentication, writes allowed and logged, limits
    serve.py     running it: the command's server, and the supervised ``dashboard`` process
    templates/, static/   its pages, style and the few lines of script of the refresh
"""
