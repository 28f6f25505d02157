"""Environments: dagrl's own envs, vectorisation, wrappers, episodes, observation spaces.

Importing ``dagrl.envs`` registers dagrl's own gymnasium envs (``dagrl.envs:BrightHalf-v0``)."""

from dagrl.envs import registry as registry
