"""What dagrl reads from an observation space, below the envs that make it and the networks that read
it: where an image lies in an observation (:mod:`.images`), and how one beside other values is packed
into one vector (:mod:`.mixed`)."""
