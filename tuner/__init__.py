"""tunecache.tuner."""
