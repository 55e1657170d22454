"""acollect: asyncio-first reinforcement-learning data collection."""

__version__ = "0.1.0"
