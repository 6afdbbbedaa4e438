"""The demo: a fault-injecting training job and the one-machine detect -> alert -> remediate loop.

``trainguard.demo.train`` is the training script (run it under torchrun); ``trainguard demo``
(``make demo``) starts the whole stack around it without Docker.
"""
