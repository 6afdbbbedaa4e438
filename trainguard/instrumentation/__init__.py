"""The torch instrumentation hook: ``trainguard.instrument(model, optimizer)``.

See :mod:`.hook` for what it does on the training thread and what it leaves to its threads.
"""

from trainguard.instrumentation.config import Identity, InstrumentationConfig
from trainguard.instrumentation.hook import Instrumentation, instrument

__all__ = ["Identity", "Instrumentation", "InstrumentationConfig", "instrument"]
