"""The core: fragments and roles, config schema, role context, distribution specs, the graph spec."""
