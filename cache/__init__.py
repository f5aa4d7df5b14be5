"""tunecache.cache."""
