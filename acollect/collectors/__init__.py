"""Collectors: async iterators of batches, one shared lifecycle."""

from acollect.collectors.base import CollectorBase as CollectorBase
from acollect.collectors.base import CollectorState as CollectorState
from acollect.collectors.collector import Collector as Collector
