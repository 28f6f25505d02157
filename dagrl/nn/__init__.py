"""Neural network building blocks: MLPs and CNNs, encoders for mixed observations, CUDA graphs, the
learners' optimizer."""
