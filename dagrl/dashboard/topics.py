"""The names the RL page and its feed share: the page's path and the Dask event topics."""

PAGE = "/individual-dagrl"
METRICS = "dagrl-metrics"
ACTORS = "dagrl-actors"
