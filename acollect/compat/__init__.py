"""Compatibility with other libraries' names: :mod:`acollect.compat.torchrl` holds TorchRL's.

Nothing here is part of acollect's own surface (``acollect.__all__``); the package re-exports
TorchRL's spellings so that code written against TorchRL keeps importing them from ``acollect``.
"""
