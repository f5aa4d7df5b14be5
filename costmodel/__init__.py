"""tunecache.costmodel."""
