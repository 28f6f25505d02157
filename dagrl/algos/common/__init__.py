"""What the algorithms share: rollouts, epochs, losses, distributions, evaluation."""
