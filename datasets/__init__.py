"""tunecache.datasets."""
