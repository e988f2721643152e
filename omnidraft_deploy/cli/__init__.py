"""The command line: ``omnidraft <verb>`` and ``omnidraft-export``. ``main`` is the composition
root (the bundle verbs and the console scripts), ``local`` the verbs without exporters or a
runtime, ``parser`` every flag, ``console`` how a verb talks to the terminal, ``serve`` /
``client`` the two ends of ``omnidraft serve`` (their messages: ``request.protocol``)."""
