"""The ``acollect`` command line: ``acollect info``, ``acollect bench`` and more (see :mod:`acollect.cli.main`)."""
