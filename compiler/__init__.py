"""tunecache.compiler: operators, hardware, schedules, C code generation, build and run."""
