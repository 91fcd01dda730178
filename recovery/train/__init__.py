"""Training under faults: ElasticTrainer and its states, phases, replica transfer, gradient
reduction in one fixed layout, and the resumable sampler."""
